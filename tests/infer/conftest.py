"""Fixtures of the inference tests: tiny trained runs (session-scoped, read-only; copy one to modify it).

`tiny_run`: `configs/smoke/unet_3d.yaml` trained for its 4 steps on `tiny_synth_root`, on CPU.
`tiny_run_2d`: the same with `configs/smoke/unet_2d.yaml`.
Each is a complete run directory (config.yaml, meta.json, datasplit.csv, checkpoints/{last,best}.pt).
"""

from __future__ import annotations

from pathlib import Path

import pytest

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke"


def train_smoke(config: str, root: Path, run_dir: Path, *overrides: str) -> Path:
    """Train a smoke config (as the trainer tests do) and return its run directory."""
    from cellseg.config import load_run_config
    from cellseg.train.trainer import train

    train(load_run_config(SMOKE / config, [f"data.root={root}", f"run_dir={run_dir}", *overrides]))
    return run_dir


@pytest.fixture(scope="session")
def tiny_run(tiny_synth_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run directory of the 3D smoke model (unet_3d, tiny preset, 4 steps)."""
    return train_smoke("unet_3d.yaml", tiny_synth_root, tmp_path_factory.mktemp("runs") / "unet_3d")


@pytest.fixture(scope="session")
def tiny_run_2d(tiny_synth_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run directory of the 2D smoke model (unet_2d, tiny preset, slices across z, y and x, 4 steps)."""
    return train_smoke("unet_2d.yaml", tiny_synth_root, tmp_path_factory.mktemp("runs") / "unet_2d")
