"""Where patches come from: a foreground index per (crop, class) and a deterministic index → patch-centre map.

Class-balanced rule (default): samples come in rounds of K (one per class that has foreground in some
training crop), the class order shuffled per round; sample i takes class k = round_order[i mod K], a crop
chosen uniformly among the crops where k has foreground, and a centre at a random foreground point of k
in that crop plus a uniform jitter of ± a quarter patch. So every class — `perox`, `lyso`, `np`
included — is the target of one sample in every K, whatever its voxel count. A `uniform_fraction` of
samples instead draws a crop with probability proportional to its annotated volume (nm³) and a centre
uniformly inside it, so that background context is seen too. `sampler="uniform"` uses only that rule.

Everything is a pure function of (seed, global index): any DataLoader worker can produce any sample, runs
are reproducible regardless of the number of workers, and DDP ranks see different samples because
`EpochSampler` hands each rank its own slice of the global index stream.

The foreground index reads each label on the crop box at twice the training voxel size (cheap) and keeps
up to `MAX_POINTS` foreground voxel centres in world coordinates.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from cellseg.data.targets import CropSource
from cellseg.data.threads import read_threads
from cellseg.pool import map_bounded

log = logging.getLogger(__name__)
MAX_POINTS = 4096  # foreground points kept per (crop, class); enough variety, little memory
INDEX_COARSENING = 2  # the foreground index is read at 2x the training voxel size: cheap, still sees pores
CENTRE_JITTER = 0.25  # class-balanced centres move by up to this share of the patch extent per axis


class ForegroundIndex:
    """World coordinates (nm) of sampled foreground voxels, per crop and class.

    The points live in one (N, 3) float64 tensor with the (crop, class) runs' bounds beside it: a DataLoader
    worker receives them as shared memory, a few bytes of pickle instead of megabytes. (A spawned worker's
    payload larger than a pipe's buffer makes its start wait until the worker has imported torch, so workers
    would start one after another: 4 s for two on the 2-core CPU, 8.6 s on a loaded GPU host.)
    """

    def __init__(self, points: Sequence[Sequence[np.ndarray]]):
        """`points[crop][class]`: (n, 3) float64 world coordinates, n >= 0."""
        crops, classes = len(points), len(points[0]) if len(points) else 0
        counts = np.array([[len(p) for p in per_class] for per_class in points], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(counts.reshape(-1))])  # the (crop, class) runs back to back
        bounds = starts[np.arange(crops)[:, None] * classes + np.arange(classes + 1)]
        flat = [np.asarray(p, dtype=np.float64).reshape(-1, 3) for per_class in points for p in per_class]
        self.coords = torch.from_numpy(np.concatenate(flat) if flat else np.zeros((0, 3)))
        self.bounds = torch.from_numpy(bounds)  # (crops, classes + 1): crop c's class k is coords[b[c, k]:b[c, k + 1]]

    @property
    def num_crops(self) -> int:
        return self.bounds.shape[0]

    def of(self, crop: int, k: int) -> np.ndarray:
        """Class k's points in `crop`, (n, 3) nm; a view."""
        b = self.bounds.numpy()
        return self.coords.numpy()[b[crop, k]:b[crop, k + 1]]

    @property
    def points(self) -> tuple[tuple[np.ndarray, ...], ...]:
        """Every (crop, class) run, `points[crop][class]`."""
        return tuple(tuple(self.of(c, k) for k in range(self.bounds.shape[1] - 1)) for c in range(self.num_crops))

    def crops_with(self, k: int) -> np.ndarray:
        """Indices of crops where class k has foreground (ascending)."""
        b = self.bounds.numpy()
        return np.flatnonzero(b[:, k + 1] > b[:, k]).astype(np.int64)


def _foreground(crop: CropSource, k: int, voxel_size_nm: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Class k's foreground voxels in `crop` on the index grid: (their indices, the grid's origin and voxel size
    in nm); no indices when the crop does not annotate k."""
    plan = crop.plans[k]
    if not plan.read:
        return np.zeros((0, 3), dtype=np.int64), np.zeros(3), np.ones(3)
    # The crop box on a grid INDEX_COARSENING x coarser than training (never finer than the labels).
    vs = np.maximum(np.asarray(voxel_size_nm) * INDEX_COARSENING, crop.label_voxel_size_nm)
    start, stop = np.asarray(crop.start_nm), np.asarray(crop.stop_nm)
    shape = np.maximum(1, np.round((stop - start) / vs)).astype(int)
    origin = start + vs / 2
    grid = {"translation_nm": tuple(origin), "shape_vox": tuple(int(n) for n in shape), "voxel_size_nm": tuple(vs)}
    fg = np.logical_or.reduce([crop.image(n).read(**grid, interpolation="nearest", pad_value=0) > 0
                               for n in plan.read])
    return np.argwhere(fg), origin, vs


def build_foreground_index(crops: Sequence[CropSource], voxel_size_nm: Sequence[float], *, seed: int = 0
                           ) -> ForegroundIndex:
    """Scan every (crop, class) for foreground points (see the module docstring). The crops are read in threads;
    the subsampling draws from one generator in (crop, class) order, so the index does not depend on them."""
    rng = np.random.default_rng(seed)
    scanned = map_bounded(lambda c: [_foreground(c, k, voxel_size_nm) for k in range(len(c.plans))], crops,
                          read_threads())

    def points_of(idx: np.ndarray, origin: np.ndarray, vs: np.ndarray) -> np.ndarray:
        if len(idx) > MAX_POINTS:
            idx = idx[rng.choice(len(idx), MAX_POINTS, replace=False)]
        return origin + idx * vs  # (0, 3) where the class has no foreground (or is not annotated)

    points = tuple(tuple(points_of(*fg) for fg in per_class) for per_class in scanned)
    for k, name in enumerate(crops[0].classes if crops else ()):
        if not any(len(p[k]) for p in points):
            log.warning("class %s has no foreground in any training crop: it is only ever a negative", name)
    return ForegroundIndex(points)


@dataclass(frozen=True, kw_only=True)
class PatchSpec:
    """What one sample is: the crop, the patch centre (nm), and the slicing axis for 2D patches."""

    crop: int
    centre_nm: tuple[float, float, float]
    slice_axis: int  # 0, 1 or 2 (z, y, x); only meaningful for 2D patches
    seed: int  # per-sample seed for anything random downstream of the read


class PatchSampler:
    """Global index → `PatchSpec`, a pure function of (seed, index).

    Args:
        crops: the training crops.
        index: their foreground index.
        patch_extent_nm: patch size in world units (z, y, x), before any context enlargement.
        mode: "class_balanced" or "uniform".
        uniform_fraction: share of class-balanced samples drawn uniformly instead.
        slice_axes: 2D only: axes (0-2) a patch may be cut across.
        seed: the sample stream.
    """

    def __init__(self, crops: Sequence[CropSource], index: ForegroundIndex, *, patch_extent_nm: Sequence[float],
                 mode: str = "class_balanced", uniform_fraction: float = 0.2, slice_axes: Sequence[int] = (0,),
                 seed: int = 0):
        self.boxes = np.array([[c.start_nm, c.stop_nm] for c in crops], dtype=np.float64)  # (n, 2, 3)
        volume = np.prod(self.boxes[:, 1] - self.boxes[:, 0], axis=1)
        self.crop_p = volume / volume.sum()
        self.index = index
        self.classes = [k for k in range(len(crops[0].plans)) if len(index.crops_with(k))]
        self.extent = np.asarray(patch_extent_nm, dtype=np.float64)
        self.mode, self.uniform_fraction = mode, uniform_fraction
        self.slice_axes = tuple(slice_axes)
        self.seed = seed

    def _rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, *key])

    def __call__(self, i: int) -> PatchSpec:
        rng = self._rng(1, i)
        slice_axis = int(rng.choice(self.slice_axes))
        if self.mode == "uniform" or not self.classes or rng.random() < self.uniform_fraction:
            crop = int(rng.choice(len(self.crop_p), p=self.crop_p))
            lo, hi = self.boxes[crop]
            centre = rng.uniform(lo, hi)
        else:
            n = len(self.classes)
            order = self._rng(0, i // n).permutation(self.classes)
            k = int(order[i % n])
            crop = int(rng.choice(self.index.crops_with(k)))
            pts = self.index.of(crop, k)
            centre = pts[rng.integers(len(pts))] + rng.uniform(-CENTRE_JITTER, CENTRE_JITTER, size=3) * self.extent
        return PatchSpec(crop=crop, centre_nm=tuple(float(c) for c in centre), slice_axis=slice_axis,  # type: ignore[arg-type]
                         seed=int(rng.integers(2**31)))
