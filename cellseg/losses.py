"""Losses that ignore unknown voxels: masked BCE + soft Dice per channel.

Every target channel (classes, then boundary channels of instance classes) is a binary map with a
*known* mask; unknown voxels (unannotated classes, outside the crop, black EM) contribute nothing.

Both terms are computed *per sample* and then averaged over the batch, so the loss of a batch is the
mean of the losses of its samples: splitting a batch into micro-batches (gradient accumulation, OOM
back-off) or over DDP ranks gives exactly the same gradient.

- BCE: per sample and channel, the mean over known voxels; then the weighted mean over the channels that
  have known voxels in that sample (an unannotated class does not dilute the loss).
- Soft Dice: per sample and channel, 1 − (2·Σpt + ε) / (Σp + Σt + ε) over known voxels; the same
  weighted mean over channels. `dice_empty` says what a sample whose known voxels hold no foreground of a
  channel does: "skip" (the default) leaves such pairs to BCE, so that a rare class, absent from most samples
  of a batch, is scored by Dice only where it is (false positives stay penalised by BCE); "count" scores
  ε / (Σp + ε) there, a pull of every probability towards 0 that is strongest while the class is predicted
  nowhere: with it, 2D models (one slice a sample, most slices without a given small organelle) never learned
  lipid droplets, lysosomes, peroxisomes, endosomes or the Golgi (docs/quality.md).

Computed in float32 whatever the autocast dtype (logits are upcast).
Shapes: `B` batch, `C` channels (K classes + A boundary channels), `S` spatial axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F

DICE_EPS = 1.0  # additive smoothing in voxels: a channel with no foreground anywhere is not forced to 0
DiceEmpty = Literal["count", "skip"]


def _spatial(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


def _weighted(values_BC: torch.Tensor, present_BC: torch.Tensor, weights_C: torch.Tensor | None) -> torch.Tensor:
    """Per sample, the weighted mean over channels with known voxels; then the mean over samples."""
    w = present_BC.float() if weights_C is None else weights_C[None] * present_BC
    per_sample = (values_BC * w).sum(dim=1) / w.sum(dim=1).clamp(min=1e-8)
    return per_sample.mean()


def masked_bce(logits_BCS: torch.Tensor, target_BCS: torch.Tensor, known_BCS: torch.Tensor,
               weights_C: torch.Tensor | None = None) -> torch.Tensor:
    """Binary cross-entropy over known voxels, averaged per channel then over channels."""
    known = known_BCS.float()
    bce = F.binary_cross_entropy_with_logits(logits_BCS.float(), target_BCS.float(), reduction="none")
    count = known.sum(dim=_spatial(known))
    per_channel = (bce * known).sum(dim=_spatial(known)) / count.clamp(min=1)
    return _weighted(per_channel, count > 0, weights_C)


def masked_soft_dice(logits_BCS: torch.Tensor, target_BCS: torch.Tensor, known_BCS: torch.Tensor,
                     weights_C: torch.Tensor | None = None, *, empty: DiceEmpty = "skip") -> torch.Tensor:
    """1 − soft Dice per sample and channel over known voxels, averaged over channels then samples; `empty`:
    whether a sample and channel without known foreground counts ("count") or not ("skip", module docstring)."""
    known = known_BCS.float()
    prob = torch.sigmoid(logits_BCS.float()) * known
    target = target_BCS.float() * known
    dims = _spatial(known)
    intersection, foreground = (prob * target).sum(dim=dims), target.sum(dim=dims)
    dice = (2 * intersection + DICE_EPS) / (prob.sum(dim=dims) + foreground + DICE_EPS)
    scored = known.sum(dim=dims) > 0
    if empty == "skip":
        scored = scored & (foreground > 0)
    return _weighted(1 - dice, scored, weights_C)


class SegmentationLoss(torch.nn.Module):
    """`bce_weight · BCE + dice_weight · Dice`, with optional per-channel weights.

    Args:
        bce_weight, dice_weight: mix of the two terms.
        channel_weights: one weight per output channel (default 1 each).
        dice_empty: Dice of a sample and channel without known foreground, "count" or "skip" (module docstring).
    """

    def __init__(self, *, bce_weight: float = 1.0, dice_weight: float = 1.0,
                 channel_weights: Sequence[float] | None = None, dice_empty: DiceEmpty = "skip"):
        super().__init__()
        if dice_empty not in ("count", "skip"):
            raise ValueError(f"dice_empty must be 'count' or 'skip', got {dice_empty!r}")
        self.bce_weight, self.dice_weight, self.dice_empty = bce_weight, dice_weight, dice_empty
        weights = torch.tensor(channel_weights, dtype=torch.float32) if channel_weights is not None else None
        self.register_buffer("weights", weights, persistent=False)

    def forward(self, logits: torch.Tensor | list[torch.Tensor], target: torch.Tensor, known: torch.Tensor
                ) -> torch.Tensor:
        """Loss of full-resolution logits, or of deep-supervision outputs (full resolution first)."""
        if isinstance(logits, (list, tuple)):  # deep supervision: halve the weight per level, targets pooled
            total, norm = logits[0].new_zeros((), dtype=torch.float32), 0.0
            for level, out in enumerate(logits):
                t, k = _downsample(target, known, out.shape[2:])
                total = total + 0.5**level * self._single(out, t, k)
                norm += 0.5**level
            return total / norm
        return self._single(logits, target, known)

    def _single(self, logits: torch.Tensor, target: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
        loss = logits.new_zeros((), dtype=torch.float32)
        if self.bce_weight:
            loss = loss + self.bce_weight * masked_bce(logits, target, known, self.weights)
        if self.dice_weight:
            loss = loss + self.dice_weight * masked_soft_dice(logits, target, known, self.weights,
                                                              empty=self.dice_empty)
        return loss


def _downsample(target: torch.Tensor, known: torch.Tensor, size: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest-neighbour targets for a coarser deep-supervision output."""
    if tuple(target.shape[2:]) == tuple(size):
        return target, known
    full = target.shape[2:]
    if all(n % m == 0 for n, m in zip(full, size, strict=True)):
        # Integer factors: nearest-neighbour sampling picks source voxel i·f, i.e. a strided view, with no
        # full-resolution float copy of the targets (48 channels × 128³ × batch 8 = 3.2 GB per copy).
        step = tuple(slice(None, None, n // m) for n, m in zip(full, size, strict=True))
        return target[(..., *step)], known[(..., *step)]
    t = F.interpolate(target.float(), size=tuple(size), mode="nearest")
    k = F.interpolate(known.float(), size=tuple(size), mode="nearest")
    return t > 0.5, k > 0.5
