"""Fitted weights with a member that has no boundary channels (another tool's probabilities, `--allow-partial`)."""

from __future__ import annotations

import numpy as np
import pytest

from cellseg.infer.ensemble_fit import _channel_weights
from cellseg.infer.members import ChannelPlan
from cellseg.infer.weights import explicit_weights


def _plan() -> ChannelPlan:
    # member 0 predicts mito without boundaries (e.g. nnU-Net), member 1 with them
    return ChannelPlan(channels=("mito", "mito_boundary"), members_of={"mito": (0, 1), "mito_boundary": (1,)},
                       instance_channels=("mito",))


def test_boundary_channel_follows_its_class_weights_among_the_members_that_have_it() -> None:
    weights = _channel_weights(_plan(), 2, {"mito": np.array([0.3, 0.7])})
    assert weights["mito"] == pytest.approx((0.3, 0.7))
    assert weights["mito_boundary"] == pytest.approx((0.0, 1.0))


def test_boundary_channel_of_a_member_weighted_zero_is_still_written(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="cellseg.infer.weights")
    weights = _channel_weights(_plan(), 2, {"mito": np.array([1.0, 0.0])})
    assert weights["mito"] == pytest.approx((1.0, 0.0))
    assert weights["mito_boundary"] == pytest.approx((0.0, 1.0))  # uniform over the members that have it
    assert "have weight 0 for mito" in caplog.text


def test_explicit_weights_keep_the_boundaries_of_a_member_weighted_zero() -> None:
    weights = explicit_weights(_plan(), [1.0, 0.0], 2)
    assert weights.per_channel["mito"] == pytest.approx((1.0, 0.0))
    assert weights.per_channel["mito_boundary"] == pytest.approx((0.0, 1.0))
