"""Small convolutional building blocks shared by the architectures, built from MONAI layers.

Norm choice (``norm``): ``"batch"`` is the default everywhere. BatchNorm has native
channels-last kernels in cuDNN and fuses well under graph compilation, while eager
``InstanceNorm3d`` has no channels-last support and loses to layout conversions (see
``/work/shared/reference/performance.md`` §7.2 for the measured numbers). ``"instance"``
(nnU-Net's choice, affine) and ``"group"`` (8 groups) remain selectable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from monai.networks.blocks import Convolution
from torch import nn

NORMS = ("batch", "instance", "group")
# nnU-Net's activation: LeakyReLU with slope 0.01 (in place saves one activation copy).
LEAKY_RELU = ("leakyrelu", {"negative_slope": 0.01, "inplace": True})
GROUP_NORM_GROUPS = 8


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
    """One 3×3(×3) convolution → norm → LeakyReLU; ``stride`` > 1 down-samples."""
    return Convolution(
        spatial_dims,
        in_channels,
        out_channels,
        strides=stride,
        kernel_size=3,
        act=LEAKY_RELU,
        norm=norm_spec(norm, out_channels),
        bias=False,  # the norm's shift makes a conv bias redundant
    )


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
