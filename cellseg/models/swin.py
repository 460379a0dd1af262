"""``swin_2d`` and ``swin_3d``: Swin-Transformer encoder + UNETR-style decoder (SwinUNETR design).

The encoder is assembled here from MONAI's Swin building blocks (``SwinTransformerBlock``,
``PatchMerging``, ``compute_mask``) rather than by wrapping ``monai.networks.nets.SwinUNETR``:
- SwinUNETR's stage code calls ``einops``, which is not a cellseg dependency;
- its forward checks the input size with NumPy; ours checks plain ints (``SegModel``), which
  the compiler resolves at trace time;
- tokens stay in ``(B, *S, C)`` layout from stage to stage instead of being permuted to
  ``(B, C, *S)`` and back around every stage; with a ``channels_last`` model the patch
  embedding's output already has that layout, so the first ``movedim`` is free.
The decoder is SwinUNETR's: a residual conv block refines the image and every hidden state, and
MONAI ``UnetrUpBlock`` layers climb back to full resolution.

Defaults: SwinUNETR's (feature size 48, depths 2-2-2-2, heads 3-6-12-24) with window 8 instead of
7: patches are powers of two (128³, 256²), so 8 tiles every stage exactly, while 7 pads the first
stage 64 → 70 (+31 % tokens in 3D) and the last 8 → 14. Counted forward cost at 128³ is about the
same (1528 vs 1537 GFLOP with window 7) while each window sees 49 % more context. Divisor: 2
(patch embedding) × 2 per stage = 32 per axis.

Shape legend: ``B`` batch, ``C`` channels, ``F`` features, ``S`` spatial axes.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch
from monai.networks.blocks import Convolution, UnetrBasicBlock
from monai.networks.nets.swin_unetr import PatchMerging, SwinTransformerBlock, compute_mask, get_window_size
from torch import nn

from cellseg.models.base import SegModel
from cellseg.models.blocks import check_norm, check_positive, norm_spec
from cellseg.models.decoders import UNETRDecoder
from cellseg.models.registry import register_model


@dataclass(frozen=True, kw_only=True)
class SwinParams:
    """Parameters of ``swin_2d`` / ``swin_3d`` (defaults: SwinUNETR, window 8).

    Attributes:
        feature_size: embedding width after the 2× patch embedding; doubles per stage.
        depths: Swin blocks per stage.
        num_heads: attention heads per stage (must divide that stage's width).
        window_size: attention window edge in tokens (per axis).
        mlp_ratio: MLP hidden width / embedding width.
        drop_path_rate: stochastic depth, rising linearly to this value over all blocks.
        norm: decoder norm, ``"batch"`` (default), ``"instance"`` or ``"group"``.
        use_checkpoint: activation checkpointing of every Swin block (less memory, ~30 % slower).
        use_flash_attention: fused ``scaled_dot_product_attention`` when gradients are off
            (inference; MONAI >= 1.6, ignored before); MONAI's training path stays the explicit
            softmax.
    """

    feature_size: int = 48
    depths: tuple[int, ...] = (2, 2, 2, 2)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    window_size: int = 8
    mlp_ratio: float = 4.0
    drop_path_rate: float = 0.0
    norm: str = "batch"
    use_checkpoint: bool = False
    use_flash_attention: bool = True

    def __post_init__(self) -> None:
        check_positive("feature_size", self.feature_size)
        check_positive("depths", self.depths)
        check_positive("num_heads", self.num_heads)
        check_positive("window_size", self.window_size)
        check_norm(self.norm)
        if len(self.depths) != len(self.num_heads):
            raise ValueError(f"depths {self.depths} and num_heads {self.num_heads} need one entry per stage")
        for stage, heads in enumerate(self.num_heads):
            if (self.feature_size * 2**stage) % heads:
                raise ValueError(
                    f"stage {stage} width {self.feature_size * 2**stage} is not divisible by num_heads {heads}"
                )


def _flash_attention_kwargs(enabled: bool) -> dict[str, bool]:
    """``use_flash_attention`` for MONAI >= 1.6; earlier releases (pyproject allows 1.5) lack it."""
    if "use_flash_attention" in inspect.signature(SwinTransformerBlock.__init__).parameters:
        return {"use_flash_attention": enabled}
    return {}


class SwinStage(nn.Module):
    """Swin blocks (alternating plain / shifted windows), then 2× patch merging.

    Works on tokens ``(B, *S, F)`` and returns ``(B, *S/2, 2F)``.
    """

    def __init__(
        self,
        spatial_dims: int,
        dim: int,
        *,
        depth: int,
        num_heads: int,
        params: SwinParams,
        drop_path: list[float],
    ) -> None:
        super().__init__()
        self.window_size = (params.window_size,) * spatial_dims
        self.shift_size = tuple(size // 2 for size in self.window_size)
        self.blocks = nn.ModuleList(
            SwinTransformerBlock(
                dim=dim,
                num_heads=num_heads,
                window_size=self.window_size,
                shift_size=self.shift_size if index % 2 else (0,) * spatial_dims,
                mlp_ratio=params.mlp_ratio,
                qkv_bias=True,
                drop_path=drop_path[index],
                use_checkpoint=params.use_checkpoint,
                **_flash_attention_kwargs(params.use_flash_attention),
            )
            for index in range(depth)
        )
        self.merge = PatchMerging(dim=dim, norm_layer=nn.LayerNorm, spatial_dims=spatial_dims)

    def forward(self, tokens_BSF: torch.Tensor) -> torch.Tensor:
        """Attend within (shifted) windows, then halve every spatial axis and double ``F``."""
        spatial = tuple(tokens_BSF.shape[1:-1])
        window, shift = get_window_size(spatial, self.window_size, self.shift_size)
        padded = [math.ceil(size / edge) * edge for size, edge in zip(spatial, window, strict=True)]
        mask = compute_mask(padded, window, shift, tokens_BSF.device)
        for block in self.blocks:
            tokens_BSF = block(tokens_BSF, mask)
        return self.merge(tokens_BSF)


class SwinEncoder(nn.Module):
    """2× patch embedding, then Swin stages; returns every level's hidden state, finest first.

    Hidden state ``i`` has ``feature_size * 2**i`` channels at ``1 / 2**(i+1)`` of the input size
    and is layer-normalised over channels (as SwinUNETR's ``normalize=True``).
    """

    def __init__(self, spatial_dims: int, in_channels: int, *, params: SwinParams) -> None:
        super().__init__()
        width = params.feature_size
        self.patch_embed = Convolution(
            spatial_dims, in_channels, width, strides=2, kernel_size=2, padding=0, conv_only=True
        )
        num_blocks = sum(params.depths)
        # Plain Python (not torch.linspace) so that building on the meta device works.
        rates = [params.drop_path_rate * index / max(1, num_blocks - 1) for index in range(num_blocks)]
        starts = [sum(params.depths[:stage]) for stage in range(len(params.depths))]
        self.stages = nn.ModuleList(
            SwinStage(
                spatial_dims,
                width * 2**stage,
                depth=depth,
                num_heads=heads,
                params=params,
                drop_path=rates[start : start + depth],
            )
            for stage, (depth, heads, start) in enumerate(
                zip(params.depths, params.num_heads, starts, strict=True)
            )
        )
        self.norms = nn.ModuleList(nn.LayerNorm(width * 2**level) for level in range(len(params.depths) + 1))

    def forward(self, image_BCS: torch.Tensor) -> list[torch.Tensor]:
        """Hidden states ``(B, F_i, *S_i)``, finest first."""
        tokens_BSF = self.patch_embed(image_BCS).movedim(1, -1)
        hidden_BFS = [self.norms[0](tokens_BSF).movedim(-1, 1)]
        for stage, norm in zip(self.stages, self.norms[1:], strict=True):
            tokens_BSF = stage(tokens_BSF)
            hidden_BFS.append(norm(tokens_BSF).movedim(-1, 1))
        return hidden_BFS


class SwinUNet(SegModel):
    """Swin encoder + SwinUNETR-style residual-conv decoder for 2D or 3D (see module docstring)."""

    def __init__(self, in_channels: int, *, out_channels: int, params: SwinParams, spatial_dims: int) -> None:
        num_levels = len(params.depths) + 1  # patch embedding + one merge per stage
        super().__init__(
            spatial_dims=spatial_dims,
            in_channels=in_channels,
            out_channels=out_channels,
            input_divisor=2**num_levels,
        )
        width = params.feature_size
        # Level 0 is the image itself; level i >= 1 is hidden state i - 1.
        channels = [width] + [width * 2**level for level in range(num_levels)]
        self.encoder = SwinEncoder(spatial_dims, in_channels, params=params)
        self.refine = nn.ModuleList(
            UnetrBasicBlock(
                spatial_dims=spatial_dims,
                in_channels=c_in,
                out_channels=c_out,
                kernel_size=3,
                stride=1,
                norm_name=norm_spec(params.norm, c_out),
                res_block=True,
            )
            for c_in, c_out in zip([in_channels, *channels[1:]], channels, strict=True)
        )
        self.decoder = UNETRDecoder(
            spatial_dims, channels=channels, out_channels=out_channels, norm=params.norm
        )

    def forward_logits(self, image_BCS: torch.Tensor) -> torch.Tensor:
        """Encode, refine each level with a residual conv block, decode to logits ``(B, K, *S)``."""
        levels_BFS = [image_BCS, *self.encoder(image_BCS)]
        return self.decoder([block(level) for block, level in zip(self.refine, levels_BFS, strict=True)])


# Three stages (divisor 16) keep the tiny patch at 16³ / 16²; window 4 still exercises shifting.
TINY = {"feature_size": 8, "depths": (1, 1, 1), "num_heads": (1, 2, 2), "window_size": 4}


@register_model(
    "swin_2d",
    params=SwinParams,
    spatial_dims=2,
    default_patch_vox=(256, 256),
    tiny=TINY,
    tiny_patch_vox=(16, 16),
)
def swin_2d(in_channels: int, out_channels: int, params: SwinParams) -> SwinUNet:
    """SwinUNETR-style 2D network: Swin encoder (window 8) + residual-conv UNETR decoder."""
    return SwinUNet(in_channels, out_channels=out_channels, params=params, spatial_dims=2)


@register_model(
    "swin_3d",
    params=SwinParams,
    spatial_dims=3,
    default_patch_vox=(128, 128, 128),
    tiny=TINY,
    tiny_patch_vox=(16, 16, 16),
)
def swin_3d(in_channels: int, out_channels: int, params: SwinParams) -> SwinUNet:
    """SwinUNETR-style 3D network: Swin encoder (window 8³) + residual-conv UNETR decoder."""
    return SwinUNet(in_channels, out_channels=out_channels, params=params, spatial_dims=3)
