"""Fixtures of the scoring tests: they build their own stores (no dependence on `cellseg synth`)."""

import pytest
from eval_helpers import THREE_BALLS, Stores, balls


@pytest.fixture
def stores(tmp_path):
    return Stores(tmp_path)


@pytest.fixture
def three_balls():
    return balls((48, 48, 48), THREE_BALLS)
