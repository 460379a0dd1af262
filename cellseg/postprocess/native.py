"""Decoding one class on any grid: the model's own (`segment_class`) or another one, typically the crop's
annotation grid (`decode_on_grid`), so that masks and ids are not nearest-upsampled afterwards.

Notation: the *source* grid S is the probability's (the model's, e.g. 8 nm), the *target* grid T the one
to decode on (e.g. a test crop's 2 nm label grid). For a target voxel x, `n(x)` is the source voxel whose
box holds x's centre (nearest neighbour) and `lin(p)(x)` the trilinear interpolation of the probability p
at x's centre from the 2×2×2 source voxels around it (taps clamped at the array border, so a target
voxel outside the source box repeats the edge; an axis on which the grids coincide is copied, not
interpolated), computed in float32 along x, then y, then z as `lo + f (hi - lo)`. Thresholds are float32,
as in `spec.float32_threshold`.

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
4. Instance classes: no object is lost. An object that has target voxels under nearest upsampling but would
   keep none of them in step 3 (all its probability barely above t, so that the interpolation stays under
   it) keeps its nearest-upsampled voxels: they join `added` before step 3 (`keep_every_object`). An object
   with a *sure* voxel (`added`, or p above t by a margin of 2^-20 on its whole 26-neighbourhood, so that
   every interpolation there exceeds t) cannot vanish; only the others are checked, by refining the target
   planes they span once.

5. Instance classes on a grid finer than the source: a piece of an id (its 26-connected target voxels) smaller
   than one source voxel's volume in target voxels (`piece_limit`: 8 from 8 to 4 nm) is dropped when the id has
   a larger piece (`drop_small_pieces`). Both eras' evaluators relabel a prediction by 26-connected components of
   equal ids, so such a piece, where the interpolated probability rises just above t beside its object, would
   count as an object of its own: a false positive with a worst-case Hausdorff entry in 2026
   (`bench/studies/native_grids/fragments.py`, docs/quality.md). Larger pieces stay: they are mostly objects the source
   decoding had merged and the finer grid separates.

Why this is the right rule:
- *With the post-ops off, a semantic class is exactly `lin(p) > t`.* `lin(p)(x)` is a convex combination
  of the 8 taps, so it exceeds t only if a tap does; every tap is n(x) or one of its 26 neighbours, so G
  is non-zero at n(x). (When nothing was removed, a semantic class skips G altogether: exact even where
  rounding lifts an interpolated value one ulp above t.)
- *On the source grid itself it is `segment_class`, voxel for voxel:* n(x) = x and lin(p) = p, so
  fg = m ∪ added, G = L on that set and 0 on the removed voxels.
- *Objects are never merged, never lost and never split into several ids:* every target voxel takes the
  single id of G at one source voxel, and G only carries ids of L, each grown into plain background only;
  objects that the source decoding separated (also touching ones) keep their own ids and the boundary
  between them stays where the source decoding put it, a source voxel wide; step 4 keeps every object, and
  step 5 drops only pieces of ids that keep a larger one.
  What the refinement changes is each object's outer surface, which now follows the interpolated
  probability with sub-voxel precision (smooth instead of a staircase), and a voxel a post-op removed
  stays removed.
- *What it cannot promise:* the target voxels of an object are those where `lin(p) > t`, so a part of an
  object thinner than about one source voxel whose probability barely exceeds t (a diagonal bridge) can
  thin out or detach (the evaluators' connected components then count two objects), exactly as when the
  evaluator itself resamples a probability linearly and thresholds it.

Memory: the source-grid decoding (`segment_class`: a few volumes of the source grid) plus, for one z-slab of
the target, its result (1 byte a voxel for a mask, 4 for ids) and the source planes it reads brought onto the
target's (y, x) grid (float32 probability, uint32 ids, bool: 9 bytes per voxel of such a plane, about 9/r
bytes per slab voxel for a z-upsampling factor r); z is interpolated one target plane at a time. A slab of
`slab_planes` planes (default: `SLAB_VOXELS` voxels, whole planes) bounds it, whatever the size of the
target grid: about 0.45 GB for ids at 2 nm from 8 nm. Step 5 holds an instance class's whole target grid
once (`finish_on_grid`: its ids, the pieces' labels and a mask, about 9 bytes a voxel plus the refinement's
planes: 4.6 GB for a 800³ crop at 2 nm). The refinement runs on the CPU (numpy); the source decoding on any
device.
"""

from __future__ import annotations

import dataclasses
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
SLAB_VOXELS = 2**26  # target voxels refined at once (up to ~7 bytes each: module docstring)


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

    def labels(self) -> np.ndarray:
        """L, the source decoding's ids (instance classes): G on the voxels of `p > t` or `added` (the removed
        ones hold 0 in G), 0 on the one-voxel growth."""
        inside = self.prob > self.threshold
        if self.added is not None:
            inside |= self.added
        return np.where(inside, self.owner, 0).astype(np.uint32)  # type: ignore[arg-type]


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


def _lerp(a: np.ndarray, m: AxisMap, axis: int) -> np.ndarray:
    """`a` interpolated along `axis` (float32: lo + frac (hi - lo), so equal taps give the tap exactly)."""
    if m.copy:
        return np.take(a, m.nearest, axis=axis)
    lo = np.take(a, m.lo, axis=axis)
    hi = np.take(a, m.hi, axis=axis)
    shape = [1, 1, 1]
    shape[axis] = -1
    np.subtract(hi, lo, out=hi)
    hi *= m.frac.reshape(shape)
    lo += hi
    return lo


def _source_planes(m: AxisMap, z0: int, z1: int) -> slice:
    """The source planes that target planes `z0:z1` read (taps and nearest voxels)."""
    return slice(int(min(m.lo[z0:z1].min(), m.nearest[z0:z1].min())),
                 int(max(m.hi[z0:z1].max(), m.nearest[z0:z1].max())) + 1)


def _in_plane(a: np.ndarray, maps: Sequence[AxisMap], *, linear: bool) -> np.ndarray:
    """Source planes brought onto the target's (y, x) grid: linearly (x, then y) or by nearest neighbour."""
    if linear:
        return _lerp(_lerp(a, maps[2], 2), maps[1], 1)
    return a.take(maps[2].nearest, axis=2).take(maps[1].nearest, axis=1)


def _linear_planes(prob: np.ndarray, maps: Sequence[AxisMap], z0: int, z1: int) -> Iterator[tuple[int, np.ndarray]]:
    """(target plane j, `lin(p)` on it) for j in `z0:z1`: interpolated along x, then y, then z (float32; the
    plane yielded is a buffer reused for the next one)."""
    mz, planes = maps[0], _source_planes(maps[0], z0, z1)
    src = _in_plane(prob[planes], maps, linear=True)
    buffer = np.empty(src.shape[1:], np.float32)
    for j in range(z0, z1):
        lo, hi, frac = int(mz.lo[j]) - planes.start, int(mz.hi[j]) - planes.start, mz.frac[j]
        if mz.copy or lo == hi or frac == 0:
            yield j, src[int(mz.nearest[j]) - planes.start if mz.copy else lo]
            continue
        np.subtract(src[hi], src[lo], out=buffer)
        buffer *= frac
        buffer += src[lo]
        yield j, buffer


def linear_probability(prob: np.ndarray, maps: Sequence[AxisMap], z0: int = 0, z1: int | None = None) -> np.ndarray:
    """`lin(p)` on planes `z0:z1` of the target grid (float32; module docstring), from the source probability."""
    z1 = maps[0].lo.size if z1 is None else z1
    out = np.empty((z1 - z0, maps[1].lo.size, maps[2].lo.size), np.float32)
    for j, plane in _linear_planes(prob, maps, z0, z1):
        out[j - z0] = plane
    return out


def refine(coarse: CoarseDecoding, maps: Sequence[AxisMap], z0: int = 0, z1: int | None = None) -> np.ndarray:
    """Planes `z0:z1` of the target grid (module docstring, step 3): uint32 ids or a bool mask.

    Plane by plane: only the slab's result and its source planes on the target's (y, x) grid are held."""
    z1 = maps[0].lo.size if z1 is None else z1
    planes = _source_planes(maps[0], z0, z1)
    added = None if coarse.added is None else _in_plane(coarse.added[planes], maps, linear=False)
    owner = None if coarse.owner is None else _in_plane(coarse.owner[planes], maps, linear=False)
    out = np.empty((z1 - z0, maps[1].lo.size, maps[2].lo.size), np.uint32 if coarse.instance else bool)
    fg = np.empty(out.shape[1:], bool)
    for j, plane in _linear_planes(coarse.prob, maps, z0, z1):
        n = int(maps[0].nearest[j]) - planes.start
        np.greater(plane, coarse.threshold, out=fg)
        if added is not None:
            fg |= added[n]
        if coarse.instance:
            np.multiply(owner[n], fg, out=out[j - z0])  # type: ignore[index]
            continue
        if owner is not None:
            fg &= owner[n]
        out[j - z0] = fg
    return out


def slab_planes(target: Grid, slab_voxels: int = SLAB_VOXELS, multiple: int = 1) -> int:
    """Target planes per slab: at most `slab_voxels` voxels, a multiple of `multiple` planes when one fits
    (e.g. the store's chunk, so slabs write whole chunks), at least one plane."""
    plane = max(1, target.shape_vox[1] * target.shape_vox[2])
    planes = max(1, slab_voxels // plane)
    return planes - planes % multiple if planes >= multiple else planes


SURE_MARGIN = 2.0**-20  # p this far above t on a whole 26-neighbourhood survives float32 interpolation


def keep_every_object(coarse: CoarseDecoding, maps: Sequence[AxisMap], *, planes: int | None = None
                      ) -> CoarseDecoding:
    """Step 4 of the module docstring: `coarse` with the voxels of objects the refinement would lose added."""
    from scipy.ndimage import find_objects, minimum_filter

    if not coarse.instance or coarse.num_objects == 0:
        return coarse
    labels = coarse.labels()
    hit = np.ix_(*(np.unique(m.nearest) for m in maps))  # source voxels some target voxel is nearest to
    sure = minimum_filter(coarse.prob, size=3, mode="nearest") > coarse.threshold + SURE_MARGIN
    if coarse.added is not None:
        sure |= coarse.added
    on_target = labels[hit]
    at_risk = np.zeros(coarse.num_objects + 1, bool)
    at_risk[on_target] = True
    at_risk[on_target[sure[hit]]] = False
    at_risk[0] = False
    if not at_risk.any():
        return coarse
    boxes = find_objects(labels)
    z_lo = min(boxes[k - 1][0].start for k in np.flatnonzero(at_risk))
    z_hi = max(boxes[k - 1][0].stop for k in np.flatnonzero(at_risk))
    rows = np.flatnonzero((maps[0].nearest >= z_lo) & (maps[0].nearest < z_hi))
    kept = np.zeros(coarse.num_objects + 1, bool)
    step = planes or max(1, SLAB_VOXELS // (maps[1].lo.size * maps[2].lo.size))
    for z0 in range(int(rows.min()), int(rows.max()) + 1, step):
        ids = refine(coarse, maps, z0, min(z0 + step, int(rows.max()) + 1))
        kept |= np.bincount(ids.ravel(), minlength=kept.size).astype(bool)
    lost = at_risk & ~kept
    if not lost.any():
        return coarse
    restore = lost[labels]
    added = restore if coarse.added is None else coarse.added | restore
    return dataclasses.replace(coarse, added=added)


def iter_decode(coarse: CoarseDecoding, source: Grid, target: Grid, *, planes: int | None = None
                ) -> Iterator[tuple[int, np.ndarray]]:
    """(first plane, slab) pairs covering the target grid in z order: steps 3-4 of the module docstring. For a
    semantic class, concatenated, they equal the one-shot `decode_on_grid` voxel for voxel (step 4 is decided
    before the first slab, and every voxel is computed by the same operations either way); for an instance
    class, after `drop_small_pieces(..., piece_limit(source, target))` of the whole (step 5 needs every slab)."""
    if coarse.prob.shape != tuple(source.shape_vox):
        raise ValueError(f"probability shape {coarse.prob.shape} differs from the source grid's {source.shape_vox}")
    maps = axis_maps(source, target)
    planes = planes or slab_planes(target)
    coarse = keep_every_object(coarse, maps, planes=planes)
    for z0 in range(0, target.shape_vox[0], planes):
        yield z0, refine(coarse, maps, z0, min(z0 + planes, target.shape_vox[0]))


def piece_limit(source: Grid, target: Grid) -> int:
    """Step 5's size limit in target voxels: one source voxel's volume (rounded down), 0 (no step 5) unless the
    target is finer than the source by at least a factor 2 in volume."""
    ratio = np.prod(np.asarray(source.voxel_size_nm) / np.asarray(target.voxel_size_nm))
    return int(ratio) if ratio >= 2 else 0


def drop_small_pieces(ids: np.ndarray, min_voxels: int) -> np.ndarray:
    """Step 5: `ids` (uint32, z, y, x) without the 26-connected pieces smaller than `min_voxels` of ids that
    have a larger piece (in place; returned). An id's largest piece always stays (ties: the first in raster
    order), so no object is lost."""
    import cc3d

    if min_voxels <= 1 or not ids.any():
        return ids
    pieces = cc3d.connected_components(ids, connectivity=26)
    sizes = np.bincount(pieces.ravel())
    owner = np.zeros(sizes.size, ids.dtype)
    owner[pieces.ravel()] = ids.ravel()
    order = np.lexsort((-sizes[1:], owner[1:])) + 1  # pieces by id, the largest of each id first
    first = np.ones(order.size, bool)
    first[1:] = owner[order[1:]] != owner[order[:-1]]
    drop = np.zeros(sizes.size, bool)
    drop[order] = ~first & (sizes[order] < min_voxels)
    if drop.any():
        ids[drop[pieces]] = 0
    return ids


def finish_on_grid(coarse: CoarseDecoding, source: Grid, target: Grid) -> np.ndarray:
    """Steps 3-5 of the module docstring in one piece: the decoded class on `target`."""
    maps = axis_maps(source, target)
    out = refine(keep_every_object(coarse, maps), maps)
    return drop_small_pieces(out, piece_limit(source, target)) if coarse.instance else out


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
    return finish_on_grid(coarse, source, target)
