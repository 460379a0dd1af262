"""The training loss: deep-supervision targets pooled by strided sampling equal nearest-neighbour
interpolation, and the deep-supervision loss is the weighted sum of its levels."""

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
