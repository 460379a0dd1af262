"""bench/predict_volume.py runs end to end on the CPU (``--quick``), so the GPU run is known to start, and a second
run skips what the first measured (a job stopped by its time limit loses only the measurement it was in)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, "-m", "bench.predict_volume", "--quick"]  # run from the repository root (cwd=REPO)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BENCH, *args], capture_output=True, text=True, cwd=REPO,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


def test_quick_run_measures_columns_cubes_and_daisy_and_resumes(tmp_path: Path) -> None:
    first = _run("--out", str(tmp_path), "--only", "single")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "not yet measured: ensemble columns" in first.stdout and not (tmp_path / "predict_volume.json").exists()
    done = _run("--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "single columns: measured before" in done.stdout and "ensemble columns (2 members" in done.stdout
    doc = json.loads((tmp_path / "predict_volume.json").read_text())
    runs = doc["runs"]
    assert doc["size_vox"] == [32, 48, 64] and set(runs) == {
        "single columns", "single columns, one process", "single cubes", "single cubes, one process",
        "ensemble columns", "ensemble columns, one process", "ensemble cubes", "single columns + instances"}
    assert runs["single columns"]["blocks"] == runs["single columns, one process"]["blocks"] == 2 * 2
    assert runs["single cubes"]["blocks"] == 2 * 3 * 4 and runs["single cubes"]["block"] == "cubes"
    assert all(r["voxels"] == 32 * 48 * 64 and r["steady_mvox_s"] > 0 for r in runs.values())
    for who in ("single", "ensemble"):
        assert set(doc["ratios"][who]) == {"daisy_wall", "daisy_predicting", "rate_vs_one_process",
                                           "cubes_vs_columns"}
    assert doc["projection"]["jrc_hela-2"]["voxels_lower_bound"] > 1e9 and doc["projection"]["datasets"] == 22
    assert doc["instances_s"] > 0
    md = (tmp_path / "predict_volume.md").read_text()
    assert "| single columns | 1 | 1 | daisy | 4 × columns of 32² |" in md and "cubic blocks vs columns" in md
