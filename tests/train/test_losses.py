"""The training loss: deep-supervision targets pooled by strided sampling equal nearest-neighbour
interpolation, and the deep-supervision loss is the weighted sum of its levels."""

import pytest
import torch
import torch.nn.functional as F

from cellseg.losses import SegmentationLoss, _downsample


def test_deep_supervision_targets_equal_nearest_interpolation():
    g = torch.Generator().manual_seed(0)
    target = torch.rand((2, 3, 16, 32, 8), generator=g) > 0.5
    known = torch.rand((2, 3, 16, 32, 8), generator=g) > 0.2
    for size in [(8, 16, 4), (4, 8, 2), (2, 4, 1), (5, 7, 3)]:  # integer factors (strided), and not
        t, k = _downsample(target, known, size)
        assert t.dtype == k.dtype == torch.bool
        assert torch.equal(t, F.interpolate(target.float(), size=size, mode="nearest") > 0.5), size
        assert torch.equal(k, F.interpolate(known.float(), size=size, mode="nearest") > 0.5), size


def test_deep_supervision_loss_is_the_halving_weighted_mean_of_levels():
    g = torch.Generator().manual_seed(1)
    target = torch.rand((2, 4, 16, 16, 16), generator=g) > 0.7
    known = torch.ones_like(target)
    known[:, 1] = False  # an unannotated channel contributes nothing
    levels = [torch.randn((2, 4, n, n, n), generator=g) for n in (16, 8, 4)]
    loss = SegmentationLoss()
    expected = sum(0.5**i * loss(out, *_downsample(target, known, out.shape[2:])) for i, out in enumerate(levels))
    torch.testing.assert_close(loss(levels, target, known), expected / (1 + 0.5 + 0.25))


def test_dice_empty_skip_scores_dice_only_where_the_class_is():
    """With `dice_empty="skip"` (the default) a sample without foreground of a channel leaves that channel's Dice out; the
    loss of the batch is still the mean of its samples' losses."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn((3, 2, 8, 8), generator=g)
    target = torch.zeros((3, 2, 8, 8), dtype=torch.bool)
    target[0, 0, 2:5, 2:5] = True  # channel 0 present in sample 0 only; channel 1 in samples 0 and 1
    target[:2, 1, 4:, :] = True
    known = torch.ones_like(target)
    skip = SegmentationLoss(bce_weight=0.0)  # the default
    count = SegmentationLoss(bce_weight=0.0, dice_empty="count")
    per_sample = []
    for b, channels in enumerate([[0, 1], [1], []]):
        prob, t = torch.sigmoid(logits[b, channels]), target[b, channels].float()
        dice = (2 * (prob * t).sum((1, 2)) + 1) / (prob.sum((1, 2)) + t.sum((1, 2)) + 1)
        per_sample.append((1 - dice).mean() if channels else torch.tensor(0.0))
    torch.testing.assert_close(skip(logits, target, known), torch.stack(per_sample).mean())
    whole = sum(skip(logits[b:b + 1], target[b:b + 1], known[b:b + 1]) for b in range(3)) / 3
    torch.testing.assert_close(skip(logits, target, known), whole)
    assert count(logits, target, known) > skip(logits, target, known)  # the empty pairs' pull, counted
    with pytest.raises(ValueError, match="dice_empty must be 'count' or 'skip'"):
        SegmentationLoss(dice_empty="never")


def test_dice_empty_is_a_checked_config_key_defaulting_to_skip():
    from cellseg.config.load import load
    from cellseg.config.schema import RunConfig

    assert load(RunConfig, "configs/experiments/unet_2d.yaml").loss.dice_empty == "skip"
    assert load(RunConfig, "configs/experiments/unet_2d.yaml", ["loss.dice_empty=count"]).loss.dice_empty == "count"
    with pytest.raises(ValueError, match=r"loss\.dice_empty"):
        load(RunConfig, "configs/experiments/unet_2d.yaml", ["loss.dice_empty=never"])
