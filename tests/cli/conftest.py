"""Fixtures of the command-line tests: a tiny trained run and its validation predictions (session-scoped,
read-only; copy them to modify them).

`tiny_run`: `configs/smoke/unet_3d.yaml` trained for its 4 steps on `tiny_synth_root`, on CPU.
`val_stores`: `cellseg predict` of its validation crops with the best and the last checkpoint (1 pass per
tile, no overlap): two probability stores to ensemble and post-process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke"


@pytest.fixture(scope="session")
def tiny_run(tiny_synth_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run directory of the 3D smoke model (unet_3d, tiny preset, 4 steps)."""
    from cellseg.config import load_run_config
    from cellseg.train.trainer import train

    run_dir = tmp_path_factory.mktemp("runs") / "unet_3d"
    train(load_run_config(SMOKE / "unet_3d.yaml", [f"data.root={tiny_synth_root}", f"run_dir={run_dir}"]))
    return run_dir


@pytest.fixture(scope="session")
def val_stores(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Validation predictions of `tiny_run` with its best and its last checkpoint."""
    from cellseg.config.inference import InferConfig
    from cellseg.infer.predict import predict_run

    out = tmp_path_factory.mktemp("val_stores")
    for checkpoint in ("best", "last"):
        opts = InferConfig(tta=1, overlap=0.0, checkpoint=checkpoint, device="cpu", progress=False)
        predict_run(tiny_run, "val", out / f"{checkpoint}.zarr", opts)
    return out / "best.zarr", out / "last.zarr"
