"""Small convolutional building blocks shared by the architectures, built from MONAI layers.

Norm choice (``norm``): ``"batch"`` is the default everywhere. BatchNorm has native
channels-last kernels in cuDNN and fuses well under graph compilation, while eager
``InstanceNorm3d`` has no channels-last support and loses to layout conversions. Measured on
``unet_3d`` (batch 8 × 128³, compiled, one H200; docs/benchmarks.md, the MFU matrix): 121.4 ms per
step with BatchNorm, 150.2 ms with InstanceNorm. ``"instance"`` (nnU-Net's choice, affine) and
``"group"`` (8 groups) remain selectable.

Input convolutions (fewer than 8 input channels, e.g. the one EM channel) are :class:`AlignedConv2d` /
:class:`AlignedConv3d`: in a channels-last model (:func:`set_channels_last`) they zero-pad input and weight
to 8 channels, which cuDNN runs as a channels-last tensor-core convolution. Unpadded, a one-channel input is
ambiguous between the two layouts; cuDNN then runs the layer channels-first with a generic kernel and
converts the 32-channel gradient for its backward (``unet_3d`` at 8 × 128³ on an H200: 15.7 → 7.7 ms for the
layer's forward and backward). The padded channels are zeros and so are their weights' gradients: the layer
computes exactly what an unpadded one does, and its parameters keep their shapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from monai.networks.blocks import Convolution
from torch import nn

NORMS = ("batch", "instance", "group")
# nnU-Net's activation: LeakyReLU with slope 0.01 (in place saves one activation copy).
LEAKY_RELU = ("leakyrelu", {"negative_slope": 0.01, "inplace": True})
GROUP_NORM_GROUPS = 8
# cuDNN's channels-last tensor-core kernels need channel counts in multiples of 8 (16 bytes of bf16).
CHANNEL_ALIGN = 8


class _AlignedInput:
    """Mixin for ``nn.ConvNd``: pads input channels to :data:`CHANNEL_ALIGN` when ``channels_last`` is set."""

    channels_last = False  # set by `set_channels_last` for a model run in channels_last(_3d)

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        pad = -self.in_channels % CHANNEL_ALIGN
        if self.channels_last and pad:
            spatial = (0, 0) * (input.ndim - 2)  # F.pad pads the last axes first: leave z, y, x alone
            fmt = torch.channels_last_3d if input.ndim == 5 else torch.channels_last
            input = F.pad(input, (*spatial, 0, pad)).contiguous(memory_format=fmt)
            weight = F.pad(weight, (*spatial, 0, pad))
        return super()._conv_forward(input, weight, bias)


class AlignedConv2d(_AlignedInput, nn.Conv2d):
    """``nn.Conv2d`` whose input channels are padded to 8 in a channels-last model (module docstring)."""


class AlignedConv3d(_AlignedInput, nn.Conv3d):
    """``nn.Conv3d`` whose input channels are padded to 8 in a channels-last model (module docstring)."""


def _aligned(conv: nn.Module) -> nn.Module:
    """The same convolution as an aligned one, with the same parameters (built on "meta": no random draws)."""
    kind = {nn.Conv2d: AlignedConv2d, nn.Conv3d: AlignedConv3d}.get(type(conv))
    if kind is None or conv.in_channels >= CHANNEL_ALIGN or conv.groups != 1:
        return conv
    aligned = kind(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
                   dilation=conv.dilation, bias=conv.bias is not None, padding_mode=conv.padding_mode, device="meta")
    aligned.load_state_dict(conv.state_dict(), assign=True)
    return aligned


def set_channels_last(model: nn.Module, enabled: bool) -> nn.Module:
    """Tell the model's input convolutions whether it runs channels-last (then they pad; module docstring)."""
    for module in model.modules():
        if isinstance(module, _AlignedInput):
            module.channels_last = enabled
    return model


def check_norm(norm: str) -> None:
    """Raise ``ValueError`` naming the valid choices unless ``norm`` is one of :data:`NORMS`."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(NORMS)}; got {norm!r}")


def norm_spec(norm: str, channels: int) -> tuple[str, dict]:
    """The MONAI ``(name, kwargs)`` norm description for ``channels`` feature maps."""
    check_norm(norm)
    if norm == "instance":
        return ("instance", {"affine": True})
    if norm == "group":
        return ("group", {"num_groups": math.gcd(GROUP_NORM_GROUPS, channels)})
    return ("batch", {})


def check_positive(name: str, values: Sequence[int] | int) -> None:
    """Raise ``ValueError`` unless every value is a positive int."""
    items = [values] if isinstance(values, int) else list(values)
    if not items or any(not isinstance(item, int) or item <= 0 for item in items):
        raise ValueError(f"{name} must be positive integers, got {values!r}")


def conv_norm_act(
    spatial_dims: int, in_channels: int, *, out_channels: int, norm: str, stride: Sequence[int] | int = 1
) -> nn.Module:
    """One 3×3(×3) convolution → norm → LeakyReLU; ``stride`` > 1 down-samples. With fewer than 8 input
    channels the convolution is an aligned one (module docstring)."""
    block = Convolution(
        spatial_dims,
        in_channels,
        out_channels,
        strides=stride,
        kernel_size=3,
        act=LEAKY_RELU,
        norm=norm_spec(norm, out_channels),
        bias=False,  # the norm's shift makes a conv bias redundant
    )
    block.conv = _aligned(block.conv)
    return block


def conv_stage(
    spatial_dims: int,
    in_channels: int,
    *,
    out_channels: int,
    norm: str,
    num_convs: int = 2,
    stride: Sequence[int] | int = 1,
) -> nn.Sequential:
    """``num_convs`` conv-norm-act layers; the first carries ``stride`` (nnU-Net's stage)."""
    layers = [conv_norm_act(spatial_dims, in_channels, out_channels=out_channels, norm=norm, stride=stride)]
    layers += [
        conv_norm_act(spatial_dims, out_channels, out_channels=out_channels, norm=norm)
        for _ in range(num_convs - 1)
    ]
    return nn.Sequential(*layers)


def up_conv(
    spatial_dims: int, in_channels: int, *, out_channels: int, stride: Sequence[int] | int
) -> nn.Module:
    """Transposed convolution with kernel = stride: learned up-sampling by ``stride``."""
    return Convolution(
        spatial_dims,
        in_channels,
        out_channels,
        strides=stride,
        kernel_size=stride,
        conv_only=True,
        is_transposed=True,
        padding=0,
        output_padding=0,
        bias=False,
    )


def head_conv(spatial_dims: int, in_channels: int, *, out_channels: int) -> nn.Module:
    """1×1(×1) convolution producing logits (with bias, no norm, no activation)."""
    return Convolution(spatial_dims, in_channels, out_channels, kernel_size=1, conv_only=True, bias=True)
