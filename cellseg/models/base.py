"""The contract every cellseg segmentation network honours.

A model maps an image batch ``(B, C, *spatial)`` to raw logits ``(B, K, *spatial)`` at the same
spatial size: no sigmoid, no softmax. Spatial axes are ``(z, y, x)`` for 3D models and ``(y, x)``
for 2D models. Each spatial size must be a positive multiple of the model's per-axis
``input_divisor``; anything else raises a ``ValueError`` that names the valid shapes.

Shape legend: ``B`` batch, ``C`` input channels, ``K`` output channels (classes), ``S`` the spatial
axes (``ZYX`` in 3D, ``YX`` in 2D).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

AXES_BY_DIMS = {2: "yx", 3: "zyx"}


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What a built model promises to the trainer, the predictor and the run's ``meta.json``.

    Attributes:
        name: registry name, e.g. ``"unet_3d"``.
        preset: the parameter preset it was built from (``"default"`` or ``"tiny"``).
        spatial_dims: 2 (input ``(B, C, Y, X)``) or 3 (input ``(B, C, Z, Y, X)``).
        axes: the spatial axis names, ``"zyx"`` or ``"yx"``.
        in_channels: image channels ``C``.
        out_channels: logit channels ``K``.
        input_divisor: per spatial axis, the number each input size must be a multiple of.
        tta_axes: axes that may be flipped at test time (the network has no preferred direction).
        tta_transpose_axes: axes that may be swapped with each other at test time (empty: none).
        default_patch_vox: the training/inference patch the architecture is designed for, in voxels.
        default_voxel_size_nm: the voxel size that patch is meant to be sampled at, in nm.
        params: the resolved architecture parameters (the params dataclass as a dict).
    """

    name: str
    preset: str
    spatial_dims: int
    axes: str
    in_channels: int
    out_channels: int
    input_divisor: tuple[int, ...]
    tta_axes: tuple[str, ...]
    tta_transpose_axes: tuple[str, ...]
    default_patch_vox: tuple[int, ...]
    default_voxel_size_nm: tuple[float, ...]
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists), e.g. for ``run_dir/meta.json``."""
        return json_ready(dataclasses.asdict(self))


def json_ready(value: Any) -> Any:
    """Recursively turn tuples into lists so that ``json.dumps`` and YAML dumps stay plain."""
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(item) for item in value]
    return value


def per_axis(value: int | Sequence[int], spatial_dims: int) -> tuple[int, ...]:
    """Expand an int to one value per spatial axis, or check a sequence has one per axis.

    Example:
        >>> per_axis(2, 3)
        (2, 2, 2)
    """
    if isinstance(value, int):
        return (value,) * spatial_dims
    values = tuple(int(item) for item in value)
    if len(values) != spatial_dims:
        raise ValueError(f"expected an int or {spatial_dims} values (one per axis), got {list(values)}")
    return values


def resolve_strides(
    strides: Sequence[int | Sequence[int]] | None, *, num_steps: int, spatial_dims: int
) -> tuple[tuple[int, ...], ...]:
    """Per down-sampling step, the per-axis stride; ``None`` means 2 on every axis at every step."""
    if strides is None:
        return ((2,) * spatial_dims,) * num_steps
    if len(strides) != num_steps:
        raise ValueError(
            f"strides needs {num_steps} entries (one per down-sampling step), got {list(strides)}"
        )
    return tuple(per_axis(stride, spatial_dims) for stride in strides)


def cumulative_divisor(strides: Sequence[Sequence[int]], spatial_dims: int) -> tuple[int, ...]:
    """The per-axis product of a network's down-sampling strides: its input divisor."""
    divisor = [1] * spatial_dims
    for stride in strides:
        divisor = [total * step for total, step in zip(divisor, stride, strict=True)]
    return tuple(divisor)


class SegModel(nn.Module, abc.ABC):
    """Base class of every registered architecture: validates the input, then runs the network.

    Subclasses implement :meth:`forward_logits`. :func:`cellseg.models.build_model` attaches a
    :class:`ModelSpec` as ``model.spec``; models built directly (without the registry) have
    ``spec = None`` but still validate their input.

    Deep supervision: a subclass may return a list of logits (full resolution first, then
    coarser) from a *training-mode* forward. In eval mode every model returns one tensor
    ``(B, K, *S)``.

    Args:
        spatial_dims: 2 or 3.
        in_channels: image channels the network was built for.
        out_channels: logit channels.
        input_divisor: per-axis divisor each input size must be a positive multiple of.
    """

    def __init__(
        self, *, spatial_dims: int, in_channels: int, out_channels: int, input_divisor: Sequence[int]
    ) -> None:
        super().__init__()
        if spatial_dims not in AXES_BY_DIMS:
            raise ValueError(f"spatial_dims must be 2 or 3, got {spatial_dims}")
        self.spatial_dims = spatial_dims
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.input_divisor = per_axis(input_divisor, spatial_dims)
        self.spec: ModelSpec | None = None

    @property
    def axes(self) -> str:
        """Spatial axis names: ``"zyx"`` or ``"yx"``."""
        return AXES_BY_DIMS[self.spatial_dims]

    @property
    def tta_axes(self) -> tuple[str, ...]:
        """Axes that may be flipped at test time: every spatial axis (convs and attention are
        direction-agnostic; training augmentation decides whether the weights are too)."""
        return tuple(self.axes)

    @property
    def tta_transpose_axes(self) -> tuple[str, ...]:
        """Axes that may be swapped: ``y`` and ``x`` when they share a divisor. ``z`` is never
        swapped, since FIB-SEM z spacing may differ from the in-plane one."""
        divisor_y, divisor_x = self.input_divisor[-2:]
        return ("y", "x") if divisor_y == divisor_x else ()

    def forward(self, image_BCS: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """Validate ``image_BCS`` and return raw logits ``(B, K, *S)`` (see class docstring)."""
        self.validate_input(image_BCS)
        return self.forward_logits(image_BCS)

    @abc.abstractmethod
    def forward_logits(self, image_BCS: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """The network itself; implemented by each architecture."""

    def example_shape(self, *, batch_size: int = 2) -> tuple[int, ...]:
        """A valid input shape: the spec's default patch, or the divisor when no spec is attached."""
        patch = self.spec.default_patch_vox if self.spec is not None else self.input_divisor
        return (batch_size, self.in_channels, *patch)

    def validate_input(self, image_BCS: torch.Tensor) -> None:
        """Raise ``ValueError`` naming the valid shapes if ``image_BCS`` cannot be segmented.

        Only shapes are inspected (never values), so this costs nothing under graph compilation.
        """
        shape = tuple(image_BCS.shape)
        problems = self._shape_problems(shape)
        if problems:
            raise ValueError(self._shape_message(shape, problems))

    def _shape_problems(self, shape: tuple[int, ...]) -> list[str]:
        if len(shape) != 2 + self.spatial_dims:
            return [f"it has {len(shape)} dims, not {2 + self.spatial_dims}"]
        problems = []
        if shape[1] != self.in_channels:
            problems.append(f"C={shape[1]} but the model has {self.in_channels} input channel(s)")
        for axis, size, divisor in zip(self.axes, shape[2:], self.input_divisor, strict=True):
            if size <= 0 or size % divisor:
                problems.append(f"{axis.upper()}={size} is not a positive multiple of {divisor}")
        return problems

    def _shape_message(self, shape: tuple[int, ...], problems: list[str]) -> str:
        name = self.spec.name if self.spec is not None else type(self).__name__
        axes = ", ".join(self.axes.upper())
        return (
            f"{name} expects input (B, {self.in_channels}, {axes}) with {axes} positive multiples of "
            f"{self.input_divisor} (e.g. {self.example_shape()}); got {shape}: {'; '.join(problems)}"
        )
