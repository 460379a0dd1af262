"""Decoders shared by the architectures.

Both take a list of encoder feature maps ordered from full resolution (level 0) to the
coarsest (the last entry) and return logits at level 0's resolution.

- :class:`UNetDecoder` (``unet_*``, ``resnet_*``): transposed-conv up-sampling, skip
  concatenation, ``num_convs`` conv-norm-LeakyReLU layers per level, 1×1 head(s); optional deep
  supervision.
- :class:`UNETRDecoder` (``swin_*``, ``vit_*``): MONAI's UNETR up blocks (transposed conv,
  concatenation, residual conv block) on features already brought to their level's size.

Shape legend: ``B`` batch, ``F`` feature channels, ``K`` logit channels, ``S`` spatial axes.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import torch
from monai.networks.blocks import UnetOutBlock, UnetrUpBlock
from torch import nn

from cellseg.models.base import SegModel, cumulative_divisor, resolve_strides
from cellseg.models.blocks import conv_stage, head_conv, norm_spec, up_conv


def check_levels(decoder: nn.Module, features_BFS: Sequence[torch.Tensor], levels: int) -> None:
    """Raise ``ValueError`` unless one feature map per level reaches `decoder` (a surplus would be ignored)."""
    if len(features_BFS) != levels:
        raise ValueError(f"{type(decoder).__name__}: {len(features_BFS)} feature maps for {levels} levels")


class UNetDecoder(nn.Module):
    """nnU-Net-style decoder: up-sample, concatenate the skip, convolve; one level at a time.

    Deep supervision: with ``deep_supervision=True`` a training-mode forward returns a list of
    logits, one per decoder level, full resolution first (each coarser by that level's stride).
    Eval-mode forwards always return the full-resolution tensor only.

    Args:
        spatial_dims: 2 or 3.
        skip_channels: channels of every encoder feature map, full resolution first; the last
            entry is the bottleneck.
        strides: per level, the (per-axis) stride between feature map ``i`` and ``i + 1``.
        out_channels: logit channels ``K``.
        norm: ``"batch"``, ``"instance"`` or ``"group"``.
        num_convs: conv layers per decoder level (nnU-Net: 2 for plain, 1 for residual encoders).
        deep_supervision: add a 1×1 head at every level (see above).
    """

    def __init__(
        self,
        spatial_dims: int,
        *,
        skip_channels: Sequence[int],
        strides: Sequence[Sequence[int]],
        out_channels: int,
        norm: str,
        num_convs: int = 2,
        deep_supervision: bool = False,
    ) -> None:
        super().__init__()
        if len(strides) != len(skip_channels) - 1:
            raise ValueError(
                f"need {len(skip_channels) - 1} strides for {len(skip_channels)} levels, got {strides}"
            )
        levels = range(len(skip_channels) - 1)
        self.ups = nn.ModuleList(
            up_conv(spatial_dims, skip_channels[i + 1], out_channels=skip_channels[i], stride=strides[i])
            for i in levels
        )
        self.stages = nn.ModuleList(
            conv_stage(
                spatial_dims,
                2 * skip_channels[i],
                out_channels=skip_channels[i],
                norm=norm,
                num_convs=num_convs,
            )
            for i in levels
        )
        num_heads = len(levels) if deep_supervision else 1
        self.heads = nn.ModuleList(
            head_conv(spatial_dims, skip_channels[i], out_channels=out_channels) for i in range(num_heads)
        )
        self.deep_supervision = deep_supervision

    def forward(self, features_BFS: Sequence[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
        """Decode ``features_BFS`` (full resolution first) to logits ``(B, K, *S)``."""
        check_levels(self, features_BFS, len(self.ups) + 1)
        x_BFS = features_BFS[-1]
        logits_BKS: list[torch.Tensor] = []
        for level in reversed(range(len(self.stages))):
            x_BFS = self.ups[level](x_BFS)
            x_BFS = self.stages[level](torch.cat([x_BFS, features_BFS[level]], dim=1))
            if self.deep_supervision and self.training:
                logits_BKS.insert(0, self.heads[level](x_BFS))
        if self.deep_supervision and self.training:
            return logits_BKS
        return self.heads[0](x_BFS)


class UNETRDecoder(nn.Module):
    """UNETR/SwinUNETR-style decoder: a chain of MONAI ``UnetrUpBlock`` (×2 each) and a 1×1 head.

    Args:
        spatial_dims: 2 or 3.
        channels: channels of the feature map at every level, full resolution first; level ``i``
            is ``2**i`` times coarser than level 0. The last entry is the deepest input.
        out_channels: logit channels ``K``.
        norm: ``"batch"``, ``"instance"`` or ``"group"``.
    """

    def __init__(self, spatial_dims: int, *, channels: Sequence[int], out_channels: int, norm: str) -> None:
        super().__init__()
        self.ups = nn.ModuleList(
            UnetrUpBlock(
                spatial_dims=spatial_dims,
                in_channels=channels[i + 1],
                out_channels=channels[i],
                kernel_size=3,
                upsample_kernel_size=2,
                norm_name=norm_spec(norm, channels[i]),
                res_block=True,
            )
            for i in range(len(channels) - 1)
        )
        self.head = UnetOutBlock(
            spatial_dims=spatial_dims, in_channels=channels[0], out_channels=out_channels
        )

    def forward(self, features_BFS: Sequence[torch.Tensor]) -> torch.Tensor:
        """Decode ``features_BFS`` (full resolution first) to logits ``(B, K, *S)``."""
        check_levels(self, features_BFS, len(self.ups) + 1)
        x_BFS = features_BFS[-1]
        for level in reversed(range(len(self.ups))):
            x_BFS = self.ups[level](x_BFS, features_BFS[level])
        return self.head(x_BFS)


class StridedUNet(SegModel):
    """The skeleton `unet_*` and `resnet_3d` share: strides resolved from the params, an encoder returning one
    feature map per stage (full resolution first), and a :class:`UNetDecoder` with matching skips.

    Subclasses build the encoder in :meth:`make_encoder`; the params must provide ``features_per_stage``,
    ``strides``, ``norm`` and ``deep_supervision``.
    """

    def __init__(self, in_channels: int, *, out_channels: int, params: Any, spatial_dims: int,
                 decoder_convs: int) -> None:
        strides = resolve_strides(params.strides, num_steps=len(params.features_per_stage) - 1,
                                  spatial_dims=spatial_dims)
        super().__init__(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels,
                         input_divisor=cumulative_divisor(strides, spatial_dims))
        self.encoder = self.make_encoder(in_channels, params, strides)
        self.decoder = UNetDecoder(spatial_dims, skip_channels=params.features_per_stage, strides=strides,
                                   out_channels=out_channels, norm=params.norm, num_convs=decoder_convs,
                                   deep_supervision=params.deep_supervision)

    @abc.abstractmethod
    def make_encoder(self, in_channels: int, params: Any, strides: Sequence[Sequence[int]]) -> nn.Module:
        """The encoder: image ``(B, C, *S)`` → feature maps of every stage, full resolution first."""

    def forward_logits(self, image_BCS: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """Encode, then decode to logits ``(B, K, *S)`` (a list in deep-supervised training)."""
        return self.decoder(self.encoder(image_BCS))
