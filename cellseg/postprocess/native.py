"""Decoding one class on any grid: the model's own (`segment_class`) or another one, typically the crop's
annotation grid (`decode_on_grid`), so that masks and ids are not nearest-upsampled afterwards.

Notation: the *source* grid S is the probability's (the model's, e.g. 8 nm), the *target* grid T the one
to decode on (e.g. a test crop's 2 nm label grid). For a target voxel x, `n(x)` is the source voxel whose
box holds x's centre (nearest neighbour) and `lin(p)(x)` the trilinear interpolation of the probability p
at x's centre from the 2×2×2 source voxels around it (taps clamped at the array border, so a target
voxel outside the source box repeats the edge; an axis on which the grids coincide is copied, not
interpolated). Thresholds are float32, as in `spec.float32_threshold`.

The rule (`decode_coarse`, then `refine` per z-slab of T):

1. On S, the class is decoded exactly as `segment_class` does: `m = p > t`, then the post-ops (hole
   filling, small-component removal; instance classes: seeds, growth, hole filling, small-object
   removal), giving L (a 0/1 mask or object ids 1..N). Two source masks record what the post-ops
   changed: `added = (L > 0) & ~m` and `removed = m & (L == 0)`.
2. L is grown by one source voxel into the background: `G(c) = L(c)` where `L(c) > 0`; for a voxel of
   neither m nor L (plain background), `G(c)` = the largest id among its 26 neighbours (0 if none); for a
   removed voxel, `G(c) = 0`.
3. On T: `fg(x) = lin(p)(x) > t  or  added(n(x))`, and the result is `G(n(x))` where fg, 0 elsewhere
   (semantic classes: `G(n(x)) > 0`).

Why this is the right rule:
- *With the post-ops off, a semantic class is exactly `lin(p) > t`.* `lin(p)(x)` is a convex combination
  of the 8 taps, so it exceeds t only if a tap does; every tap is n(x) or one of its 26 neighbours, so G
  is non-zero at n(x). (When nothing was removed, a semantic class skips G altogether: exact even where
  rounding lifts an interpolated value one ulp above t.)
- *On the source grid itself it is `segment_class`, voxel for voxel:* n(x) = x and lin(p) = p, so
  fg = m ∪ added, G = L on that set and 0 on the removed voxels.
- *Objects are never merged and never split into several ids:* every target voxel takes the single id of
  G at one source voxel, and G only carries ids of L, each grown into plain background only; objects that
  the source decoding separated (also touching ones) keep their own ids and the boundary between them
  stays where the source decoding put it, a source voxel wide. What the refinement changes is each
  object's outer surface, which now follows the interpolated probability with sub-voxel precision
  (smooth instead of a staircase), and a voxel a post-op removed stays removed.
- *What it cannot promise:* the target voxels of an object are those where `lin(p) > t`, so a part of an
  object thinner than about one source voxel whose probability barely exceeds t (a diagonal bridge, a lone
  voxel) can thin out, detach (the evaluators' connected components then count two objects) or vanish,
  exactly as when the evaluator itself resamples a probability linearly and thresholds it.

Memory: the source-grid decoding (about 25 bytes per source voxel at its peak, `segment_class`) plus about
20 bytes per target voxel of one z-slab (interpolated probability, the gathered ids, the mask): a slab of
`slab_planes` planes (default: `SLAB_VOXELS` voxels, rounded to whole planes) bounds it, whatever the
size of the target grid. The refinement runs on the CPU (numpy); the source decoding on any device.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from cellseg.classes import is_instance
from cellseg.data.arrays import GRID_ATOL_VOX, VOXEL_SIZE_RTOL
from cellseg.data.grid import Grid
from cellseg.data.resample import axis_taps
from cellseg.postprocess.instances import check_probability, segment_instances
from cellseg.postprocess.params import ClassParams, InstanceParams, SemanticParams
from cellseg.postprocess.semantic import segment_semantic
from cellseg.postprocess.spec import float32_threshold

log = logging.getLogger(__name__)
SLAB_VOXELS = 2**25  # target voxels refined at once (~20 bytes each: ~0.7 GB per class in flight)


# ------------------------------------------------------------------------------------------ the source grid


def segment_class(class_name: str, prob: np.ndarray, boundary: np.ndarray | None, *,
                  voxel_size_nm: Sequence[float], params: ClassParams, device: str = "cpu") -> np.ndarray:
    """One class of one crop on its own grid: bool mask (semantic) or uint32 ids (instance), on the CPU or a
    torch device ("cuda", "cuda:1"); both give the same arrays."""
    if isinstance(params, InstanceParams) != is_instance(class_name):
        raise ValueError(f"{class_name}: {params.kind} parameters for a class scored as "
                         f"{'instances' if is_instance(class_name) else 'semantic'}")
    if device == "cpu":
        if isinstance(params, InstanceParams):
            return segment_instances(prob, boundary, voxel_size_nm=voxel_size_nm, params=params)
        return segment_semantic(prob, voxel_size_nm=voxel_size_nm, params=params)
    import torch

    from cellseg.postprocess.gpu import segment_instances_torch, segment_semantic_torch, to_numpy_ids

    try:
        if isinstance(params, InstanceParams):
            return to_numpy_ids(segment_instances_torch(prob, boundary, voxel_size_nm=voxel_size_nm, params=params,
                                                        device=device))
        return segment_semantic_torch(prob, voxel_size_nm=voxel_size_nm, params=params, device=device).cpu().numpy()
    except torch.OutOfMemoryError:
        # Same result by construction, only slower: a crop too large for the GPU falls back to the CPU path.
        log.warning("%s: %s voxels do not fit on %s; using the CPU path", class_name, "×".join(map(str, prob.shape)),
                    device)
        torch.cuda.empty_cache()
        return segment_class(class_name, prob, boundary, voxel_size_nm=voxel_size_nm, params=params, device="cpu")


def plain_params(class_name: str) -> ClassParams:
    """The evaluators' reading of a binary prediction: `p > 0.5`, no post-ops; instance classes: the
    26-connected components of that mask (no boundary channel, no seeds, no hole filling, no size filter)."""
    if is_instance(class_name):
        return InstanceParams(threshold=0.5, use_boundary=False, seed_distance_nm=0.0, min_size_nm3=0.0,
                              fill_holes=False)
    return SemanticParams(threshold=0.5)


@dataclass(frozen=True)
class CoarseDecoding:
    """Step 1-2 of the module docstring, on the source grid (z, y, x).

    Attributes:
        prob: the probability (float32), interpolated by `refine`.
        threshold: t, as float32.
        owner: G: uint32 ids grown one voxel (instance), a bool mask (semantic), or None (semantic, nothing
            removed: every voxel may hold foreground).
        added: voxels the post-ops added (foreground on the target whatever `lin(p)`), or None if none.
        instance: ids (True) or a mask (False) are returned.
        num_objects: N, the objects of the source decoding (instance classes; 0 for semantic ones).
    """

    prob: np.ndarray
    threshold: np.float32
    owner: np.ndarray | None
    added: np.ndarray | None
    instance: bool
    num_objects: int


def _grow_once(labels: np.ndarray, into: np.ndarray) -> np.ndarray:
    """`labels`, with each voxel of `into` taking the largest label among its 26 neighbours."""
    from scipy.ndimage import maximum_filter

    neighbour = maximum_filter(labels, size=3, mode="constant", cval=0)
    return np.where(into, neighbour, labels)


def decode_coarse(class_name: str, prob: np.ndarray, boundary: np.ndarray | None = None, *,
                  voxel_size_nm: Sequence[float], params: ClassParams, device: str = "cpu") -> CoarseDecoding:
    """Decode the class on its own grid and keep what `refine` needs (module docstring, steps 1-2)."""
    check_probability(prob)
    threshold = np.float32(float32_threshold(params.threshold))
    labels = segment_class(class_name, prob, boundary, voxel_size_nm=voxel_size_nm, params=params, device=device)
    mask = prob > threshold
    decoded = labels > 0 if labels.dtype != np.bool_ else labels
    added = decoded & ~mask
    removed = mask & ~decoded
    plain = ~(mask | decoded)  # background before and after the post-ops: where objects grow one voxel
    if is_instance(class_name):
        owner: np.ndarray | None = _grow_once(labels.astype(np.uint32, copy=False), plain)
        num = int(labels.max(initial=0))
    else:
        owner = _grow_once(decoded.view(np.uint8), plain).view(bool) if removed.any() else None
        num = 0
    return CoarseDecoding(prob=prob, threshold=threshold, owner=owner, added=added if added.any() else None,
                          instance=is_instance(class_name), num_objects=num)


# ------------------------------------------------------------------------------------------ the target grid


@dataclass(frozen=True)
class AxisMap:
    """One axis from the source to the target grid: linear taps (`lo`, `hi`, weight `frac` of `hi`) and the
    nearest source voxel of every target voxel (all clamped to the source array)."""

    lo: np.ndarray  # int64 (n_target,)
    hi: np.ndarray
    frac: np.ndarray  # float32 (n_target,), in [0, 1]
    nearest: np.ndarray
    copy: bool  # the grids coincide on this axis: lo = nearest, frac = 0


def axis_maps(source: Grid, target: Grid) -> tuple[AxisMap, AxisMap, AxisMap]:
    """The (z, y, x) maps from `source` to `target` (centres of voxel 0 and voxel sizes, nm).

    An axis where the voxel sizes agree within `VOXEL_SIZE_RTOL / 10` and the offset is a whole number of
    voxels within `GRID_ATOL_VOX` is a copy, the rule `MultiscaleImage.read` uses to skip resampling.
    """
    maps = []
    for t0, s0, tv, sv, n_out, n_src in zip(target.translation_nm, source.translation_nm, target.voxel_size_nm,
                                            source.voxel_size_nm, target.shape_vox, source.shape_vox, strict=True):
        u0, step = (t0 - s0) / sv, tv / sv
        if abs(step - 1) <= VOXEL_SIZE_RTOL / 10 and abs(u0 - round(u0)) <= GRID_ATOL_VOX:
            index = np.clip(round(u0) + np.arange(n_out), 0, n_src - 1).astype(np.int64)
            maps.append(AxisMap(index, index, np.zeros(n_out, np.float32), index, True))
            continue
        linear = axis_taps(u0, step, n_out, n_src, "linear")
        nearest = axis_taps(u0, step, n_out, n_src, "nearest").index[:, 0]
        maps.append(AxisMap(linear.index[:, 0], linear.index[:, 1], linear.weight[:, 1].astype(np.float32),
                            nearest, False))
    return maps[0], maps[1], maps[2]


def _lerp(a: np.ndarray, m: AxisMap, axis: int, offset: int) -> np.ndarray:
    """`a` interpolated along `axis` (float32: lo + frac (hi - lo), so equal taps give the tap exactly)."""
    if m.copy:
        return np.take(a, m.nearest - offset, axis=axis)
    lo = np.take(a, m.lo - offset, axis=axis)
    hi = np.take(a, m.hi - offset, axis=axis)
    shape = [1, 1, 1]
    shape[axis] = -1
    np.subtract(hi, lo, out=hi)
    hi *= m.frac.reshape(shape)
    lo += hi
    return lo


def _slice_z(m: AxisMap, z0: int, z1: int) -> AxisMap:
    return AxisMap(m.lo[z0:z1], m.hi[z0:z1], m.frac[z0:z1], m.nearest[z0:z1], m.copy)


def linear_probability(prob: np.ndarray, maps: Sequence[AxisMap], z0: int = 0, z1: int | None = None) -> np.ndarray:
    """`lin(p)` on planes `z0:z1` of the target grid (float32; module docstring), from the source probability."""
    mz = _slice_z(maps[0], z0, maps[0].lo.size if z1 is None else z1)
    first = int(min(mz.lo.min(), mz.nearest.min()))
    last = int(max(mz.hi.max(), mz.nearest.max())) + 1
    out = _lerp(prob[first:last], mz, 0, first)
    out = _lerp(out, maps[1], 1, 0)
    return _lerp(out, maps[2], 2, 0)


def _nearest(a: np.ndarray, maps: Sequence[AxisMap], z0: int, z1: int) -> np.ndarray:
    return a.take(maps[0].nearest[z0:z1], axis=0).take(maps[1].nearest, axis=1).take(maps[2].nearest, axis=2)


def refine(coarse: CoarseDecoding, maps: Sequence[AxisMap], z0: int = 0, z1: int | None = None) -> np.ndarray:
    """Planes `z0:z1` of the target grid (module docstring, step 3): uint32 ids or a bool mask."""
    z1 = maps[0].lo.size if z1 is None else z1
    fg = linear_probability(coarse.prob, maps, z0, z1) > coarse.threshold
    if coarse.added is not None:
        fg |= _nearest(coarse.added, maps, z0, z1)
    if coarse.instance:
        ids = _nearest(coarse.owner, maps, z0, z1)  # type: ignore[arg-type]
        ids *= fg
        return ids
    if coarse.owner is not None:
        fg &= _nearest(coarse.owner, maps, z0, z1)
    return fg


def slab_planes(target: Grid, slab_voxels: int = SLAB_VOXELS, multiple: int = 1) -> int:
    """Target planes per slab: at most `slab_voxels` voxels, a multiple of `multiple` planes when one fits
    (e.g. the store's chunk, so slabs write whole chunks), at least one plane."""
    plane = max(1, target.shape_vox[1] * target.shape_vox[2])
    planes = max(1, slab_voxels // plane)
    return planes - planes % multiple if planes >= multiple else planes


def iter_decode(coarse: CoarseDecoding, source: Grid, target: Grid, *, planes: int | None = None
                ) -> Iterator[tuple[int, np.ndarray]]:
    """(first plane, slab) pairs covering the target grid in z order; concatenated, they equal the one-shot
    `refine` voxel for voxel (every voxel is computed by the same operations either way)."""
    if coarse.prob.shape != tuple(source.shape_vox):
        raise ValueError(f"probability shape {coarse.prob.shape} differs from the source grid's {source.shape_vox}")
    maps = axis_maps(source, target)
    planes = planes or slab_planes(target)
    for z0 in range(0, target.shape_vox[0], planes):
        yield z0, refine(coarse, maps, z0, min(z0 + planes, target.shape_vox[0]))


def decode_on_grid(class_name: str, prob: np.ndarray, boundary: np.ndarray | None = None, *, source: Grid,
                   target: Grid, params: ClassParams, device: str = "cpu") -> np.ndarray:
    """The class decoded on `target` in one piece (module docstring): uint32 ids or a bool mask of
    `target.shape_vox`; `prob` (and `boundary`) are float32 arrays on `source`. Equals `segment_class` when
    the grids coincide.

    Example:
        >>> mask = decode_on_grid("er", prob_8nm, source=model_grid, target=label_grid,
        ...                       params=SemanticParams(threshold=0.4))  # doctest: +SKIP
    """
    coarse = decode_coarse(class_name, prob, boundary, voxel_size_nm=source.voxel_size_nm, params=params,
                           device=device)
    return refine(coarse, axis_maps(source, target))
