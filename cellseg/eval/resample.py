"""Bringing a submitted array into the truth grid, exactly as each era's evaluator does.

Both eras (2025 `match_crop_space`, 2026 `MatchedCrop.load_aligned`):
1. read the voxel size from `voxel_size | resolution | scale` and the offset from `translation | offset`;
2. if the voxel size differs, `skimage.transform.rescale` by `source / target`: order 0 for instance
   labels; order 1 with `preserve_range` then `> 0.5` for semantic labels (skimage anti-aliases with a
   Gaussian of σ = (factor − 1)/2 first whenever any axis is down-sampled, except for integer or bool
   input at order 0);
3. snap the offset to the target grid, `floor(t_in / vs) · vs`, then take
   `floor(|snapped − t_truth| / vs) · sign(...)` voxels of shift (quirk 3 of docs/scoring.md);
4. crop or zero-pad to the target shape.

Where they differ (each reproduced in its era):
- "different voxel size": 2025 compares exactly, 2026 with `np.allclose`;
- bool semantic arrays that need resampling: 2025 crashes (skimage refuses bool at order 1), 2026
  casts to float32 first; cellseg casts and records that the 2025 evaluator would have failed;
- no attributes at all: both centre-crop/pad; only a translation: 2025 places the array by it, 2026
  centre-crops/pads first and then shifts;
- a prediction smaller than the crop that starts inside it: 2025 copies `min(crop, pred) − offset`
  voxels, dropping the prediction's last `offset` voxels (quirk 11); 2026 copies all of it;
- 2026 refuses sources with more than 16³ times the target's voxels, and re-samples sources over 500 MB
  (as float32) in blocks of 297³ voxels, each block anti-aliased on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cellseg.eval.rules import (
    CHUNK_TARGET_BYTES_2026,
    CHUNKED_LOAD_BYTES_2026,
    MAX_VOLUME_SIZE_RATIO_2026,
    SEMANTIC_THRESHOLD,
)

VOXEL_SIZE_KEYS = ("voxel_size", "resolution", "scale")
TRANSLATION_KEYS = ("translation", "offset")


@dataclass(frozen=True, kw_only=True)
class Target:
    """The truth grid of one (crop, label): voxel size (nm), translation (nm), shape (voxels), z, y, x."""

    voxel_size_nm: tuple[float, ...]
    translation_nm: tuple[float, ...]
    shape_vox: tuple[int, ...]


@dataclass(kw_only=True)
class Aligned:
    """A prediction in the truth grid, plus what happened on the way.

    Attributes:
        data: the array in the truth grid (bool for resampled semantic labels, else the input dtype).
        notes: plain-language remarks (resampled, shifted, truncated by the 2025 copy bug, ...).
        official_failure: why this era's official evaluator would have crashed here (None if it would not).
    """

    data: np.ndarray
    notes: list[str] = field(default_factory=list)
    official_failure: str | None = None


class BadAttributes(ValueError):
    """Voxel size or translation attributes that no era can use."""


def _first(attrs: dict[str, Any], keys: Sequence[str]) -> Any:
    for key in keys:
        if key in attrs:
            return attrs[key]
    return None


def parse_vector(value: Any, name: str) -> tuple[tuple[float, ...] | None, bool]:
    """(floats, strictly numeric) for an attribute value; None when absent.

    2026 converts with `float()`, which also accepts numeric strings; 2025 uses the raw values, so
    anything but numbers makes it fail ("strictly numeric" is False then).

    Raises:
        BadAttributes: the value is not a list of numbers (or numeric strings).
    """
    if value is None:
        return None, True
    if not isinstance(value, list | tuple) or not value:
        raise BadAttributes(f"attribute {name} = {value!r} is not a list of numbers")
    try:
        floats = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise BadAttributes(f"attribute {name} = {value!r} is not a list of numbers") from None
    if not all(np.isfinite(floats)):
        raise BadAttributes(f"attribute {name} = {value!r} is not finite")
    strict = all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    return floats, strict


def read_geometry(attrs: dict[str, Any], ndim: int) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None, bool]:
    """(voxel size, translation, 2025-compatible) from array attributes, checked against `ndim` axes.

    Raises:
        BadAttributes: unusable values (too few axes, not numbers, voxel size ≤ 0).
    """
    vs, strict_vs = parse_vector(_first(attrs, VOXEL_SIZE_KEYS), "voxel_size")
    tr, strict_tr = parse_vector(_first(attrs, TRANSLATION_KEYS), "translation")
    for name, vec in (("voxel_size", vs), ("translation", tr)):
        if vec is not None and len(vec) < ndim:
            raise BadAttributes(f"attribute {name} has {len(vec)} values for a {ndim}-D array")
    if vs is not None and min(vs[-ndim:]) <= 0:
        raise BadAttributes(f"voxel size {vs} is not positive")
    exact_length = all(v is None or len(v) == ndim for v in (vs, tr))
    return vs, tr, strict_vs and strict_tr and exact_length


def centre_crop_pad(image: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Pad (zeros, centred) then crop (centred) to `shape`, as both eras do without attributes."""
    pad = [((t - s) // 2, t - s - (t - s) // 2) if s < t else (0, 0) for s, t in zip(image.shape, shape, strict=True)]
    if any(p for pair in pad for p in pair):
        image = np.pad(image, pad, mode="constant", constant_values=0)
    crop = tuple(slice((s - t) // 2, (s - t) // 2 + t) if s > t else slice(None)
                 for s, t in zip(image.shape, shape, strict=True))
    return image[crop]


def voxel_offset(translation_nm: Sequence[float], target: Target) -> np.ndarray:
    """Shift in target voxels of a prediction whose voxel 0 sits at `translation_nm` (quirk 3)."""
    tvs = np.asarray(target.voxel_size_nm, dtype=float)
    ttr = np.asarray(target.translation_nm, dtype=float)
    snapped = (np.asarray(translation_nm, dtype=float) // tvs) * tvs
    return ((np.abs(snapped - ttr) // tvs) * np.sign(snapped - ttr)).astype(int)


def place(image: np.ndarray, shape: Sequence[int], offset: Sequence[int], *, copy_length_bug: bool
          ) -> tuple[np.ndarray, int]:
    """Shift by `offset` voxels, then crop/zero-pad to `shape` (returns the array and voxels dropped by quirk 11).

    A positive offset means the prediction starts inside the crop; with `copy_length_bug` (2025) such a
    prediction, smaller than the crop, loses its last `offset` voxels.
    """
    if not any(offset) and tuple(image.shape) == tuple(shape):
        return image, 0
    result = np.zeros(tuple(shape), dtype=image.dtype)
    src, dst, dropped = [], [], 0
    for size, n_in, off in zip(shape, image.shape, offset, strict=True):
        if off < 0:
            start = -off
            stop = min(start + size, n_in)
            length = stop - start
            src.append(slice(start, stop))
            dst.append(slice(0, length))
        else:
            end = min(size, n_in) if copy_length_bug else min(size, n_in + off)
            length = end - off
            dropped = max(dropped, min(size, n_in + off) - off - length)  # 0 without the bug
            src.append(slice(0, length))
            dst.append(slice(off, end))
        if length <= 0:
            return result, 0
    result[tuple(dst)] = image[tuple(src)]
    return result, dropped


def rescale_like_official(image: np.ndarray, scale: np.ndarray, *, instance: bool, keep_id_range: bool
                          ) -> np.ndarray:
    """`skimage.transform.rescale` with the official arguments (bool semantic input cast to float32).

    Instance ids are resampled at order 0; `keep_id_range` (2026) keeps their range and dtype, without it
    (2025) skimage converts them to floats as it pleases.
    """
    from skimage.transform import rescale

    if instance:
        if not keep_id_range:
            return rescale(image, scale, order=0, mode="constant")
        return rescale(image, scale, order=0, mode="constant", preserve_range=True).astype(image.dtype)
    if image.dtype == bool:
        image = image.astype(np.float32)
    return rescale(image, scale, order=1, mode="constant", preserve_range=True) > SEMANTIC_THRESHOLD


def chunk_edge_2026() -> int:
    """Edge (voxels) of the blocks of the 2026 chunked down-sampling (297)."""
    return max(32, int(int(CHUNK_TARGET_BYTES_2026 / 4) ** (1 / 3)))


def chunked_rescale_2026(array: Any, scale: np.ndarray, *, instance: bool) -> np.ndarray:
    """The 2026 evaluator's block-wise re-sampling of large sources (each block rescaled on its own)."""
    out_shape = tuple(max(1, int(np.round(s * f))) for s, f in zip(array.shape, scale, strict=True))
    out = np.zeros(out_shape, dtype=array.dtype if instance else np.float32)
    edge = chunk_edge_2026()
    starts = [range(0, n, edge) for n in array.shape]
    for z0 in starts[0]:
        for y0 in starts[1]:
            for x0 in starts[2]:
                lo = (z0, y0, x0)
                block = np.asarray(array[tuple(slice(a, min(a + edge, n)) for a, n in zip(lo, array.shape, strict=True))])
                if instance:
                    small = rescale_like_official(block, scale, instance=True, keep_id_range=True)
                else:
                    from skimage.transform import rescale

                    block = block.astype(np.float32) if block.dtype == bool else block
                    small = rescale(block, scale, order=1, mode="constant", preserve_range=True)
                o0 = [int(a * f) for a, f in zip(lo, scale, strict=True)]
                size = [min(o + s, n) - o for o, s, n in zip(o0, small.shape, out_shape, strict=True)]
                out[tuple(slice(o, o + s) for o, s in zip(o0, size, strict=True))] = \
                    small[tuple(slice(0, s) for s in size)]
    return out if instance else out > SEMANTIC_THRESHOLD


def size_ratio(source_shape: Sequence[int], target: Target) -> float:
    """Source voxels per target voxel (the 2026 loader refuses more than 16³)."""
    return float(np.prod(source_shape, dtype=np.float64) / np.prod(target.shape_vox, dtype=np.float64))


def uses_chunked_2026(source_shape: Sequence[int], voxel_size_nm: tuple[float, ...] | None, target: Target) -> bool:
    """True when the 2026 loader takes its block-wise re-sampling path for this source."""
    if voxel_size_nm is None:
        return False
    big = np.prod(source_shape, dtype=np.float64) * 4 > CHUNKED_LOAD_BYTES_2026
    return bool(big and not np.allclose(voxel_size_nm[-len(target.shape_vox):], target.voxel_size_nm))


def _align_2025(image: np.ndarray, attrs: dict[str, Any], *, instance: bool, target: Target,
                out: Aligned) -> np.ndarray:
    if not any(k in attrs for k in (*VOXEL_SIZE_KEYS, *TRANSLATION_KEYS)):
        if image.shape != target.shape_vox:
            out.notes.append(f"no voxel_size/translation attributes: centre-cropped/padded {image.shape} to the crop")
        return centre_crop_pad(image, target.shape_vox)
    vs, tr, strict = read_geometry(attrs, image.ndim)
    if not strict:
        out.official_failure = "attributes are not plain lists of 3 numbers"
    if vs is not None and any(a != b for a, b in zip(vs[-3:], target.voxel_size_nm, strict=True)):
        image = _rescale(image, np.divide(vs[-3:], target.voxel_size_nm), instance=instance, bool_fails=True,
                         keep_id_range=False, out=out)
    offset = voxel_offset(tr[-3:], target) if tr is not None else np.zeros(3, dtype=int)
    placed, dropped = place(image, target.shape_vox, offset, copy_length_bug=True)
    if dropped:
        out.notes.append(f"2025 copy-length bug: the last {dropped} voxel(s) of the prediction along an axis were "
                         "dropped (it is smaller than the crop and starts inside it)")
    return placed


def _rescale(image: np.ndarray, scale: np.ndarray, *, instance: bool, bool_fails: bool, keep_id_range: bool,
             out: Aligned) -> np.ndarray:
    if bool_fails and not instance and image.dtype == bool:
        out.official_failure = ("bool semantic array needs resampling: skimage refuses bool at order 1 (cellseg "
                                "casts to float32 as the 2026 evaluator does)")
    if not instance and image.dtype.kind == "f" and np.isnan(image).any():
        out.notes.append("NaN voxels spread through the linear resampling and count as background")
    out.notes.append(f"resampled by {tuple(round(float(s), 4) for s in scale)} "
                     f"({'nearest' if instance else 'linear, then > 0.5'})")
    return rescale_like_official(image, scale, instance=instance, keep_id_range=keep_id_range)


def _align_2026(array: Any, attrs: dict[str, Any], *, instance: bool, target: Target, out: Aligned
                ) -> np.ndarray:
    vs, tr, _ = read_geometry(attrs, len(array.shape))
    ratio = size_ratio(array.shape, target)
    if ratio > MAX_VOLUME_SIZE_RATIO_2026:
        out.official_failure = (f"source has {ratio:.0f}× the crop's voxels; the 2026 loader refuses more than "
                                f"{MAX_VOLUME_SIZE_RATIO_2026:.0f}×")
    tvs = np.asarray(target.voxel_size_nm, dtype=float)
    if uses_chunked_2026(array.shape, vs, target):
        scale = np.asarray(vs[-3:], dtype=float) / tvs
        out.notes.append(f"large source: resampled block-wise by {tuple(round(float(s), 4) for s in scale)} "
                         "like the 2026 loader")
        image = chunked_rescale_2026(array, scale, instance=instance)
    else:
        image = np.asarray(array[...])
        if vs is not None and not np.allclose(np.asarray(vs[-3:], dtype=float), tvs):
            image = _rescale(image, np.asarray(vs[-3:], dtype=float) / tvs, instance=instance, bool_fails=False,
                             keep_id_range=True, out=out)
        elif vs is None and image.shape != target.shape_vox:
            out.notes.append(f"no voxel_size attribute: centre-cropped/padded {image.shape} to the crop")
            image = centre_crop_pad(image, target.shape_vox)
    offset = voxel_offset(tr[-3:], target) if tr is not None else np.zeros(3, dtype=int)
    return place(image, target.shape_vox, offset, copy_length_bug=False)[0]


def _check_3d(array: Any) -> None:
    if len(array.shape) != 3:
        raise BadAttributes(f"array has shape {tuple(array.shape)}; expected 3 axes (z, y, x)")


def _checked(out: Aligned, target: Target) -> Aligned:
    if tuple(out.data.shape) != tuple(target.shape_vox):  # cannot happen; guards the scorers' assumptions
        raise AssertionError(f"aligned shape {out.data.shape} != {target.shape_vox}")
    return out


def align_2025(array: Any, attrs: dict[str, Any], *, instance: bool, target: Target) -> Aligned:
    """Bring a submitted array onto the truth grid as the 2025 evaluator does (`match_crop_space`).

    Raises:
        BadAttributes: unusable voxel size / translation attributes, or an array that is not 3-D.
    """
    _check_3d(array)
    out = Aligned(data=np.zeros(0))
    out.data = _align_2025(np.asarray(array[...]), attrs, instance=instance, target=target, out=out)
    return _checked(out, target)


def align_2026(array: Any, attrs: dict[str, Any], *, instance: bool, target: Target) -> Aligned:
    """Bring a submitted array (numpy or zarr, read lazily) onto the truth grid as the 2026 evaluator does
    (`MatchedCrop.load_aligned`).

    Raises:
        BadAttributes: unusable voxel size / translation attributes, or an array that is not 3-D.
    """
    _check_3d(array)
    out = Aligned(data=np.zeros(0))
    out.data = _align_2026(array, attrs, instance=instance, target=target, out=out)
    return _checked(out, target)
