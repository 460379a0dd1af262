"""Which EM voxels are padding (no data: outside the imaged volume, or its black border), not dark tissue.

Aligned FIB-SEM volumes carry black padding where the imaged region ends: at the volume's faces, in wedges left by
the alignment. Training must not learn from it (the labels there say nothing about the EM), but real data is also
black *inside* cells: saturated membranes, lipid droplets, myelin (an SBEM volume had 1.8 % of its voxels at 0,
inside mitochondria and myelin). Masking every voxel at the padding value throws that data away.

Three rules (`data.padding_mask`, per dataset `data.padding_mask_by_dataset`):
- "edge" (default): a voxel is padding when its EM equals the padding value and it is 6-connected, through such
  voxels, to the volume's edge. What one patch can decide, with a cheap per-crop precomputation:
  1. *seeds* are the voxels of the read outside the EM volume (read as the padding value), and the padding-valued
     voxels inside the crop's edge region (`EdgeRegion`): per crop, the EM over the crop's box enlarged by the
     farthest a sample reads is read once at a coarse level (at most `EDGE_MAX_VOXELS` voxels); its padding-valued
     voxels connected to a face of that box (or lying outside the volume) form the region, grown by one coarse
     voxel so that it reaches the fine voxels at its rim;
  2. padding is every 6-connected component of padding-valued voxels *of the patch* that holds a seed.
  So a black blob inside a cell stays data; a black border or wedge is masked, even where it enters the patch
  from a side that lies inside the volume. Undecidable from there, and taken as padding: a padding-valued region
  that crosses a face of the examined box may continue to the volume's edge outside it. Two black regions that
  meet only outside the patch are judged apart (the coarse region decides for the large ones).
- "value": every voxel at the padding value (the rule before "edge").
- "off": nothing is masked.

`padding_mask` is the one rule: the dataset calls it per patch (`PatchDataset`), a loader that holds a crop's EM in
memory calls it once on the whole volume, with seeds from the same `EdgeRegion`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from cellseg.data.arrays import MultiscaleImage
from cellseg.data.grid import Grid

PaddingMode = Literal["edge", "value", "off"]
PADDING_MODES: tuple[str, ...] = get_args(PaddingMode)
EDGE_MAX_VOXELS = 128**3  # coarse read of one crop's edge region: 2 MiB of uint8, a ~50 ms connected-component pass


def padding_mask(em: np.ndarray, *, pad_value: int, mode: PaddingMode, seeds: np.ndarray | None = None
                 ) -> np.ndarray:
    """The padding voxels of an EM read (z, y, x; bool), by the rule `mode` (module docstring).

    Args:
        em: the EM as read, with `pad_value` outside the volume.
        pad_value: the EM value of "no data" (`data.em_pad_value`).
        mode: "edge", "value" or "off".
        seeds: "edge" only: voxels known to be connected to the volume's edge (outside the volume, inside the
            crop's `EdgeRegion`: see `edge_seeds`); padding is the padding-valued components of `em` (6-connected)
            that hold one. None: no seeds, so nothing is padding.

    Raises:
        ValueError: an unknown mode.
    """
    if mode == "off":
        return np.zeros(em.shape, dtype=bool)
    black = em == pad_value
    if mode == "value":
        return black
    if mode != "edge":
        raise ValueError(f"unknown padding mode {mode!r}; choose one of {list(PADDING_MODES)}")
    if seeds is None or not black.any():
        return np.zeros(em.shape, dtype=bool)
    seeded = black & seeds
    if not seeded.any():
        return seeded
    if not (black & ~seeds).any():  # every padding-valued voxel is a seed: nothing to connect
        return black
    import cc3d

    labels = cc3d.connected_components(black, connectivity=6)
    keep = np.zeros(int(labels.max()) + 1, dtype=bool)
    keep[np.unique(labels[seeded])] = True
    keep[0] = False
    return keep[labels]


@dataclass(frozen=True)
class EdgeRegion:
    """One crop's padding-valued region connected to the edge of the box around it, at a coarse level.

    Example:
        >>> region = EdgeRegion.compute(em, start_nm, stop_nm, pad_value=0)
        >>> seeds = edge_seeds(grid, inside=inside, region=region)
    """

    grid: Grid | None  # the coarse grid of `mask` (its bounding box); None: the region is empty
    mask: np.ndarray | None  # (z, y, x) bool on `grid`

    @classmethod
    def compute(cls, em: MultiscaleImage, start_nm: Sequence[float], stop_nm: Sequence[float], *, pad_value: int,
                max_voxels: int = EDGE_MAX_VOXELS) -> EdgeRegion:
        """Read the EM over the box `[start_nm, stop_nm)` (z, y, x) at the finest level with at most `max_voxels`
        voxels there, and keep its padding-valued voxels connected to the box's faces (module docstring)."""
        import cc3d
        from scipy.ndimage import binary_dilation

        grid = _coarse_grid(em, start_nm, stop_nm, max_voxels)
        data, inside = em.read(**grid.read_kwargs(), interpolation="area", pad_value=pad_value, dtype=np.uint8,
                               return_mask=True)
        black = (data == pad_value) | ~inside
        labels = cc3d.connected_components(black, connectivity=6)
        faces = np.concatenate([labels[0].ravel(), labels[-1].ravel(), labels[:, 0].ravel(), labels[:, -1].ravel(),
                                labels[:, :, 0].ravel(), labels[:, :, -1].ravel()])
        keep = np.zeros(int(labels.max()) + 1, dtype=bool)
        keep[np.unique(faces)] = True
        keep[0] = False
        mask = binary_dilation(keep[labels])  # one coarse voxel: the rim blocks are only partly padding
        return cls(*_bounding_box(grid, mask))

    def sample(self, grid: Grid) -> np.ndarray:
        """The region on `grid` (z, y, x; bool): each voxel takes the coarse voxel its centre lies in."""
        if self.grid is None or self.mask is None:
            return np.zeros(grid.shape_vox, dtype=bool)
        index = []
        for t, n, v, ct, cn, cv in zip(grid.translation_nm, grid.shape_vox, grid.voxel_size_nm,
                                       self.grid.translation_nm, self.grid.shape_vox, self.grid.voxel_size_nm,
                                       strict=True):
            i = np.floor((t + v * np.arange(n) - ct) / cv + 0.5).astype(np.int64)
            index.append(np.where((i >= 0) & (i < cn), i, -1))
        z, y, x = index
        out = self.mask[np.ix_(np.maximum(z, 0), np.maximum(y, 0), np.maximum(x, 0))]
        out &= (z >= 0)[:, None, None] & (y >= 0)[None, :, None] & (x >= 0)[None, None, :]
        return out


def edge_seeds(grid: Grid, *, inside: np.ndarray | None, region: EdgeRegion | None) -> np.ndarray:
    """Seeds of the "edge" rule on a read's grid: voxels outside the volume (`~inside`) or in the crop's region."""
    seeds = np.zeros(grid.shape_vox, dtype=bool) if region is None else region.sample(grid)
    if inside is not None:
        seeds |= ~inside
    return seeds


def padding_mode(dataset: str, *, default: PaddingMode, by_dataset: Mapping[str, PaddingMode]) -> PaddingMode:
    """The rule for a dataset: its override in `by_dataset` (`data.padding_mask_by_dataset`), else `default`."""
    return by_dataset.get(dataset, default)


def _coarse_grid(em: MultiscaleImage, start_nm: Sequence[float], stop_nm: Sequence[float], max_voxels: int
                 ) -> Grid:
    """The box on the lattice of the finest EM level that covers it in at most `max_voxels` (else the coarsest)."""
    grids = [_box_grid(level.translation_nm, level.voxel_size_nm, start_nm, stop_nm) for level in em.levels]
    return next((g for g in grids if np.prod(g.shape_vox) <= max_voxels), grids[-1])


def _box_grid(translation_nm: Sequence[float], voxel_size_nm: Sequence[float], start_nm: Sequence[float],
              stop_nm: Sequence[float]) -> Grid:
    """The voxels of a lattice (centre of voxel 0, voxel size) that hold a point of the box `[start, stop)`."""
    t, vs = np.asarray(translation_nm, dtype=np.float64), np.asarray(voxel_size_nm, dtype=np.float64)
    lo = np.floor((np.asarray(start_nm) - t) / vs + 0.5).astype(np.int64)
    hi = np.ceil((np.asarray(stop_nm) - t) / vs + 0.5).astype(np.int64)  # one past the last voxel
    return Grid.of(translation_nm=t + lo * vs, shape_vox=np.maximum(hi - lo, 1), voxel_size_nm=vs)


def _bounding_box(grid: Grid, mask: np.ndarray) -> tuple[Grid | None, np.ndarray | None]:
    """`mask` cut to its bounding box, with its grid; (None, None) when it is empty (little to keep per crop)."""
    if not mask.any():
        return None, None
    box = [np.flatnonzero(mask.any(axis=tuple(a for a in range(3) if a != d))) for d in range(3)]
    lo = np.array([b[0] for b in box])
    sub = mask[tuple(slice(b[0], b[-1] + 1) for b in box)]
    origin = np.asarray(grid.translation_nm) + lo * np.asarray(grid.voxel_size_nm)
    return Grid.of(translation_nm=origin, shape_vox=sub.shape, voxel_size_nm=grid.voxel_size_nm), sub.copy()
