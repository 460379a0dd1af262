"""Fixtures shared by every test package.

`tiny_synth_root`: one synthetic data root (`cellseg synth --preset tiny --seed 0`) built once per test
session: 3 datasets (4 nm, 5.24×4×4 nm, 8 nm), 6 training crops (some annotated at 2× the EM voxel
size, some with classes left unannotated), 2 test crops in `ground_truth.zarr`, manifests and a
datasplit.csv. Treat it as read-only; copy it if a test must modify it.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_synth_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a tiny synthetic CellMap-layout data root (read-only, shared by the session)."""
    from cellseg.synth import generate

    return generate(tmp_path_factory.mktemp("synth") / "tiny", preset="tiny", seed=0, workers=1).out
