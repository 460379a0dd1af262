"""Fixtures of the benchmark and study tests (`bench/tests`, `bench/studies/tests`).

`tiny_synth_root`: the same synthetic root as the library tests' fixture (tests/conftest.py), built once per test
session: `cellseg synth --preset tiny --seed 0`. Treat it as read-only; copy it if a test must modify it.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_synth_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a tiny synthetic CellMap-layout data root (read-only, shared by the session)."""
    from cellseg.synth import generate

    return generate(tmp_path_factory.mktemp("synth") / "tiny", preset="tiny", seed=0, workers=1).out
