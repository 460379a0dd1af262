"""The weights' moving average (`cellseg.train.optim.EMA`): its decay warm-up and its resume."""

from __future__ import annotations

import pytest
import torch

from cellseg.train.optim import EMA


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv3d(1, 4, 3), torch.nn.BatchNorm3d(4))


def test_decay_warms_up_to_the_configured_value():
    ema = EMA(_model(0), 0.999)
    assert ema.decay_at(0) == pytest.approx(0.1)
    assert ema.decay_at(80) == pytest.approx(0.9)
    assert ema.decay_at(10_000) == 0.999  # (1 + n) / (10 + n) passes 0.999 at n = 8,990


def test_update_follows_the_warmed_decay_and_copies_integer_buffers():
    start, live = _model(0), _model(1)
    live[1].num_batches_tracked += 7
    ema = EMA(start, 0.999)
    ema.update(live)
    for k, v in live.state_dict().items():
        if v.dtype.is_floating_point:  # first update: d = 0.1, so 0.1 * start + 0.9 * live
            expected = 0.1 * start.state_dict()[k].float() + 0.9 * v.float()
            torch.testing.assert_close(ema.state_dict()[k], expected)
        else:
            assert torch.equal(ema.state_dict()[k], v)
    assert ema.updates == 1


def test_a_resumed_average_continues_where_the_checkpoint_left_it():
    model, later = _model(0), _model(2)
    straight = EMA(model, 0.99)
    for _ in range(30):
        straight.update(model)
    resumed = EMA(_model(3), 0.99)
    resumed.load_state_dict({k: v.clone() for k, v in straight.state_dict().items()}, updates=30)
    straight.update(later)
    resumed.update(later)
    for k, v in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[k], v)
