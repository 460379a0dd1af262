"""``unet_2d`` and ``unet_3d``: nnU-Net-style plain convolutional UNets.

Design (nnU-Net's "PlainConvUNet", written for MONAI layers):
- every encoder stage is two 3×3(×3) conv-norm-LeakyReLU(0.01) layers; the first conv of each
  stage after the first down-samples with stride 2 (no pooling);
- features double per stage from 32 and are capped at 320 in 3D and 512 in 2D (nnU-Net's caps);
- the decoder up-samples with transposed convs and mirrors the encoder (two convs per level);
- 3D: 6 stages, so a 128³ patch reaches a 4³ bottleneck (divisor 32 per axis). 2D: 7 stages, so
  a 256² patch reaches 4² (divisor 64).
- per-axis ``strides`` allow anisotropic down-sampling (e.g. ``[[1, 2, 2], 2, 2, 2, 2]``); the
  divisor follows.

Shape legend: ``B`` batch, ``C`` input channels, ``F`` features, ``S`` spatial axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from cellseg.models.blocks import check_norm, check_positive, conv_stage
from cellseg.models.decoders import StridedUNet
from cellseg.models.registry import register_model

Strides = tuple[int | tuple[int, ...], ...] | None


@dataclass(frozen=True, kw_only=True)
class UNet3DParams:
    """Parameters of ``unet_3d`` (defaults: nnU-Net 3d_fullres at a 128³ patch).

    Attributes:
        features_per_stage: encoder width per stage, full resolution first.
        strides: per down-sampling step, an int or a per-axis ``(z, y, x)`` stride; ``None`` = 2.
        num_convs_per_stage: conv layers per encoder and decoder stage.
        norm: ``"batch"`` (default; fast with channels-last, see ``blocks``), ``"instance"`` or
            ``"group"``.
        deep_supervision: training-mode forward also returns coarser logits (see ``SegModel``).
    """

    features_per_stage: tuple[int, ...] = (32, 64, 128, 256, 320, 320)
    strides: Strides = None
    num_convs_per_stage: int = 2
    norm: str = "batch"
    deep_supervision: bool = False

    def __post_init__(self) -> None:
        check_positive("features_per_stage", self.features_per_stage)
        check_positive("num_convs_per_stage", self.num_convs_per_stage)
        check_norm(self.norm)
        if len(self.features_per_stage) < 2:
            raise ValueError(f"features_per_stage needs at least 2 stages, got {self.features_per_stage}")


@dataclass(frozen=True, kw_only=True)
class UNet2DParams(UNet3DParams):
    """Parameters of ``unet_2d`` (defaults: nnU-Net 2d at a 256² patch); fields as ``UNet3DParams``."""

    features_per_stage: tuple[int, ...] = (32, 64, 128, 256, 512, 512, 512)


class PlainEncoder(nn.Module):
    """Stages of ``num_convs`` conv-norm-act layers; every stage but the first down-samples."""

    def __init__(
        self,
        spatial_dims: int,
        in_channels: int,
        *,
        features: tuple[int, ...],
        strides: tuple[tuple[int, ...], ...],
        num_convs: int,
        norm: str,
    ) -> None:
        super().__init__()
        stage_strides = ((1,) * spatial_dims, *strides)
        widths_in = (in_channels, *features[:-1])
        self.stages = nn.ModuleList(
            conv_stage(spatial_dims, c_in, out_channels=c_out, norm=norm, num_convs=num_convs, stride=stride)
            for c_in, c_out, stride in zip(widths_in, features, stage_strides, strict=True)
        )

    def forward(self, image_BCS: torch.Tensor) -> list[torch.Tensor]:
        """Feature maps of every stage, full resolution first."""
        features_BFS = []
        x_BFS = image_BCS
        for stage in self.stages:
            x_BFS = stage(x_BFS)
            features_BFS.append(x_BFS)
        return features_BFS


class UNet(StridedUNet):
    """Plain convolutional UNet for 2D or 3D (see module docstring).

    Example:
        >>> model = UNet(1, out_channels=4, params=UNet3DParams(features_per_stage=(8, 16)), spatial_dims=3)
        >>> model(torch.zeros(1, 1, 16, 16, 16)).shape
        torch.Size([1, 4, 16, 16, 16])
    """

    def __init__(
        self, in_channels: int, *, out_channels: int, params: UNet3DParams, spatial_dims: int
    ) -> None:
        super().__init__(in_channels, out_channels=out_channels, params=params, spatial_dims=spatial_dims,
                         decoder_convs=params.num_convs_per_stage)

    def make_encoder(self, in_channels: int, params: UNet3DParams, strides: Sequence[Sequence[int]]) -> PlainEncoder:
        """Plain conv stages, ``num_convs_per_stage`` per stage (the first of a stage strided)."""
        return PlainEncoder(self.spatial_dims, in_channels, features=params.features_per_stage, strides=strides,
                            num_convs=params.num_convs_per_stage, norm=params.norm)


TINY = {"features_per_stage": (4, 8, 16)}


@register_model(
    "unet_2d",
    params=UNet2DParams,
    spatial_dims=2,
    default_patch_vox=(256, 256),
    tiny=TINY,
    tiny_patch_vox=(32, 32),
)
def unet_2d(in_channels: int, out_channels: int, params: UNet2DParams) -> UNet:
    """nnU-Net-style plain 2D UNet, 32→512 features, 7 stages."""
    return UNet(in_channels, out_channels=out_channels, params=params, spatial_dims=2)


@register_model(
    "unet_3d",
    params=UNet3DParams,
    spatial_dims=3,
    default_patch_vox=(128, 128, 128),
    tiny=TINY,
    tiny_patch_vox=(16, 16, 16),
)
def unet_3d(in_channels: int, out_channels: int, params: UNet3DParams) -> UNet:
    """nnU-Net-style plain 3D UNet, 32→320 features, 6 stages."""
    return UNet(in_channels, out_channels=out_channels, params=params, spatial_dims=3)
