"""Architectures chosen by name, with typed parameters and presets.

Each architecture module registers a small builder::

    @register_model("unet_3d", params=UNet3DParams, spatial_dims=3,
                    default_patch_vox=(128, 128, 128), tiny=TINY, tiny_patch_vox=(16, 16, 16))
    def unet_3d(in_channels: int, out_channels: int, params: UNet3DParams) -> UNet: ...

and callers build it with plain keyword parameters, exactly the ``params:`` mapping of
``configs/model/<name>.yaml``::

    model = build_model("unet_3d", 1, 8)                    # the strong default
    model = build_model("unet_3d", 1, 8, preset="tiny")     # small and fast, for tests/smoke runs
    model = build_model("unet_3d", 1, 8, norm="instance")   # any params field, checked by name

A preset is a named set of parameter values *plus* the patch it is meant for; keyword
parameters override the preset's values. The built model carries a :class:`ModelSpec` as
``model.spec``.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cellseg.config.load import convert_value
from cellseg.models.base import AXES_BY_DIMS, ModelSpec, SegModel

DEFAULT_VOXEL_SIZE_NM = 8.0

Builder = Callable[[int, int, Any], SegModel]


@dataclass(frozen=True, kw_only=True)
class Preset:
    """Parameter values and the patch (voxels per axis) they are meant for."""

    params: Mapping[str, Any]
    patch_shape_vox: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class ModelEntry:
    """One registered architecture: its builder, params dataclass, geometry and presets."""

    name: str
    builder: Builder
    params_type: type
    spatial_dims: int
    default_voxel_size_nm: tuple[float, ...]
    presets: Mapping[str, Preset]
    summary: str

    def param_names(self) -> list[str]:
        """The keyword parameters ``build_model`` accepts for this architecture."""
        return [item.name for item in dataclasses.fields(self.params_type)]


_REGISTRY: dict[str, ModelEntry] = {}


def register_model(
    name: str,
    *,
    params: type,
    spatial_dims: int,
    default_patch_vox: Sequence[int],
    tiny: Mapping[str, Any],
    tiny_patch_vox: Sequence[int],
    default_voxel_size_nm: float = DEFAULT_VOXEL_SIZE_NM,
) -> Callable[[Builder], Builder]:
    """Decorator: register ``builder(in_channels, out_channels, params)`` under ``name``.

    Args:
        name: ``<family>_<2d|3d>``; must be new.
        params: a frozen kw_only dataclass whose defaults are the architecture's strong default.
        spatial_dims: 2 or 3.
        default_patch_vox: the patch the default preset is designed for.
        tiny: parameter overrides of the ``tiny`` preset (small widths for CPU tests).
        tiny_patch_vox: the patch the ``tiny`` preset is meant for.
        default_voxel_size_nm: isotropic voxel size the patches are meant to be sampled at.
    """
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} is already registered")
    if not dataclasses.is_dataclass(params):
        raise TypeError(f"params for {name!r} must be a dataclass type, got {params!r}")

    def decorate(builder: Builder) -> Builder:
        _REGISTRY[name] = ModelEntry(
            name=name,
            builder=builder,
            params_type=params,
            spatial_dims=spatial_dims,
            default_voxel_size_nm=(float(default_voxel_size_nm),) * spatial_dims,
            presets={
                "default": Preset(params={}, patch_shape_vox=tuple(default_patch_vox)),
                "tiny": Preset(params=dict(tiny), patch_shape_vox=tuple(tiny_patch_vox)),
            },
            summary=(builder.__doc__ or "").strip().splitlines()[0] if builder.__doc__ else "",
        )
        return builder

    return decorate


def list_models() -> list[str]:
    """Every registered architecture name, sorted (family first, then 2d before 3d)."""
    return sorted(_REGISTRY)


def get_entry(name: str) -> ModelEntry:
    """The registry entry of ``name``; ``ValueError`` lists the valid names otherwise."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(list_models())}")
    return _REGISTRY[name]


def resolve_params(name: str, *, preset: str = "default", **params: Any) -> Any:
    """The params dataclass of ``name`` for ``preset`` with ``params`` overriding its values.

    Each value is checked against the field's annotation and converted as the config loader does (lists, as
    YAML gives them, become tuples so that params stay hashable and comparable; ``1e-4``, a string to YAML 1.1,
    becomes a float). Unknown keys and wrong types raise ``ValueError`` naming the parameter; value checks
    live in each params dataclass's ``__post_init__``.
    """
    entry = get_entry(name)
    chosen = _get_preset(entry, preset)
    valid = entry.param_names()
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for model {name!r}; valid: {', '.join(valid)}")
    values = {**chosen.params, **params}
    hints = typing.get_type_hints(entry.params_type)
    return entry.params_type(**{key: convert_value(value, hints[key], f"model.params.{key}")
                                for key, value in values.items()})


def build_model(
    name: str, in_channels: int, out_channels: int, *, preset: str = "default", **params: Any
) -> SegModel:
    """Build a registered architecture; the result's ``spec`` describes its contract.

    Args:
        name: one of :func:`list_models`.
        in_channels: image channels ``C``.
        out_channels: logit channels ``K`` (one per predicted class).
        preset: ``"default"`` (the strong design) or ``"tiny"`` (tests, smoke runs).
        **params: fields of the architecture's params dataclass; they override the preset.

    Example:
        >>> model = build_model("unet_3d", 1, 4, preset="tiny")
        >>> model.spec.input_divisor
        (4, 4, 4)
    """
    entry = get_entry(name)
    resolved = resolve_params(name, preset=preset, **params)
    model = entry.builder(in_channels, out_channels, resolved)
    assert model.spatial_dims == entry.spatial_dims, f"{name} builder returned a {model.spatial_dims}D model"
    model.spec = ModelSpec(
        name=name,
        preset=preset,
        spatial_dims=entry.spatial_dims,
        axes=AXES_BY_DIMS[entry.spatial_dims],
        in_channels=in_channels,
        out_channels=out_channels,
        input_divisor=model.input_divisor,
        tta_axes=model.tta_axes,
        tta_transpose_axes=model.tta_transpose_axes,
        default_patch_vox=entry.presets[preset].patch_shape_vox,
        default_voxel_size_nm=entry.default_voxel_size_nm,
        params=dataclasses.asdict(resolved),
    )
    return model


def preset_patch_vox(name: str, preset: str = "default") -> tuple[int, ...]:
    """The patch (voxels per axis) that ``preset`` of ``name`` is designed for."""
    return _get_preset(get_entry(name), preset).patch_shape_vox


def _get_preset(entry: ModelEntry, preset: str) -> Preset:
    if preset not in entry.presets:
        raise ValueError(f"unknown preset {preset!r} for {entry.name}; valid: {', '.join(entry.presets)}")
    return entry.presets[preset]
