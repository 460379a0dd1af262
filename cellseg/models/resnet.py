"""``resnet_2d`` and ``resnet_3d``: residual-encoder UNets.

- ``resnet_2d``: a timm ResNet (``features_only=True``, any timm CNN name works) as encoder, never
  downloaded (``pretrained=False``); a local checkpoint can be loaded with
  ``encoder_checkpoint`` (see :mod:`cellseg.models.pretrained`). timm CNNs start at stride 2, so a
  light full-resolution conv stem adds the level-0 skip that restores sharp boundaries, and the
  UNet decoder climbs back to the input size.
- ``resnet_3d``: nnU-Net's residual encoder ("ResEnc M") in MONAI blocks: a conv stem, then per
  stage ``blocks_per_stage`` basic residual blocks (the first strided), features 32→320; decoder
  with one conv per level as in nnU-Net's ResEnc presets.

Shape legend: ``B`` batch, ``C`` input channels, ``F`` features, ``S`` spatial axes.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from monai.networks.blocks import UnetResBlock
from torch import nn

from cellseg.models.base import SegModel
from cellseg.models.blocks import LEAKY_RELU, check_norm, check_positive, conv_norm_act, conv_stage, norm_spec
from cellseg.models.decoders import StridedUNet, UNetDecoder
from cellseg.models.pretrained import load_encoder_checkpoint
from cellseg.models.registry import register_model

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ResNet2DParams:
    """Parameters of ``resnet_2d``.

    Attributes:
        encoder: a timm model name that supports ``features_only`` (default ``resnet34``).
        encoder_checkpoint: path of a local timm state dict for the encoder; ``None``: random init.
            Nothing is ever downloaded.
        stem_features: width of the full-resolution conv stem (the level-0 skip).
        num_decoder_convs: conv layers per decoder level.
        norm: decoder/stem norm, ``"batch"`` (default), ``"instance"`` or ``"group"``; the timm
            encoder keeps its own BatchNorm.
        deep_supervision: training-mode forward also returns coarser logits (see ``SegModel``).
    """

    encoder: str = "resnet34"
    encoder_checkpoint: str | None = None
    stem_features: int = 32
    num_decoder_convs: int = 2
    norm: str = "batch"
    deep_supervision: bool = False

    def __post_init__(self) -> None:
        check_positive("stem_features", self.stem_features)
        check_positive("num_decoder_convs", self.num_decoder_convs)
        check_norm(self.norm)
        import timm  # imported where used: it costs seconds of every training job's start-up

        if not timm.is_model(self.encoder):
            examples = ", ".join(timm.list_models("resnet*")[:8])
            raise ValueError(
                f"unknown timm encoder {self.encoder!r}; e.g. {examples} (see timm.list_models())"
            )


@dataclass(frozen=True, kw_only=True)
class ResNet3DParams:
    """Parameters of ``resnet_3d`` (defaults: nnU-Net ResEnc M at a 128³ patch).

    Attributes:
        features_per_stage: encoder width per stage, full resolution first.
        blocks_per_stage: residual blocks per encoder stage.
        strides: per down-sampling step, an int or a per-axis ``(z, y, x)`` stride; ``None`` = 2.
        num_decoder_convs: conv layers per decoder level.
        norm: ``"batch"`` (default), ``"instance"`` or ``"group"``.
        deep_supervision: training-mode forward also returns coarser logits (see ``SegModel``).
    """

    features_per_stage: tuple[int, ...] = (32, 64, 128, 256, 320, 320)
    blocks_per_stage: tuple[int, ...] = (1, 3, 4, 6, 6, 6)
    strides: tuple[int | tuple[int, ...], ...] | None = None
    num_decoder_convs: int = 1
    norm: str = "batch"
    deep_supervision: bool = False

    def __post_init__(self) -> None:
        check_positive("features_per_stage", self.features_per_stage)
        check_positive("blocks_per_stage", self.blocks_per_stage)
        check_positive("num_decoder_convs", self.num_decoder_convs)
        check_norm(self.norm)
        if len(self.blocks_per_stage) != len(self.features_per_stage):
            raise ValueError(
                f"blocks_per_stage {self.blocks_per_stage} needs one entry per stage of "
                f"features_per_stage {self.features_per_stage}"
            )


class TimmUNet(SegModel):
    """A timm ``features_only`` CNN encoder + full-resolution stem + UNet decoder (2D only).

    Example:
        >>> model = TimmUNet(1, out_channels=3, params=ResNet2DParams(encoder="resnet18"))
        >>> model(torch.zeros(1, 1, 64, 64)).shape
        torch.Size([1, 3, 64, 64])
    """

    def __init__(self, in_channels: int, *, out_channels: int, params: ResNet2DParams) -> None:
        import timm

        # pretrained=False always: clusters are offline; local weights come via encoder_checkpoint.
        encoder = timm.create_model(
            params.encoder, features_only=True, pretrained=False, in_chans=in_channels
        )
        reductions = [1, *encoder.feature_info.reduction()]
        strides = [(after // before,) * 2 for before, after in itertools.pairwise(reductions)]
        super().__init__(
            spatial_dims=2, in_channels=in_channels, out_channels=out_channels, input_divisor=reductions[-1]
        )
        self.encoder = encoder
        self.stem = conv_stage(2, in_channels, out_channels=params.stem_features, norm=params.norm)
        self.decoder = UNetDecoder(
            2,
            skip_channels=[params.stem_features, *encoder.feature_info.channels()],
            strides=strides,
            out_channels=out_channels,
            norm=params.norm,
            num_convs=params.num_decoder_convs,
            deep_supervision=params.deep_supervision,
        )

    def forward_logits(self, image_BCS: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
        """Stem + encoder features, decoded to logits ``(B, K, Y, X)``."""
        return self.decoder([self.stem(image_BCS), *self.encoder(image_BCS)])


class ResidualEncoder(nn.Module):
    """Conv stem, then stages of MONAI ``UnetResBlock`` (the first block of a stage is strided)."""

    def __init__(
        self,
        spatial_dims: int,
        in_channels: int,
        *,
        params: ResNet3DParams,
        strides: tuple[tuple[int, ...], ...],
    ) -> None:
        super().__init__()
        features = params.features_per_stage
        self.stem = conv_norm_act(spatial_dims, in_channels, out_channels=features[0], norm=params.norm)
        stage_strides = ((1,) * spatial_dims, *strides)
        widths_in = (features[0], *features[:-1])
        self.stages = nn.ModuleList(
            self._stage(spatial_dims, c_in, c_out, stride=stride, num_blocks=num_blocks, norm=params.norm)
            for c_in, c_out, stride, num_blocks in zip(
                widths_in, features, stage_strides, params.blocks_per_stage, strict=True
            )
        )

    @staticmethod
    def _stage(
        spatial_dims: int, c_in: int, c_out: int, *, stride, num_blocks: int, norm: str
    ) -> nn.Sequential:
        blocks = [
            UnetResBlock(
                spatial_dims,
                c_in if index == 0 else c_out,
                c_out,
                kernel_size=3,
                stride=stride if index == 0 else 1,
                norm_name=norm_spec(norm, c_out),
                act_name=LEAKY_RELU,
            )
            for index in range(num_blocks)
        ]
        return nn.Sequential(*blocks)

    def forward(self, image_BCS: torch.Tensor) -> list[torch.Tensor]:
        """Feature maps of every stage, full resolution first."""
        features_BFS = []
        x_BFS = self.stem(image_BCS)
        for stage in self.stages:
            x_BFS = stage(x_BFS)
            features_BFS.append(x_BFS)
        return features_BFS


class ResEncUNet(StridedUNet):
    """Residual-encoder UNet (nnU-Net ResEnc-style) for 2D or 3D; registered as ``resnet_3d``."""

    def __init__(
        self, in_channels: int, *, out_channels: int, params: ResNet3DParams, spatial_dims: int
    ) -> None:
        super().__init__(in_channels, out_channels=out_channels, params=params, spatial_dims=spatial_dims,
                         decoder_convs=params.num_decoder_convs)

    def make_encoder(self, in_channels: int, params: ResNet3DParams, strides: Sequence[Sequence[int]]
                     ) -> ResidualEncoder:
        """Residual stages (nnU-Net ResEnc style)."""
        return ResidualEncoder(self.spatial_dims, in_channels, params=params, strides=strides)


@register_model(
    "resnet_2d",
    params=ResNet2DParams,
    spatial_dims=2,
    default_patch_vox=(256, 256),
    tiny={"encoder": "resnet18", "stem_features": 8},
    tiny_patch_vox=(32, 32),
)
def resnet_2d(in_channels: int, out_channels: int, params: ResNet2DParams) -> TimmUNet:
    """timm ResNet-34 encoder (local weights only) + full-resolution stem + UNet decoder."""
    model = TimmUNet(in_channels, out_channels=out_channels, params=params)
    if params.encoder_checkpoint is not None:
        report = load_encoder_checkpoint(model.encoder, params.encoder_checkpoint)
        log.info("resnet_2d encoder weights: %s", report.summary())
    return model


@register_model(
    "resnet_3d",
    params=ResNet3DParams,
    spatial_dims=3,
    default_patch_vox=(128, 128, 128),
    tiny={"features_per_stage": (4, 8, 16), "blocks_per_stage": (1, 1, 2)},
    tiny_patch_vox=(16, 16, 16),
)
def resnet_3d(in_channels: int, out_channels: int, params: ResNet3DParams) -> ResEncUNet:
    """nnU-Net ResEnc-M-style residual 3D encoder (32→320) + UNet decoder."""
    return ResEncUNet(in_channels, out_channels=out_channels, params=params, spatial_dims=3)
