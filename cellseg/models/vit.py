"""``vit_2d`` and ``vit_3d``: a plain ViT encoder (timm blocks) with a UNETR-style decoder.

Unlike ``monai.networks.nets.UNETR``, whose learned position embedding fixes the input size, the
position embedding here is defined on a reference token grid and interpolated (bilinear /
trilinear) to the actual grid, so any multiple of ``patch_size`` is a valid input. The
interpolation runs only when the grid differs from the reference (a shape check, which
the compiler resolves at trace time).

Decoder (UNETR, generalised to any power-of-two patch size ``2**n``): the image itself feeds
level 0 through a residual conv block; the outputs of ``n - 1`` evenly spaced transformer blocks
are projected up to levels ``1 .. n-1`` with MONAI ``UnetrPrUpBlock``; the last block (normed)
is level ``n``; MONAI ``UnetrUpBlock`` layers climb back. For ``patch_size=16`` and 12 blocks this
is UNETR: skips from blocks 3, 6 and 9, widths 16-32-64-128.

Token embedding (``embed``): ``"patch"`` is ViT's (one convolution with kernel = stride = patch);
``"conv"`` is a convolutional stem (Xiao et al. 2021, "Early convolutions help transformers see
better": stride-2 3×3 convolutions instead of the patchify layer, which trains a ViT from scratch
faster and more stably): ``n`` nnU-Net stages (two conv-norm-LeakyReLU each, the first with
stride 2), widths ``feature_size * 2**level``, then a 1×1 convolution to the token width. With
``skips="embed"`` the stem's stages feed decoder levels ``1 .. n-1`` directly (no transformer
skips, no ``UnetrPrUpBlock``: a hybrid as TransUNet); ``"tokens"`` keeps UNETR's skips.

Defaults: ViT-B (768 wide, 12 blocks, 12 heads), patch 16, feature size 16 (UNETR's).

Shape legend: ``B`` batch, ``C`` channels, ``D`` token width, ``N`` tokens, ``F`` features,
``S`` spatial axes, ``G`` token-grid axes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from monai.networks.blocks import Convolution, UnetrBasicBlock, UnetrPrUpBlock
from torch import nn
from torch.utils.checkpoint import checkpoint

from cellseg.models.base import SegModel
from cellseg.models.blocks import check_norm, check_positive, conv_stage, norm_spec
from cellseg.models.decoders import UNETRDecoder
from cellseg.models.registry import register_model

DEFAULT_PATCH_VOX = {2: (256, 256), 3: (128, 128, 128)}
EMBEDS = ("patch", "conv")
SKIPS = ("tokens", "embed")


@dataclass(frozen=True, kw_only=True)
class ViTParams:
    """Parameters of ``vit_2d`` / ``vit_3d`` (defaults: UNETR with a ViT-B encoder).

    Attributes:
        patch_size: token edge in voxels; a power of two ≥ 4 (it sets the decoder depth).
        hidden_size: token width ``D``.
        depth: transformer blocks.
        num_heads: attention heads (must divide ``hidden_size``).
        mlp_ratio: MLP hidden width / ``hidden_size``.
        feature_size: decoder width at full resolution; doubles per level.
        pos_embed_grid: tokens per axis of the learned position embedding; ``None``: the default
            patch's grid (8³ in 3D, 16² in 2D). Other grids are interpolated.
        drop_path_rate: stochastic depth, rising linearly to this value over the blocks.
        norm: decoder norm, ``"batch"`` (default), ``"instance"`` or ``"group"``.
        qk_norm: LayerNorm on each head's queries and keys before attention: bounds the attention logits, whose
            growth is the usual cause of a ViT trained from scratch diverging at a high learning rate.
        layer_scale: initial value of LayerScale (a learned per-channel factor on each residual branch, CaiT);
            ``None``: off. Small values (1e-5 .. 1e-1) start every block close to the identity.
        use_checkpoint: activation checkpointing of every transformer block in training (the block's
            activations are recomputed in backward: less memory, about one more forward of compute).
        embed: how image patches become tokens: ``"patch"`` (ViT's patchify convolution) or ``"conv"``
            (a convolutional stem of ``log2(patch_size)`` stride-2 stages; see the module docstring).
        skips: what feeds decoder levels ``1 .. n-1``: ``"tokens"`` (UNETR: evenly spaced transformer
            blocks, projected up) or ``"embed"`` (the convolutional stem's stages; needs ``embed="conv"``).
    """

    patch_size: int = 16
    hidden_size: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    feature_size: int = 16
    pos_embed_grid: int | None = None
    drop_path_rate: float = 0.0
    norm: str = "batch"
    qk_norm: bool = False
    layer_scale: float | None = None
    use_checkpoint: bool = False
    embed: str = "patch"
    skips: str = "tokens"

    def __post_init__(self) -> None:
        for name in ("patch_size", "hidden_size", "depth", "num_heads", "feature_size"):
            check_positive(name, getattr(self, name))
        check_norm(self.norm)
        if self.patch_size < 4 or self.patch_size & (self.patch_size - 1):
            raise ValueError(f"patch_size must be a power of two >= 4 (e.g. 8, 16), got {self.patch_size}")
        if self.layer_scale is not None and not 0 < self.layer_scale <= 1:
            raise ValueError(f"layer_scale must be in (0, 1] or null, got {self.layer_scale}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.depth < self.num_levels:
            raise ValueError(f"depth must be >= {self.num_levels} for patch_size {self.patch_size}")
        if self.embed not in EMBEDS:
            raise ValueError(f"embed must be one of {', '.join(EMBEDS)}; got {self.embed!r}")
        if self.skips not in SKIPS:
            raise ValueError(f"skips must be one of {', '.join(SKIPS)}; got {self.skips!r}")
        if self.skips == "embed" and self.embed != "conv":
            raise ValueError(f"skips='embed' takes the decoder's skips from a convolutional stem: it needs "
                             f"embed='conv', got embed={self.embed!r}")

    @property
    def num_levels(self) -> int:
        """Decoder levels below full resolution: ``log2(patch_size)``."""
        return int(math.log2(self.patch_size))


class ConvEmbed(nn.Module):
    """Convolutional stem: ``log2(patch_size)`` stride-2 stages, then a 1×1 projection to the token width."""

    def __init__(self, spatial_dims: int, in_channels: int, *, params: ViTParams) -> None:
        super().__init__()
        widths = [params.feature_size * 2**level for level in range(1, params.num_levels + 1)]
        self.stages = nn.ModuleList(
            conv_stage(spatial_dims, source, out_channels=width, norm=params.norm, stride=2)
            for source, width in zip([in_channels, *widths[:-1]], widths, strict=True)
        )
        self.project = Convolution(
            spatial_dims, widths[-1], params.hidden_size, kernel_size=1, conv_only=True, bias=True
        )

    def forward(self, image_BCS: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The stages' outputs at levels ``1 .. n-1`` ``(B, F, *S / 2**level)`` and the token grid ``(B, D, *G)``."""
        levels_BFS = []
        features_BFS = image_BCS
        for stage in self.stages:
            features_BFS = stage(features_BFS)
            levels_BFS.append(features_BFS)
        return levels_BFS[:-1], self.project(features_BFS)


class ViTEncoder(nn.Module):
    """Token embedding + interpolated learned position embedding + timm transformer blocks."""

    def __init__(
        self, spatial_dims: int, in_channels: int, *, params: ViTParams, grid: tuple[int, ...]
    ) -> None:
        super().__init__()
        self.conv_embed = ConvEmbed(spatial_dims, in_channels, params=params) if params.embed == "conv" else None
        self.patch_embed = Convolution(
            spatial_dims,
            in_channels,
            params.hidden_size,
            strides=params.patch_size,
            kernel_size=params.patch_size,
            padding=0,
            conv_only=True,
        ) if params.embed == "patch" else None
        self.pos_embed_1DG = nn.Parameter(torch.zeros(1, params.hidden_size, *grid))
        from timm.models.vision_transformer import Block  # timm where used: seconds of every job's start-up

        rates = [params.drop_path_rate * index / max(1, params.depth - 1) for index in range(params.depth)]
        self.blocks = nn.ModuleList(
            Block(
                params.hidden_size,
                params.num_heads,
                mlp_ratio=params.mlp_ratio,
                qkv_bias=True,
                qk_norm=params.qk_norm,
                init_values=params.layer_scale,
                drop_path=rate,
                norm_layer=partial(nn.LayerNorm, eps=1e-6),
            )
            for rate in rates
        )
        self.norm = nn.LayerNorm(params.hidden_size, eps=1e-6)
        self.use_checkpoint = params.use_checkpoint
        n = params.num_levels
        # 0-based indices of the blocks whose outputs feed decoder levels 1 .. n-1 (none: the stem's stages do).
        self.skips_from_embed = params.skips == "embed"
        self.skip_blocks = (
            () if self.skips_from_embed else tuple(round(params.depth * level / n) - 1 for level in range(1, n))
        )
        self._init_weights()

    def _init_weights(self) -> None:
        # ViT's usual init (timm/UNETR): truncated normal 0.02 for the position embedding and linears.
        nn.init.trunc_normal_(self.pos_embed_1DG, std=0.02)
        for module in self.blocks.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def position_embedding(self, grid: tuple[int, ...]) -> torch.Tensor:
        """The position embedding ``(1, N, D)`` for a token grid, interpolated when needed."""
        pos_1DG = self.pos_embed_1DG
        if tuple(pos_1DG.shape[2:]) != grid:
            mode = "trilinear" if len(grid) == 3 else "bilinear"
            pos_1DG = F.interpolate(pos_1DG, size=grid, mode=mode, align_corners=False)
        return pos_1DG.flatten(2).transpose(1, 2)

    def forward(self, image_BCS: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The embedding stem's levels ``1 .. n-1`` (empty unless ``skips="embed"``) and the token grids
        ``(B, D, *G)``: the skip blocks' outputs, then the normed last block."""
        if self.conv_embed is not None:
            embed_BFS, embedded_BDG = self.conv_embed(image_BCS)
            embed_BFS = embed_BFS if self.skips_from_embed else []  # token skips: the stem's levels are not used
        else:
            embed_BFS, embedded_BDG = [], self.patch_embed(image_BCS)
        grid = tuple(embedded_BDG.shape[2:])
        tokens_BND = embedded_BDG.flatten(2).transpose(1, 2) + self.position_embedding(grid)
        outputs_BDG = []
        recompute = self.use_checkpoint and self.training and torch.is_grad_enabled()
        for index, block in enumerate(self.blocks):
            if recompute:
                tokens_BND = checkpoint(block, tokens_BND, use_reentrant=False)
            else:
                tokens_BND = block(tokens_BND)
            if index in self.skip_blocks:
                outputs_BDG.append(_to_grid(tokens_BND, grid))
        outputs_BDG.append(_to_grid(self.norm(tokens_BND), grid))
        return embed_BFS, outputs_BDG


def _to_grid(tokens_BND: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
    """``(B, N, D)`` → ``(B, D, *G)`` as a channels-last view (no copy)."""
    return tokens_BND.unflatten(1, grid).movedim(-1, 1)


class ViTUNet(SegModel):
    """ViT encoder + UNETR-style decoder for 2D or 3D (see module docstring)."""

    def __init__(self, in_channels: int, *, out_channels: int, params: ViTParams, spatial_dims: int) -> None:
        super().__init__(
            spatial_dims=spatial_dims,
            in_channels=in_channels,
            out_channels=out_channels,
            input_divisor=params.patch_size,
        )
        n, width = params.num_levels, params.feature_size
        grid = (
            (params.pos_embed_grid,) * spatial_dims
            if params.pos_embed_grid
            else tuple(size // params.patch_size for size in DEFAULT_PATCH_VOX[spatial_dims])
        )
        self.encoder = ViTEncoder(spatial_dims, in_channels, params=params, grid=grid)
        self.stem = UnetrBasicBlock(
            spatial_dims=spatial_dims,
            in_channels=in_channels,
            out_channels=width,
            kernel_size=3,
            stride=1,
            norm_name=norm_spec(params.norm, width),
            res_block=True,
        )
        self.project = nn.ModuleList(  # token skips up to their levels (none when the stem feeds them)
            UnetrPrUpBlock(
                spatial_dims=spatial_dims,
                in_channels=params.hidden_size,
                out_channels=width * 2**level,
                num_layer=n - level - 1,  # 1 + num_layer transposed convs: 2**(n - level) up
                kernel_size=3,
                stride=1,
                upsample_kernel_size=2,
                norm_name=norm_spec(params.norm, width * 2**level),
                conv_block=True,
                res_block=True,
            )
            for level in range(1, n if params.skips == "tokens" else 1)
        )
        channels = [width * 2**level for level in range(n)] + [params.hidden_size]
        self.decoder = UNETRDecoder(
            spatial_dims, channels=channels, out_channels=out_channels, norm=params.norm
        )

    def forward_logits(self, image_BCS: torch.Tensor) -> torch.Tensor:
        """Encode to token grids, lift skips to their levels (or take the stem's), decode to logits ``(B, K, *S)``."""
        embed_BFS, (*skips_BDG, deepest_BDG) = self.encoder(image_BCS)
        lifted_BFS = [project(skip) for project, skip in zip(self.project, skips_BDG, strict=True)]
        # the stem's levels (skips="embed") or the lifted token skips (skips="tokens"): one list is empty
        return self.decoder([self.stem(image_BCS), *embed_BFS, *lifted_BFS, deepest_BDG])


TINY = {
    "patch_size": 4,
    "hidden_size": 32,
    "depth": 2,
    "num_heads": 2,
    "feature_size": 4,
    "pos_embed_grid": 4,
}


@register_model(
    "vit_2d",
    params=ViTParams,
    spatial_dims=2,
    default_patch_vox=DEFAULT_PATCH_VOX[2],
    tiny=TINY,
    tiny_patch_vox=(16, 16),
)
def vit_2d(in_channels: int, out_channels: int, params: ViTParams) -> ViTUNet:
    """UNETR-style 2D network: ViT-B/16 encoder (any multiple of 16) + conv decoder."""
    return ViTUNet(in_channels, out_channels=out_channels, params=params, spatial_dims=2)


@register_model(
    "vit_3d",
    params=ViTParams,
    spatial_dims=3,
    default_patch_vox=DEFAULT_PATCH_VOX[3],
    tiny=TINY,
    tiny_patch_vox=(16, 16, 16),
)
def vit_3d(in_channels: int, out_channels: int, params: ViTParams) -> ViTUNet:
    """UNETR-style 3D network: ViT-B/16 encoder (any multiple of 16) + conv decoder."""
    return ViTUNet(in_channels, out_channels=out_channels, params=params, spatial_dims=3)
