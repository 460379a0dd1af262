"""Parameter and FLOP counts of registered architectures (for ``cellseg models`` and ``bench/``).

FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` (a multiply-add is 2 FLOPs;
convolutions, matmuls and attention are counted, norms and activations are not) on the *meta*
device: nothing is computed, so counting a ViT-B at 128³ costs milliseconds, not minutes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from cellseg.models.base import json_ready
from cellseg.models.registry import build_model, get_entry

SUMMARY_OUT_CHANNELS = 16


@dataclass(frozen=True, kw_only=True)
class ModelSummary:
    """One row of ``cellseg models``.

    Attributes:
        name: registry name.
        preset: ``"default"`` or ``"tiny"``.
        spatial_dims: 2 or 3.
        num_params: trainable parameters (with ``SUMMARY_OUT_CHANNELS`` output channels).
        patch_shape_vox: the preset's patch, in voxels.
        voxel_size_nm: the voxel size the patch is meant for.
        input_divisor: per-axis divisor every input size must be a multiple of.
        tta_axes: flippable axes; ``tta_transpose_axes``: swappable axes.
        forward_gflop_per_patch: one forward pass of one patch, in GFLOP.
        forward_kflop_per_voxel: the same per voxel, in kFLOP.
        summary: the builder's one-line description.
    """

    name: str
    preset: str
    spatial_dims: int
    num_params: int
    patch_shape_vox: tuple[int, ...]
    voxel_size_nm: tuple[float, ...]
    input_divisor: tuple[int, ...]
    tta_axes: tuple[str, ...]
    tta_transpose_axes: tuple[str, ...]
    forward_gflop_per_patch: float
    forward_kflop_per_voxel: float
    summary: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return json_ready(self.__dict__)


def count_flops(model: nn.Module, input_shape: Sequence[int], *, backward: bool = False) -> int:
    """FLOPs of one forward (and, with ``backward=True``, backward) pass at ``input_shape``.

    The model is moved to the meta device (a copy is not made: pass a model you no longer need
    on a real device, or one built on ``meta``). Eval mode is used for forward-only counts.
    """
    model = model.to("meta")
    model.train(backward)
    image = torch.empty(tuple(input_shape), device="meta")
    with FlopCounterMode(display=False) as counter:
        logits = model(image)
        if backward:
            loss = (
                sum(item.float().sum() for item in logits)
                if isinstance(logits, list)
                else logits.float().sum()
            )
            loss.backward()
    return int(counter.get_total_flops())


def summarize_model(
    name: str, *, preset: str = "default", in_channels: int = 1, out_channels: int = SUMMARY_OUT_CHANNELS
) -> ModelSummary:
    """Build ``name`` on the meta device and count its parameters and forward FLOPs per patch."""
    entry = get_entry(name)
    with torch.device("meta"):
        model = build_model(name, in_channels, out_channels, preset=preset)
    spec = model.spec
    assert spec is not None
    num_params = sum(param.numel() for param in model.parameters() if param.requires_grad)
    flops = count_flops(model, (1, in_channels, *spec.default_patch_vox))
    voxels = math.prod(spec.default_patch_vox)
    return ModelSummary(
        name=name,
        preset=preset,
        spatial_dims=spec.spatial_dims,
        num_params=num_params,
        patch_shape_vox=spec.default_patch_vox,
        voxel_size_nm=spec.default_voxel_size_nm,
        input_divisor=spec.input_divisor,
        tta_axes=spec.tta_axes,
        tta_transpose_axes=spec.tta_transpose_axes,
        forward_gflop_per_patch=flops / 1e9,
        forward_kflop_per_voxel=flops / voxels / 1e3,
        summary=entry.summary,
    )
