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
        "single one piece", "single MONAI", "ensemble columns", "ensemble columns, one process", "single columns + instances"}
    assert runs["single columns"]["blocks"] == runs["single columns, one process"]["blocks"] == 2 * 2
    assert runs["single cubes"]["blocks"] == 2 * 3 * 4 and runs["single cubes"]["block"] == "cubes"
    assert all(r["voxels"] == 32 * 48 * 64 and r["steady_mvox_s"] > 0 for r in runs.values())
    assert set(doc["ratios"]["single"]) == {"daisy_wall", "daisy_predicting", "rate_vs_one_process",
                                            "cubes_vs_columns", "one_piece_vs_monai", "columns_vs_monai"}
    assert runs["single MONAI"]["output_on"] == "cpu" and runs["single one piece"]["blocks"] == 1
    assert all(r["gpu_util_mean"] is None for r in runs.values())  # no nvidia-smi on the CPU
    assert set(doc["ratios"]["ensemble"]) == {"daisy_wall", "daisy_predicting", "rate_vs_one_process"}
    assert runs["single columns"]["tasks"]["pyramid-probabilities-1"]["total"] == 2 * 2  # one per column
    assert runs["single columns"]["pyramid_s"] > 0 and runs["single columns"]["startup_s"] > 0
    assert doc["projection"]["jrc_hela-2"]["voxels_lower_bound"] > 1e9 and doc["projection"]["datasets"] == 22
    assert doc["instances_s"] > 0
    md = (tmp_path / "predict_volume.md").read_text()
    assert "| single columns | 1 | 1 | daisy | 4 × columns of 32² |" in md and "cubic blocks vs columns" in md
    assert "| single MONAI | 1 | 1 | MONAI | one piece, output on cpu |" in md and "as fast as MONAI's" in md


def test_merge_joins_jobs_of_one_kind_and_refuses_others(tmp_path: Path) -> None:
    from bench.predict_volume import merge

    base = {"settings": {"size_vox": [8, 8, 8], "quick": True}, "hardware": "h200", "versions": "torch 2.11"}
    paths = []
    for i, (runs, date) in enumerate(((({"a": {"x": 1}}), "2026-12-02"), ({"b": {"x": 2}}, "2026-12-03"))):
        paths.append(tmp_path / f"p{i}.json")
        paths[-1].write_text(json.dumps({**base, "runs": runs, "date": date}))
    merged = merge(paths)
    assert merged["runs"] == {"a": {"x": 1}, "b": {"x": 2}} and merged["date"] == "2026-12-03"
    paths[1].write_text(json.dumps({**base, "hardware": "h100", "runs": {}, "date": "2026-12-03"}))
    try:
        merge(paths)
    except ValueError as err:
        assert "p1.json: hardware h100 differs" in str(err)
    else:
        raise AssertionError("records of other hardware were merged")
