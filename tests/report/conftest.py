"""Fixtures of the report tests: two smoke runs of different architectures on `tiny_synth_root`, and one
report made from them (module-scoped in the tests; every fixture here is read-only: copy to modify).

`report_runs`: `configs/smoke/unet_3d.yaml` and `configs/smoke/resnet_3d.yaml`, 4 CPU steps each, with
16³ patches (8× fewer voxels per tile than the smoke configs' 32³: the report predicts every crop twice,
once with 8 test-time transforms, and the file must stay fast on 2 cores).
`report_dir`: `cellseg report` of those runs with `FAST` settings: test crop 501 scored, the runs' tuning crop
deciding, no tile overlap, on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke"


PATCH = "data.patch_shape_vox=[16,16,16]"  # divisible by both tiny models' input divisor (4)
# Fast report settings: the smaller test crop scored (truth in ground_truth.zarr), the runs' validation crop tunes;
# no tile overlap, one overlay crop.
FAST = {"crops": "501", "tune_crops": "val", "overlap": 0.0, "slices": 1, "device": "cpu", "progress": False}


def train_smoke(config: str, root: Path, run_dir: Path, *overrides: str) -> Path:
    """Train a smoke config on `root` into `run_dir` (as the trainer tests do)."""
    from cellseg.config import load_run_config
    from cellseg.train.trainer import train

    train(load_run_config(SMOKE / config, [f"data.root={root}", f"run_dir={run_dir}", *overrides]))
    return run_dir


@pytest.fixture(scope="session")
def report_runs(tiny_synth_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Run directories of the unet_3d and resnet_3d smoke models (same classes, same data root)."""
    runs = tmp_path_factory.mktemp("report_runs")
    return (train_smoke("unet_3d.yaml", tiny_synth_root, runs / "unet_3d", PATCH),
            train_smoke("resnet_3d.yaml", tiny_synth_root, runs / "resnet_3d", PATCH))


@pytest.fixture(scope="session")
def report_dir(report_runs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A report directory of `report_runs` made with the `FAST` settings (read-only)."""
    from cellseg.report import ReportOptions, run_report

    out = tmp_path_factory.mktemp("report") / "report"
    run_report(ReportOptions(runs=tuple(str(r) for r in report_runs), out=str(out), **FAST))
    return out
