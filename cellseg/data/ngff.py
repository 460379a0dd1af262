"""OME-NGFF 0.4 `multiscales` metadata: parse it into levels with voxel size and translation in nm, build it.

A CellMap multiscale group (EM or one label class of a crop) has `.zattrs` like::

    {"multiscales": [{"version": "0.4", "name": "mito",
      "axes": [{"name": "z", "type": "space", "unit": "nanometer"}, ...y, x],
      "datasets": [{"path": "s0", "coordinateTransformations": [
                        {"type": "scale", "scale": [8.0, 8.0, 8.0]},
                        {"type": "translation", "translation": [4.0, 4.0, 4.0]}]}, ...]}]}

The translation is the physical centre of voxel (0, 0, 0) of that level (`crops.py` explains why), so a
2× down-sampled level shifts by half a coarse voxel minus half a fine voxel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

AXES = ("z", "y", "x")
# Length units OME-NGFF allows that we convert; factor to nanometres.
_UNIT_TO_NM = {"nanometer": 1.0, "nm": 1.0, "micrometer": 1e3, "um": 1e3, "angstrom": 0.1, "picometer": 1e-3}

Vec3 = tuple[float, float, float]


@dataclass(frozen=True, kw_only=True)
class LevelMeta:
    """One level of a multiscale group as declared in its metadata (z, y, x; nm)."""

    path: str
    voxel_size_nm: Vec3
    translation_nm: Vec3


def _axis_names_and_scale(axes: Sequence[Any], source: str) -> tuple[list[str], list[float]]:
    names, factors = [], []
    for axis in axes:
        if isinstance(axis, str):  # OME-NGFF 0.3 wrote bare axis names
            names.append(axis)
            factors.append(1.0)
            continue
        names.append(axis.get("name"))
        unit = axis.get("unit", "nanometer")
        if axis.get("type", "space") == "space":
            if unit not in _UNIT_TO_NM:
                raise ValueError(f"{source}: axis {axis.get('name')!r} has unit {unit!r}; expected nanometer")
            factors.append(_UNIT_TO_NM[unit])
        else:
            factors.append(1.0)
    if names != list(AXES):
        raise ValueError(f"{source}: multiscales axes are {names}; cellseg reads 3D volumes with axes ['z', 'y', 'x']")
    return names, factors


def _transform(transforms: Sequence[Mapping[str, Any]], source: str) -> tuple[list[float], list[float]]:
    """Compose a `coordinateTransformations` list (scale, then optional translation)."""
    scale, translation = [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]
    for t in transforms:
        kind = t.get("type")
        if kind == "scale":
            values = t.get("scale")
            if not isinstance(values, Sequence) or len(values) != 3:
                raise ValueError(f"{source}: scale {values!r} must have 3 values (z, y, x)")
            scale = [s * float(v) for s, v in zip(scale, values, strict=True)]
            translation = [tr * float(v) for tr, v in zip(translation, values, strict=True)]
        elif kind == "translation":
            values = t.get("translation")
            if not isinstance(values, Sequence) or len(values) != 3:
                raise ValueError(f"{source}: translation {values!r} must have 3 values (z, y, x)")
            translation = [tr + float(v) for tr, v in zip(translation, values, strict=True)]
        else:
            raise ValueError(f"{source}: unsupported coordinate transformation {kind!r} (expected scale/translation)")
    return scale, translation


def parse_multiscales(attrs: Mapping[str, Any] | None, *, source: str) -> list[LevelMeta]:
    """Levels declared by an OME-NGFF 0.4 `multiscales` attribute, finest first.

    Args:
        attrs: the group's `.zattrs`.
        source: the group's path or URL, quoted in error messages.

    Raises:
        ValueError: no `multiscales`, axes other than (z, y, x), a non-length unit, malformed
            transformations or non-positive voxel sizes.
    """
    if not attrs or "multiscales" not in attrs or not attrs["multiscales"]:
        raise ValueError(f"{source}: no OME-NGFF 'multiscales' in its .zattrs (is this a multiscale group?)")
    ms = attrs["multiscales"][0]
    _, unit_factor = _axis_names_and_scale(ms.get("axes", [{"name": a} for a in AXES]), source)
    outer_scale, outer_translation = _transform(ms.get("coordinateTransformations", []), source)
    levels = []
    for ds in ms.get("datasets", []):
        if "path" not in ds:
            raise ValueError(f"{source}: a multiscales dataset has no 'path'")
        scale, translation = _transform(ds.get("coordinateTransformations", []), f"{source}/{ds['path']}")
        # A multiscale-wide transformation applies after the per-level one (OME-NGFF 0.4).
        scale = [s * o for s, o in zip(scale, outer_scale, strict=True)]
        translation = [t * o + ot for t, o, ot in zip(translation, outer_scale, outer_translation, strict=True)]
        voxel = tuple(s * f for s, f in zip(scale, unit_factor, strict=True))
        if min(voxel) <= 0:
            raise ValueError(f"{source}/{ds['path']}: voxel size {voxel} must be positive")
        levels.append(LevelMeta(
            path=str(ds["path"]),
            voxel_size_nm=voxel,  # type: ignore[arg-type]
            translation_nm=tuple(t * f for t, f in zip(translation, unit_factor, strict=True)),  # type: ignore[arg-type]
        ))
    if not levels:
        raise ValueError(f"{source}: 'multiscales' lists no datasets")
    return sorted(levels, key=lambda lv: lv.voxel_size_nm[0] * lv.voxel_size_nm[1] * lv.voxel_size_nm[2])


def build_multiscales(levels: Sequence[LevelMeta], *, name: str) -> dict[str, Any]:
    """The `.zattrs` content (OME-NGFF 0.4) for a group with these levels."""
    return {
        "multiscales": [{
            "version": "0.4",
            "name": name,
            "axes": [{"name": a, "type": "space", "unit": "nanometer"} for a in AXES],
            "datasets": [
                {"path": lv.path, "coordinateTransformations": [
                    {"type": "scale", "scale": [float(v) for v in lv.voxel_size_nm]},
                    {"type": "translation", "translation": [float(v) for v in lv.translation_nm]},
                ]}
                for lv in levels
            ],
        }]
    }


def pyramid_levels(voxel_size_nm: Sequence[float], translation_nm: Sequence[float], num_levels: int,
                   *, factors: Sequence[Sequence[int]] | None = None) -> list[LevelMeta]:
    """Metadata of a 2× pyramid `s0..s{n-1}` in the voxel-centre convention.

    Args:
        voxel_size_nm, translation_nm: level `s0`.
        num_levels: how many levels.
        factors: per-level (z, y, x) down-sampling factor relative to the previous level; default 2 on
            every axis.
    """
    vs, tr = [float(v) for v in voxel_size_nm], [float(t) for t in translation_nm]
    levels = [LevelMeta(path="s0", voxel_size_nm=tuple(vs), translation_nm=tuple(tr))]  # type: ignore[arg-type]
    for i in range(1, num_levels):
        f = factors[i - 1] if factors is not None else (2, 2, 2)
        new_vs = [v * k for v, k in zip(vs, f, strict=True)]
        tr = [t + (nv - v) / 2 for t, v, nv in zip(tr, vs, new_vs, strict=True)]
        vs = new_vs
        levels.append(LevelMeta(path=f"s{i}", voxel_size_nm=tuple(vs), translation_nm=tuple(tr)))  # type: ignore[arg-type]
    return levels
