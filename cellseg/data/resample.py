"""Separable resampling between axis-aligned voxel grids (z, y, x).

Grids are given per axis by the centre of their first voxel and their voxel size (nm). An output voxel
`j` sits at `x_j = out_start + j * out_vs`; in source-voxel units that is `u_j = (x_j - src_start) / src_vs`.
Each axis becomes a small table of source indices and weights ("taps"), and the volume is resampled one
axis at a time by gathering those taps; no per-voxel Python and no dense interpolation matrices.

- `nearest`: the source voxel containing `u_j` (labels; never averages ids into fractions).
- `linear`: two-tap linear interpolation (EM, up-sampling or small shifts).
- `area`: the average of the source voxels the output voxel overlaps, weighted by overlap (EM,
  down-sampling; avoids aliasing). Falls back to `linear` where the output voxel is not larger.

An output voxel is *inside* when its centre lies within the source array's extent `[-0.5, n - 0.5]`;
taps are clamped to the array, so values near the border repeat the edge rather than mixing in padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Interpolation = Literal["nearest", "linear", "area"]
INTERPOLATIONS = ("nearest", "linear", "area")


@dataclass(frozen=True)
class AxisTaps:
    """Source indices `index[j, k]` and weights `weight[j, k]` for each output voxel j of one axis."""

    index: np.ndarray  # (n_out, n_taps) int64
    weight: np.ndarray  # (n_out, n_taps) float64, rows sum to 1
    inside: np.ndarray  # (n_out,) bool


def axis_taps(
    u0: float, step: float, n_out: int, n_src: int, interpolation: Interpolation
) -> AxisTaps:
    """Taps for one axis.

    Args:
        u0: position of output voxel 0 in source-voxel units.
        step: output voxel size / source voxel size.
        n_out: number of output voxels.
        n_src: number of source voxels on this axis.
        interpolation: "nearest", "linear" or "area".
    """
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation {interpolation!r} is not one of {INTERPOLATIONS}")
    u = u0 + step * np.arange(n_out, dtype=np.float64)
    inside = (u >= -0.5) & (u <= n_src - 0.5)
    if interpolation == "nearest":
        index = np.clip(np.floor(u + 0.5), 0, n_src - 1).astype(np.int64)[:, None]
        return AxisTaps(index, np.ones_like(index, dtype=np.float64), inside)
    if interpolation == "area" and step > 1.0:
        return _area_taps(u, step, n_src, inside)
    lo = np.floor(u)
    frac = u - lo
    index = np.clip(np.stack([lo, lo + 1], axis=1), 0, n_src - 1).astype(np.int64)
    weight = np.stack([1.0 - frac, frac], axis=1)
    return AxisTaps(index, weight, inside)


def _area_taps(u: np.ndarray, step: float, n_src: int, inside: np.ndarray) -> AxisTaps:
    # Output voxel j covers [u_j - step/2, u_j + step/2]; source voxel k covers [k - 0.5, k + 0.5].
    lo, hi = u - step / 2, u + step / 2
    n_taps = int(np.ceil(step)) + 1
    first = np.floor(lo + 0.5)
    index = first[:, None] + np.arange(n_taps)[None, :]
    overlap = np.minimum(hi[:, None], index + 0.5) - np.maximum(lo[:, None], index - 0.5)
    weight = np.clip(overlap, 0.0, None)
    weight[(index < 0) | (index >= n_src)] = 0.0  # outside the array: renormalise over what is inside
    total = weight.sum(axis=1, keepdims=True)
    weight = np.divide(weight, total, out=np.zeros_like(weight), where=total > 0)
    return AxisTaps(np.clip(index, 0, n_src - 1).astype(np.int64), weight, inside)


def apply_taps(volume: np.ndarray, taps: list[AxisTaps], *, offsets: tuple[int, ...]) -> np.ndarray:
    """Resample `volume` axis by axis.

    Args:
        volume: the source sub-volume that was read.
        taps: one `AxisTaps` per axis, in whole-array source indices.
        offsets: the whole-array index of `volume[0, 0, 0]` per axis.

    Returns:
        The resampled array: in the volume's dtype when every axis is single-tap (nearest); otherwise float32
        for a float16/float32 volume (probabilities: half the memory traffic of float64, within float32 rounding
        of it) and float64 for any other (EM and other integer data, rounded once at the end by the caller).
    """
    out = volume
    single = volume.dtype.kind == "f" and volume.dtype.itemsize <= 4
    for axis, (t, off) in enumerate(zip(taps, offsets, strict=True)):
        local = t.index - off
        if t.index.shape[1] == 1:
            index = local[:, 0]
            if index.size and index[0] == 0 and index.size == out.shape[axis] and (np.diff(index) == 1).all():
                continue  # the identity (an on-grid read of exactly the region): no copy
            out = np.take(out, index, axis=axis)
            continue
        acc = None
        shape = [1] * out.ndim
        shape[axis] = -1
        weight = t.weight.astype(np.float32) if single else t.weight
        for k in range(local.shape[1]):
            term = np.take(out, local[:, k], axis=axis) * weight[:, k].reshape(shape)
            acc = term if acc is None else acc + term
        out = acc
    return out


def inside_mask(taps: list[AxisTaps]) -> np.ndarray:
    """Boolean (z, y, x) mask of output voxels whose centre lies inside the source array."""
    z, y, x = (t.inside for t in taps)
    return z[:, None, None] & y[None, :, None] & x[None, None, :]
