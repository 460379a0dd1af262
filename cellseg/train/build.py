"""The network and the loss of a training job, built from its config the same way wherever they are needed: the
training process (`cellseg.train.setup`) and the process that compiles them in the background
(`cellseg.train.background`), whose compiled graphs must be the training process's to the byte."""

from __future__ import annotations

from typing import Any

import torch

from cellseg.config.schema import RunConfig
from cellseg.losses import SegmentationLoss
from cellseg.models import build_model, get_entry
from cellseg.models.blocks import set_channels_last


def model_params(cfg: RunConfig) -> dict[str, Any]:
    """`model.params`, with `use_checkpoint` set by `train.activation_checkpointing`."""
    params = dict(cfg.model.params)
    if cfg.train.activation_checkpointing:
        if "use_checkpoint" not in get_entry(cfg.model.name).param_names():
            raise ValueError(f"train.activation_checkpointing: {cfg.model.name} has no activation checkpointing "
                             "(the swin and vit models do)")
        params["use_checkpoint"] = True
    return params


def make_model(cfg: RunConfig, device: torch.device, fmt: torch.memory_format) -> torch.nn.Module:
    """The configured network (one input channel, one output per target channel) on `device` in `fmt`; in a
    channels-last `fmt` its input convolutions pad the channel axis (`cellseg.models.blocks`).

    Raises:
        ValueError: `data.patch_shape_vox` does not suit the model's input divisor.
    """
    model = build_model(cfg.model.name, 1, cfg.data.num_target_channels, preset=cfg.model.preset, **model_params(cfg))
    try:
        model.validate_input(torch.empty((1, 1, *cfg.data.model_patch_vox), device="meta"))  # patch must fit the model's divisor
    except ValueError as err:
        raise ValueError(f"data.patch_shape_vox={list(cfg.data.patch_shape_vox)} does not suit {cfg.model.name}: "
                         f"{err}") from None
    channels_last = fmt in (torch.channels_last, torch.channels_last_3d)
    return set_channels_last(model, channels_last).to(device=device, memory_format=fmt)  # input convs pad


def example_input(cfg: RunConfig, device: torch.device, *, batch: int, fmt: torch.memory_format) -> torch.Tensor:
    """A random float32 batch `(B, 1, *S)` shaped and laid out as the trainer feeds the model (the probes')."""
    return torch.randn((batch, 1, *cfg.data.model_patch_vox), device=device).contiguous(memory_format=fmt)


def make_criterion(cfg: RunConfig, device: torch.device) -> SegmentationLoss:
    """Masked BCE + Dice over the classes and then the boundary channels, weighted as `loss` says."""
    weights = [cfg.loss.class_weights.get(c, 1.0) for c in cfg.data.classes] + \
              [cfg.loss.boundary_weight] * len(cfg.data.boundary_classes)
    return SegmentationLoss(bce_weight=cfg.loss.bce_weight, dice_weight=cfg.loss.dice_weight,
                            channel_weights=weights, dice_empty=cfg.loss.dice_empty).to(device)
