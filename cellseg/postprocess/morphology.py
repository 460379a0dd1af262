"""CPU building blocks of the post-processing (numpy, cc3d, scipy), each the exact counterpart of a torch
function in `gpu.py`. Arrays are (z, y, x); label volumes are int32 with 0 for background.
"""

from __future__ import annotations

import numpy as np

from cellseg.postprocess.spec import DistanceMetric

BIG = 2**30  # "no non-core voxel on this side of the line": far beyond any window, still int32-safe


def components(mask: np.ndarray, connectivity: int) -> tuple[np.ndarray, int]:
    """Connected components of a boolean mask, numbered 1..n in raster order of their first voxel (int32)."""
    import cc3d

    labels, n = cc3d.connected_components(np.ascontiguousarray(mask), connectivity=connectivity, return_N=True)
    if n >= 2**31:
        raise ValueError(f"{n} components do not fit int32 labels")
    return labels.astype(np.int32, copy=False), int(n)


def fill_holes(mask: np.ndarray) -> np.ndarray:
    """`mask` plus every 6-connected background component that does not touch the array border."""
    background, n = components(~mask, 6)
    if n == 0:
        return mask.copy()
    touches = np.zeros(n + 1, dtype=bool)
    touches[0] = True
    for axis in range(3):
        for index in (0, -1):
            touches[np.take(background, index, axis=axis)] = True
    return mask | ~touches[background]


def remove_small(labels: np.ndarray, n: int, min_count: int) -> tuple[np.ndarray, int]:
    """Drop labels with fewer than `min_count` voxels; renumber the rest 1..m keeping their order."""
    counts = np.bincount(labels.ravel(), minlength=n + 1)
    keep = counts >= max(min_count, 1)
    keep[0] = False
    lut = np.zeros(n + 1, dtype=np.int32)
    m = int(keep.sum())
    lut[keep] = np.arange(1, m + 1, dtype=np.int32)
    return lut[labels], m


def _line_pass(core: np.ndarray, axis: int, weight: int, window: int, cap: int) -> np.ndarray:
    """`min((w · d)², cap)` with d the step count to the nearest non-core voxel along `axis` (exact)."""
    n = core.shape[axis]
    shape = [1, 1, 1]
    shape[axis] = n
    pos = np.arange(n, dtype=np.int32).reshape(shape)  # int32 is enough: |values| < BIG + n < 2**31
    left = np.maximum.accumulate(np.where(core, -BIG, pos), axis=axis)
    right = np.flip(np.minimum.accumulate(np.flip(np.where(core, BIG, pos), axis=axis), axis=axis), axis=axis)
    steps = np.minimum(pos - left, right - pos)
    np.minimum(steps, window + 1, out=steps)  # beyond the window the exact value no longer matters
    steps *= weight
    steps *= steps
    np.minimum(steps, cap, out=steps)
    return steps


def _window_pass(f: np.ndarray, axis: int, weight: int, window: int, cap: int) -> np.ndarray:
    """`g(x) = min(cap, min over |k| ≤ window of f(x + k e_axis) + (w k)²)`, out-of-array terms ignored."""
    g = f.copy()
    n = f.shape[axis]
    tmp = np.empty_like(f)
    for k in range(1, min(window, n - 1) + 1):
        c = np.int32((weight * k) ** 2)
        lo = [slice(None)] * 3
        hi = [slice(None)] * 3
        lo[axis], hi[axis] = slice(0, n - k), slice(k, n)
        lo, hi = tuple(lo), tuple(hi)
        t = tmp[lo]
        np.add(f[hi], c, out=t)
        np.minimum(g[lo], t, out=g[lo])
        np.add(f[lo], c, out=t)
        np.minimum(g[hi], t, out=g[hi])
    np.minimum(g, cap, out=g)
    return g


def capped_sq_distance(core: np.ndarray, metric: DistanceMetric, threshold_sq: int) -> np.ndarray:
    """Exact squared distance (metric units) from each voxel to the nearest non-core voxel, capped at
    `threshold_sq + 1`; voxels outside the array count as core. int32."""
    cap = threshold_sq + 1
    windows = metric.windows(threshold_sq)
    first = metric.line_axis
    f = _line_pass(core, first, metric.weights[first], windows[first], cap)
    for axis in range(3):
        if axis != first:
            f = _window_pass(f, axis, metric.weights[axis], windows[axis], cap)
    return f


def _cube_max(a: np.ndarray) -> np.ndarray:
    """Maximum over each voxel's 3×3×3 neighbourhood (separable; outside the array ignored)."""
    out = a
    for axis in range(3):
        src, out = out, out.copy()
        n = src.shape[axis]
        if n < 2:
            continue
        lo = [slice(None)] * 3
        hi = [slice(None)] * 3
        lo[axis], hi[axis] = slice(0, n - 1), slice(1, n)
        np.maximum(out[tuple(lo)], src[tuple(hi)], out=out[tuple(lo)])
        np.maximum(out[tuple(hi)], src[tuple(lo)], out=out[tuple(hi)])
    return out


def grow(labels: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Synchronous seeded growth: repeatedly, every unlabelled allowed voxel with a labelled 26-neighbour
    takes the largest neighbouring label, until nothing changes. Each voxel so ends with the largest of
    the labels nearest to it in 26-neighbour steps through `allowed`."""
    labels = labels.copy()
    while True:
        neighbour = _cube_max(labels)
        update = allowed & (labels == 0) & (neighbour > 0)
        if not update.any():
            return labels
        labels[update] = neighbour[update]


def fill_components(region: np.ndarray, labels: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """Label every voxel of `region` from the labelled voxels inside it (ids 1..n, all present).

    Per 26-connected component of `region`: with one id, the whole component takes it; with several,
    `grow` decides (run in the component's bounding box only); with none, the component gets a new id
    n+1, n+2, ... in raster order of its first voxel. Returns the labels and the new id count.
    """
    from scipy.ndimage import find_objects

    comp, num_comp = components(region, 26)
    labelled = labels > 0
    id_comp = np.zeros(n + 1, dtype=np.int64)
    id_comp[labels[labelled]] = comp[labelled]  # each id lies in one component: duplicates agree
    ids_per_comp = np.bincount(id_comp[1:], minlength=num_comp + 1)
    comp_id = np.zeros(num_comp + 1, dtype=np.int64)
    comp_id[id_comp[1:]] = np.arange(1, n + 1)
    empty = ids_per_comp == 0
    empty[0] = False
    lut = np.zeros(num_comp + 1, dtype=np.int32)
    single = ids_per_comp == 1
    lut[single] = comp_id[single]
    num_new = int(empty.sum())
    lut[empty] = np.arange(n + 1, n + 1 + num_new, dtype=np.int32)
    out = lut[comp]
    multi = np.flatnonzero(ids_per_comp >= 2)
    if multi.size:
        boxes = find_objects(comp)
        for c in multi:
            box = boxes[c - 1]
            inside = comp[box] == c
            out[box][inside] = grow(np.where(inside, labels[box], 0), inside)[inside]
    return out, n + num_new
