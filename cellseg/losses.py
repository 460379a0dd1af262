"""Losses that ignore unknown voxels: masked BCE + soft Dice per channel.

Every target channel (classes, then boundary channels of instance classes) is a binary map with a
*known* mask; unknown voxels (unannotated classes, outside the crop, black EM) contribute nothing.

- BCE: mean over known voxels of each channel, then a weighted mean over channels that have any known
  voxel in the batch (so a class unannotated in every sample of the batch does not dilute the loss).
- Soft Dice ("batch Dice", as nnU-Net computes it): sums over batch and space of the known voxels,
  1 − (2·Σpt + ε) / (Σp + Σt + ε) per channel, weighted mean over channels with known voxels.

Computed in float32 whatever the autocast dtype (logits are upcast).
Shapes: `B` batch, `C` channels (K classes + A boundary channels), `S` spatial axes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

DICE_EPS = 1.0  # additive smoothing in voxels: a channel with no foreground anywhere is not forced to 0


def _channel_mean(values_BCS: torch.Tensor, known_BCS: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dims = (0, *range(2, values_BCS.ndim))
    count = known_BCS.sum(dim=dims)
    return (values_BCS * known_BCS).sum(dim=dims) / count.clamp(min=1), count > 0


def _weighted(values_C: torch.Tensor, present_C: torch.Tensor, weights_C: torch.Tensor | None) -> torch.Tensor:
    w = present_C.float() if weights_C is None else weights_C * present_C
    return (values_C * w).sum() / w.sum().clamp(min=1e-8)


def masked_bce(logits_BCS: torch.Tensor, target_BCS: torch.Tensor, known_BCS: torch.Tensor,
               weights_C: torch.Tensor | None = None) -> torch.Tensor:
    """Binary cross-entropy over known voxels, averaged per channel then over channels."""
    known = known_BCS.float()
    bce = F.binary_cross_entropy_with_logits(logits_BCS.float(), target_BCS.float(), reduction="none")
    per_channel, present = _channel_mean(bce, known)
    return _weighted(per_channel, present, weights_C)


def masked_soft_dice(logits_BCS: torch.Tensor, target_BCS: torch.Tensor, known_BCS: torch.Tensor,
                     weights_C: torch.Tensor | None = None) -> torch.Tensor:
    """1 − soft Dice per channel over known voxels (batch Dice), averaged over channels."""
    known = known_BCS.float()
    prob = torch.sigmoid(logits_BCS.float()) * known
    target = target_BCS.float() * known
    dims = (0, *range(2, logits_BCS.ndim))
    intersection = (prob * target).sum(dim=dims)
    denominator = prob.sum(dim=dims) + target.sum(dim=dims)
    dice = (2 * intersection + DICE_EPS) / (denominator + DICE_EPS)
    return _weighted(1 - dice, known.sum(dim=dims) > 0, weights_C)


class SegmentationLoss(torch.nn.Module):
    """`bce_weight · BCE + dice_weight · Dice`, with optional per-channel weights.

    Args:
        bce_weight, dice_weight: mix of the two terms.
        channel_weights: one weight per output channel (default 1 each).
    """

    def __init__(self, *, bce_weight: float = 1.0, dice_weight: float = 1.0,
                 channel_weights: Sequence[float] | None = None):
        super().__init__()
        self.bce_weight, self.dice_weight = bce_weight, dice_weight
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
            loss = loss + self.dice_weight * masked_soft_dice(logits, target, known, self.weights)
        return loss


def _downsample(target: torch.Tensor, known: torch.Tensor, size: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest-neighbour targets for a coarser deep-supervision output."""
    if tuple(target.shape[2:]) == tuple(size):
        return target, known
    t = F.interpolate(target.float(), size=tuple(size), mode="nearest")
    k = F.interpolate(known.float(), size=tuple(size), mode="nearest")
    return t > 0.5, k > 0.5
