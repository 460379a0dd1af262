"""Per-object symmetric Hausdorff distances, computed inside bounding boxes, equal to the official values.

For each truth id `t` both eras need `H(t) = max(h(A→B), h(B→A))` with `A = truth == t`,
`B = prediction == t` (the prediction already re-painted/re-mapped to truth ids) and
`h(A→B) = max over a ∈ A of min over b ∈ B of |a − b|`, on voxel centres scaled by the voxel size.

The official codes compute this on the whole crop (2025: KD-trees of every voxel of A and B) or in a
box padded by the distance cap (2026: `scipy.ndimage.distance_transform_edt` twice). Both give the
same numbers as either of these restricted computations, which cellseg picks per object by cost:

- *EDT* on the union of the two objects' bounding boxes: every voxel of A and of B lies inside it, and
  an EDT measures the distance to the nearest feature voxel, so a larger box changes nothing. Small boxes
  use scipy's EDT (float64: the 2026 value itself). From `EDT_PACKAGE_MIN_VOXELS` on, the transform is the
  `edt` package's (float32, several times faster there), which only *locates* the maximum: with integer
  voxel sizes the distance is the square root of an integer, recovered from the float32 value; otherwise
  the voxels of A within `EDT_CANDIDATE_REL` of its float32 maximum get their exact distance from the
  nearest voxel of B (a KD-tree of B's surface near them, as below), and when such near-ties cover much of
  the box (a shifted object) scipy's EDT or the KD path computes that direction instead;
- *KD*: only voxels of `A \\ B` can have a non-zero distance to B, and the nearest voxel of B to a point
  outside B is a *surface* voxel of B (one with a 6-neighbour outside B: stepping from an interior
  voxel towards the point along any axis where they differ gets strictly closer), so a KD-tree of B's
  surface queried with the voxels of `A \\ B` yields `h(A→B)`.

Either way the final value is recomputed from the integer offset to the nearest voxel with each era's
floating-point formula: 2026 (scipy's EDT) `sqrt(((dz·sz)² + (dy·sy)²) + (dx·sx)²)`; 2025 (pykdtree on scaled points)
`sqrt(((az·sz − bz·sz)² + ...) + ...)`. The two agree exactly for integer voxel sizes; for others
they may differ in the last bit, which is why each era keeps its own. Ties between equally near voxels
whose rounded distances differ by one ulp are the only case where a value may differ from the
official one, by that ulp (2026 then rounds to float32, which absorbs it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Formula = Literal["edt", "kd"]
# Costs that pick the path per object (measured on the 2-core CPU machine, relative to each other):
SCIPY_EDT_NS_PER_VOXEL = 60.0  # one scipy EDT (float64: the exact 2026 value itself)
EDT_NS_PER_VOXEL = 40.0  # one float32 EDT (`edt` package) and its masks
EDT_PACKAGE_MIN_VOXELS = 20_000  # below this box volume scipy's EDT is faster (the package's call costs ~0.3 ms)
KD_NS_PER_POINT = 1500.0  # tree build + query, per surface or query point
# A float32 EDT value is within a few float32 ulps (relative 1e-7) of the exact distance: every voxel whose exact
# distance could be the maximum lies within this relative margin of the float32 maximum.
EDT_CANDIDATE_REL = 1e-4
# Integer voxel sizes: a distance is the square root of an integer S (nm²), recovered from the float32 EDT value
# as round(value²) while its error stays below 0.5: the square's relative error is at most 1.2e-7 (measured on
# 2e7 voxels, voxel sizes 1-16 nm), 0.12 at S = 1e6.
EXACT_SQUARE_LIMIT = 1e6
MAX_DIRECT_ID = 50_000_000  # larger ids are renumbered before `find_objects` (it allocates one slot per id)


@dataclass(frozen=True)
class Boxes:
    """Bounding boxes (tuples of slices) of the ids present in one label volume, by id."""

    slices: dict[int, tuple[slice, ...]]

    @property
    def ids(self) -> np.ndarray:
        """The ids present, sorted."""
        return np.array(sorted(self.slices), dtype=np.int64)

    @classmethod
    def of(cls, labels: np.ndarray) -> Boxes:
        """Boxes of every non-zero id, in one pass (ids ≥ the voxel count or negative are renumbered first)."""
        from scipy.ndimage import find_objects

        if labels.size == 0:
            return cls({})
        low, high = int(labels.min()), int(labels.max())
        if low >= 0 and high <= min(labels.size, MAX_DIRECT_ID):
            found = find_objects(labels if labels.dtype.kind in "iu" else labels.astype(np.int64), max_label=high)
            return cls({i + 1: box for i, box in enumerate(found) if box is not None})
        import fastremap

        compact, mapping = fastremap.renumber(labels, in_place=False, preserve_zero=True)
        found = find_objects(compact)
        inverse = {int(new): int(old) for old, new in mapping.items() if old != 0}
        return cls({inverse[i + 1]: box for i, box in enumerate(found) if box is not None})


def _union(a: tuple[slice, ...], b: tuple[slice, ...]) -> tuple[slice, ...]:
    return tuple(slice(min(x.start, y.start), max(x.stop, y.stop)) for x, y in zip(a, b, strict=True))


def _volume(box: tuple[slice, ...]) -> int:
    return int(np.prod([s.stop - s.start for s in box], dtype=np.int64))


def box_gap_nm(a: tuple[slice, ...], b: tuple[slice, ...], voxel_size_nm: Sequence[float]) -> float:
    """A lower bound of every distance between voxels of two boxes (nm)."""
    gaps = [max(0, y.start - x.stop + 1, x.start - y.stop + 1) * v for x, y, v in zip(a, b, voxel_size_nm, strict=True)]
    return float(np.sqrt(sum(g * g for g in gaps)))


def exact_distance(offsets: np.ndarray, points: np.ndarray, voxel_size_nm: Sequence[float], formula: Formula
                   ) -> np.ndarray:
    """Distances from voxel `points` (N, 3) to `points + offsets`, with an era's float formula."""
    vs = np.asarray(voxel_size_nm, dtype=np.float64)
    total = None
    for k in range(3):
        if formula == "edt":
            d = offsets[:, k].astype(np.float64) * vs[k]
        else:
            d = (points[:, k] + offsets[:, k]) * vs[k] - points[:, k] * vs[k]
        total = d * d if total is None else total + d * d
    return np.sqrt(total)


def _surface(mask: np.ndarray) -> np.ndarray:
    """Voxels of `mask` with a 6-neighbour outside it (the array border counts as outside)."""
    padded = np.pad(mask, 1)
    inner = padded[1:-1, 1:-1, 1:-1].copy()
    for axis in range(3):
        for shift in (0, 2):
            sl = [slice(1, -1)] * 3
            sl[axis] = slice(shift, shift + mask.shape[axis])
            inner &= padded[tuple(sl)]
    return mask & ~inner


def _directed_kd(query: np.ndarray, target_surface: np.ndarray, voxel_size_nm: Sequence[float],
                 formula: Formula) -> float:
    """max over `query` points (N, 3 voxel indices) of the distance to the nearest `target_surface` point."""
    from scipy.spatial import cKDTree

    if query.shape[0] == 0:
        return 0.0
    vs = np.asarray(voxel_size_nm, dtype=np.float64)
    tree = cKDTree(target_surface * vs)
    _, nearest = tree.query(query * vs, k=1)
    offsets = target_surface[nearest] - query
    return float(exact_distance(offsets, query, voxel_size_nm, formula).max())


def _hausdorff_kd(a: np.ndarray, a_box: tuple[slice, ...], b: np.ndarray, b_box: tuple[slice, ...],
                  a_in_b: np.ndarray, b_in_a: np.ndarray, voxel_size_nm: Sequence[float], formula: Formula
                  ) -> float:
    a_origin = np.array([s.start for s in a_box])
    b_origin = np.array([s.start for s in b_box])
    a_only = np.argwhere(a & ~a_in_b) + a_origin
    b_only = np.argwhere(b & ~b_in_a) + b_origin
    fwd = _directed_kd(a_only, np.argwhere(_surface(b)) + b_origin, voxel_size_nm, formula) if a_only.size else 0.0
    bwd = _directed_kd(b_only, np.argwhere(_surface(a)) + a_origin, voxel_size_nm, formula) if b_only.size else 0.0
    return max(fwd, bwd)


def _directed_edt(source: np.ndarray, target: np.ndarray, origin: np.ndarray, voxel_size_nm: Sequence[float],
                  formula: Formula) -> float:
    """max over the voxels of `source` of the distance to the nearest voxel of `target` (both boolean masks of
    one box starting at voxel `origin`; `target` not empty): located by a float32 EDT, computed exactly (module
    docstring): from the integer square for integer voxel sizes, else from the nearest voxel of a few candidates,
    else (ties over much of the box) by scipy's EDT or the KD path."""
    import edt

    approx = edt.edt(~target, anisotropy=tuple(float(v) for v in voxel_size_nm), black_border=False, parallel=1)
    top = float(approx.max(initial=0.0, where=source))
    if top == 0.0:
        return 0.0  # every voxel of `source` lies in `target`
    near_top = source & (approx >= top * (1 - EDT_CANDIDATE_REL))
    if all(float(v).is_integer() for v in voxel_size_nm) and top * top < EXACT_SQUARE_LIMIT:
        # both eras' formulas are exact on integers: the value is sqrt(S) either way
        return float(np.sqrt(np.rint(np.square(approx[near_top].astype(np.float64))).max()))
    count = int(near_top.sum())
    if count * KD_NS_PER_POINT > source.size * SCIPY_EDT_NS_PER_VOXEL:
        if formula == "edt":
            from scipy.ndimage import distance_transform_edt

            return float(distance_transform_edt(~target, sampling=voxel_size_nm)[source].max())
        return _directed_kd(np.argwhere(source & ~target) + origin, np.argwhere(_surface(target)) + origin,
                            voxel_size_nm, formula)
    candidates = np.argwhere(near_top)
    # The nearest target voxel of every candidate lies within `top` (+ the margin) of it: only the target's
    # surface inside the candidates' box widened by that much is searched (its border counts as surface there,
    # a superset of the true surface inside it).
    reach = np.ceil(top * (1 + EDT_CANDIDATE_REL) / np.asarray(voxel_size_nm, dtype=np.float64)).astype(np.int64) + 1
    lo = np.maximum(candidates.min(axis=0) - reach, 0)
    hi = np.minimum(candidates.max(axis=0) + reach + 1, target.shape)
    near = _surface(target[tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))])
    return _directed_kd(candidates + origin, np.argwhere(near) + lo + origin, voxel_size_nm, formula)


def _hausdorff_edt(a_full: np.ndarray, b_full: np.ndarray, origin: np.ndarray, voxel_size_nm: Sequence[float],
                   formula: Formula) -> float:
    return max(_directed_edt(a_full, b_full, origin, voxel_size_nm, formula),
               _directed_edt(b_full, a_full, origin, voxel_size_nm, formula))


def _hausdorff_scipy_edt(a_full: np.ndarray, b_full: np.ndarray, voxel_size_nm: Sequence[float]) -> float:
    """Both directions by scipy's float64 EDT: the exact 2026 value, and the 2025 one for integer voxel sizes."""
    from scipy.ndimage import distance_transform_edt

    vs = np.asarray(voxel_size_nm, dtype=np.float64)
    fwd = distance_transform_edt(~b_full, sampling=vs)[a_full]
    bwd = distance_transform_edt(~a_full, sampling=vs)[b_full]
    return float(max(fwd.max(initial=0.0), bwd.max(initial=0.0)))


def _select(values: np.ndarray, ids: Sequence[int]) -> np.ndarray:
    return values == ids[0] if len(ids) == 1 else np.isin(values, ids)


def pair_hausdorff(truth: np.ndarray, pred: np.ndarray, truth_box: tuple[slice, ...], pred_box: tuple[slice, ...],
                   truth_id: int, pred_ids: Sequence[int], voxel_size_nm: Sequence[float], *, formula: Formula,
                   cap_nm: float = np.inf) -> float:
    """Symmetric Hausdorff distance (nm) between `truth == truth_id` and `pred ∈ pred_ids`, at most `cap_nm`.

    `truth_box` and `pred_box` must contain every voxel of the two objects.
    """
    if np.isfinite(cap_nm) and box_gap_nm(truth_box, pred_box, voxel_size_nm) >= cap_nm:
        return float(cap_nm)
    a = truth[truth_box] == truth_id
    b = _select(pred[pred_box], pred_ids)
    a_in_b = _select(pred[truth_box], pred_ids)
    b_in_a = truth[pred_box] == truth_id
    a_only, b_only = int((a & ~a_in_b).sum()), int((b & ~b_in_a).sum())
    if a_only == 0 and b_only == 0:
        return 0.0  # identical objects
    union = _union(truth_box, pred_box)
    volume = _volume(union)
    kd_cost = (a_only + b_only + int(a.sum()) + int(b.sum())) * KD_NS_PER_POINT
    scipy_exact = formula == "edt" or all(float(v).is_integer() for v in voxel_size_nm)
    if volume < EDT_PACKAGE_MIN_VOXELS and scipy_exact and volume * 2 * SCIPY_EDT_NS_PER_VOXEL < kd_cost:
        d = _hausdorff_scipy_edt(truth[union] == truth_id, _select(pred[union], pred_ids), voxel_size_nm)
    elif volume >= EDT_PACKAGE_MIN_VOXELS and volume * 2 * EDT_NS_PER_VOXEL < kd_cost:
        d = _hausdorff_edt(truth[union] == truth_id, _select(pred[union], pred_ids),
                           np.array([s.start for s in union]), voxel_size_nm, formula)
    else:
        d = _hausdorff_kd(a, truth_box, b, pred_box, a_in_b, b_in_a, voxel_size_nm, formula)
    return float(min(d, cap_nm))
