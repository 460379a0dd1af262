"""The torch path: the algorithm of `instances.py` and `semantic.py` on torch tensors, CPU or CUDA.

Same steps, same integers, other means (all data-parallel, no host loop over objects):
- components: a parent forest over voxel indices, hooked onto the smallest neighbouring root and
  compressed by pointer jumping, round after round (3-5 rounds on blob-like masks); each component ends
  as one tree rooted at its first voxel in raster order, so the numbering equals cc3d's;
- the capped distance: a cummax/cummin line scan along the finest axis, windowed minima along the others
  (int32, exactly the CPU passes);
- growth: iterated 3×3×3 max-pooling of float32 ids (exact below 2²⁴ ids; int32 separable maximum above).

Tensor names carry no shape suffix: every volume here is (z, y, x).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from cellseg.postprocess.params import InstanceParams, SemanticParams
from cellseg.postprocess.spec import DistanceMetric, float32_threshold, min_voxels

BIG = 2**30  # as morphology.BIG
FLOAT_EXACT_IDS = 2**24  # float32 holds every integer up to here exactly


def resolve_device(device: str | torch.device) -> torch.device:
    """"auto" → CUDA when available, else CPU.

    Raises:
        ValueError: "cuda" requested on a machine without CUDA.
    """
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested, but torch sees no CUDA device")
    return device


def _index_dtype(numel: int) -> torch.dtype:
    return torch.int32 if numel < 2**31 - 1 else torch.int64


def lookup(table: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`table[labels]` for an int32/int64 label volume, without an int64 copy of the volume."""
    return torch.index_select(table, 0, labels.reshape(-1)).view(labels.shape)


def _reduce_neighbours(out: torch.Tensor, x: torch.Tensor, dim: int, op: Callable[..., torch.Tensor]) -> None:
    """out[i] ← op(out[i], x[i-1], x[i+1]) along `dim`, in place (outside the array ignored)."""
    n = x.shape[dim]
    if n > 1:
        lo, hi = out.narrow(dim, 0, n - 1), out.narrow(dim, 1, n - 1)
        op(lo, x.narrow(dim, 1, n - 1), out=lo)
        op(hi, x.narrow(dim, 0, n - 1), out=hi)


def _cube(x: torch.Tensor, op: Callable[..., torch.Tensor]) -> torch.Tensor:
    """op over each voxel's 3×3×3 neighbourhood (separable: one axis after the other)."""
    for dim in range(3):
        src, x = x, x.clone()
        _reduce_neighbours(x, src, dim, op)
    return x


def _faces(x: torch.Tensor, op: Callable[..., torch.Tensor]) -> torch.Tensor:
    """op over each voxel and its 6 face neighbours (every axis reads the original)."""
    out = x.clone()
    for dim in range(3):
        _reduce_neighbours(out, x, dim, op)
    return out


def _compress(parent: torch.Tensor) -> torch.Tensor:
    """Pointer jumping (parent ← parent[parent]) until every entry points at its root."""
    while True:
        jumped = torch.index_select(parent, 0, parent)
        if torch.equal(jumped, parent):
            return parent
        parent = jumped


def components(mask: torch.Tensor, connectivity: int) -> tuple[torch.Tensor, int]:
    """Connected components numbered 1..n in raster order of their first voxel (as cc3d), 0 elsewhere.

    A parent forest over linear voxel indices: each voxel starts pointing at the start of its x-run.
    Each round compresses every tree to its root, takes per voxel the smallest root in its neighbourhood,
    and hooks the voxel's root onto it (`scatter_reduce` amin, only where a smaller root is adjacent).
    Parents only decrease, so no cycle forms; when nothing hooks, each component is one tree whose root is
    its first voxel in raster order, and a cumulative sum over the roots numbers them.
    """
    if connectivity not in (6, 26):
        raise ValueError(f"connectivity must be 6 or 26, got {connectivity}")
    numel, device = mask.numel(), mask.device
    itype = _index_dtype(numel + 1)
    sentinel = numel  # parent of background voxels: an extra entry that points at itself
    index = torch.arange(numel, device=device, dtype=itype).view(mask.shape)
    x_pos = torch.arange(mask.shape[2], device=device, dtype=itype).expand(mask.shape)
    last_gap = torch.where(mask, -1, x_pos).cummax(dim=2).values  # x of the last background voxel ≤ x
    parent = torch.empty(numel + 1, device=device, dtype=itype)
    parent[:numel] = torch.where(mask, index - x_pos + last_gap + 1, sentinel).view(-1)  # start of the x-run
    parent[numel] = sentinel
    reduce = _cube if connectivity == 26 else _faces
    while True:
        parent = _compress(parent)
        roots = parent[:numel].view(mask.shape)
        lowest = torch.where(mask, reduce(roots, torch.minimum), sentinel)
        hook = lowest < roots
        if not bool(hook.any()):
            break
        parent.scatter_reduce_(0, roots[hook].long(), lowest[hook], reduce="amin")
    is_root = (roots == index) & mask
    rank = torch.cumsum(is_root.view(-1), dim=0, dtype=itype)
    count = int(rank[-1]) if numel else 0
    number = torch.zeros(numel + 1, device=device, dtype=itype)  # root → component number, background → 0
    number[:numel] = rank
    return torch.index_select(number, 0, roots.reshape(-1)).view(mask.shape), count


def fill_holes(mask: torch.Tensor) -> torch.Tensor:
    """`mask` plus every 6-connected background component that does not touch the array border."""
    background, n = components(~mask, 6)
    if n == 0:
        return mask.clone()
    touches = torch.zeros(n + 1, dtype=torch.bool, device=mask.device)
    touches[0] = True
    for dim in range(3):
        for index in (0, mask.shape[dim] - 1):
            touches[background.select(dim, index).reshape(-1).long()] = True
    return mask | ~lookup(touches, background)


def remove_small(labels: torch.Tensor, n: int, min_count: int) -> tuple[torch.Tensor, int]:
    """Drop labels with fewer than `min_count` voxels; renumber the rest 1..m keeping their order."""
    counts = torch.bincount(labels.view(-1).long(), minlength=n + 1)
    keep = counts >= max(min_count, 1)
    keep[0] = False
    lut = torch.cumsum(keep, dim=0, dtype=labels.dtype) * keep
    return lookup(lut, labels), int(keep.sum())


def _line_pass(core: torch.Tensor, dim: int, weight: int, window: int, cap: int) -> torch.Tensor:
    """As `morphology._line_pass`: exact steps to the nearest non-core voxel along `dim`, squared and capped."""
    n = core.shape[dim]
    shape = [1, 1, 1]
    shape[dim] = n
    pos = torch.arange(n, device=core.device, dtype=torch.int32).view(shape).expand(core.shape)
    left = torch.where(core, -BIG, pos).cummax(dim=dim).values
    right = torch.where(core, BIG, pos).flip(dim).cummin(dim=dim).values.flip(dim)
    steps = torch.minimum(pos - left, right - pos).clamp_(max=window + 1)
    steps *= weight
    steps *= steps
    return steps.clamp_(max=cap)


def _window_pass(f: torch.Tensor, dim: int, weight: int, window: int, cap: int) -> torch.Tensor:
    """As `morphology._window_pass`: minimum of f(x + k) + (w k)² over |k| ≤ window along `dim`, capped."""
    g = f.clone()
    n = f.shape[dim]
    for k in range(1, min(window, n - 1) + 1):
        c = (weight * k) ** 2
        lo, hi = g.narrow(dim, 0, n - k), g.narrow(dim, k, n - k)
        torch.minimum(lo, f.narrow(dim, k, n - k) + c, out=lo)
        torch.minimum(hi, f.narrow(dim, 0, n - k) + c, out=hi)
    return g.clamp_(max=cap)


def capped_sq_distance(core: torch.Tensor, metric: DistanceMetric, threshold_sq: int) -> torch.Tensor:
    """As `morphology.capped_sq_distance` (int32, capped at `threshold_sq + 1`)."""
    cap = threshold_sq + 1
    windows = metric.windows(threshold_sq)
    first = metric.line_axis
    f = _line_pass(core, first, metric.weights[first], windows[first], cap)
    for dim in range(3):
        if dim != first:
            f = _window_pass(f, dim, metric.weights[dim], windows[dim], cap)
    return f


def _cube_max(ids: torch.Tensor) -> torch.Tensor:
    """Maximum over each voxel's 3×3×3 neighbourhood (max-pooling for float32, separable for integers)."""
    if ids.dtype == torch.float32:
        return F.max_pool3d(ids[None, None], kernel_size=3, stride=1, padding=1)[0, 0]
    return _cube(ids, torch.maximum)


def grow(labels: torch.Tensor, allowed: torch.Tensor, n: int) -> torch.Tensor:
    """As `morphology.grow`: synchronous 26-neighbour growth, the larger id winning ties."""
    work = labels.float() if n < FLOAT_EXACT_IDS else labels  # float32 max-pooling is the fast kernel
    open_ = allowed & (work == 0)
    while True:
        new = torch.where(open_, _cube_max(work), work)
        if torch.equal(new, work):
            return new.to(labels.dtype)
        work = new
        open_ &= work == 0


def fill_components(region: torch.Tensor, labels: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """As `morphology.fill_components`, with the growth run on every multi-id component at once."""
    comp, num_comp = components(region, 26)
    dev = region.device
    labelled = labels > 0
    id_comp = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    id_comp[labels[labelled].long()] = comp[labelled].long()  # each id lies in one component
    ids_per_comp = torch.bincount(id_comp[1:], minlength=num_comp + 1)
    comp_id = torch.zeros(num_comp + 1, dtype=torch.int64, device=dev)
    comp_id[id_comp[1:]] = torch.arange(1, n + 1, device=dev)
    empty = ids_per_comp == 0
    empty[0] = False
    new_ids = n + torch.cumsum(empty, dim=0)
    num_new = int(empty.sum())
    out_type = _index_dtype(n + num_new + 1)
    lut = torch.where(ids_per_comp == 1, comp_id, torch.where(empty, new_ids, 0)).to(out_type)
    lut[0] = 0
    out = lookup(lut, comp)
    multi = ids_per_comp >= 2
    if bool(multi.any()):
        inside = lookup(multi, comp)
        grown = grow(torch.where(inside, labels, 0), inside, n)
        out = torch.where(inside, grown.to(out_type), out)
    return out, n + num_new


def _as_tensor(array: np.ndarray | torch.Tensor, device: torch.device, name: str) -> torch.Tensor:
    if isinstance(array, np.ndarray) and any(stride < 0 for stride in array.strides):
        array = array.copy()  # torch cannot view negative strides (numpy keeps them on length-1 axes)
    t = torch.as_tensor(array).to(device)
    if t.ndim != 3 or t.dtype != torch.float32:
        raise ValueError(f"{name}: expected a (z, y, x) float32 array, got {tuple(t.shape)} {t.dtype}")
    return t


@torch.inference_mode()
def segment_instances_torch(prob: np.ndarray | torch.Tensor, boundary: np.ndarray | torch.Tensor | None = None, *,
                            voxel_size_nm: Sequence[float], params: InstanceParams,
                            device: str | torch.device = "auto") -> torch.Tensor:
    """Object ids (int32 tensor on `device`, 1..N) of one instance class: `instances.segment_instances` in torch."""
    dev = resolve_device(device)
    p = _as_tensor(prob, dev, "probability")
    fg = p > float32_threshold(params.threshold)
    del p
    if params.fill_holes:
        fg = fill_holes(fg)
    core = fg
    if boundary is not None and params.use_boundary:
        b = _as_tensor(boundary, dev, "boundary probability")
        if b.shape != fg.shape:
            raise ValueError(f"boundary shape {tuple(b.shape)} differs from the probability's {tuple(fg.shape)}")
        core = fg & ~(b > float32_threshold(params.boundary_threshold))
        del b
    metric = DistanceMetric.of(voxel_size_nm)
    threshold_sq = metric.threshold_sq(params.seed_distance_nm)
    markers = core & (capped_sq_distance(core, metric, threshold_sq) > threshold_sq) if threshold_sq > 0 else core
    seeds, n = components(markers, 26)
    del markers
    labels, n = fill_components(core, seeds, n)
    if core is not fg:
        labels, n = fill_components(fg, labels, n)
    labels, n = remove_small(labels, n, min_voxels(params.min_size_nm3, voxel_size_nm))
    return labels


@torch.inference_mode()
def segment_semantic_torch(prob: np.ndarray | torch.Tensor, *, voxel_size_nm: Sequence[float],
                           params: SemanticParams, device: str | torch.device = "auto") -> torch.Tensor:
    """The class mask (bool tensor on `device`): `semantic.segment_semantic` in torch."""
    dev = resolve_device(device)
    mask = _as_tensor(prob, dev, "probability") > float32_threshold(params.threshold)
    if params.fill_holes:
        mask = fill_holes(mask)
    smallest = min_voxels(params.min_size_nm3, voxel_size_nm)
    if smallest > 1:
        labels, n = components(mask, 26)
        keep = torch.bincount(labels.view(-1).long(), minlength=n + 1) >= smallest
        keep[0] = False
        mask = lookup(keep, labels)
    return mask


def to_numpy_ids(labels: torch.Tensor) -> np.ndarray:
    """Ids as a uint32 numpy array (the stored dtype)."""
    return labels.cpu().numpy().astype(np.uint32)
