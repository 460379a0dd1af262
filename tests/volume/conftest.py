"""Fixtures of the whole-volume tests: the tiny unet_3d smoke run (4 CPU steps on `tiny_synth_root`)."""

from __future__ import annotations

from pathlib import Path

import pytest

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke"


@pytest.fixture(scope="session")
def volume_run(tiny_synth_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run directory of the 3D smoke model (unet_3d, tiny preset, 8 nm, patch 32³, 4 steps)."""
    from cellseg.config import load_run_config
    from cellseg.train.trainer import train

    run_dir = tmp_path_factory.mktemp("volume_runs") / "unet_3d"
    train(load_run_config(SMOKE / "unet_3d.yaml", [f"data.root={tiny_synth_root}", f"run_dir={run_dir}"]))
    return run_dir
