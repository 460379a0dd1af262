"""bench/gpu_sharing.py runs end to end on CPU (`--quick`: tiny models, time-sliced only), so the GPU run is known
to start its jobs together, count their steps and write its table."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_run_writes_each_jobs_rate(tmp_path: Path) -> None:
    bench = importlib.import_module("bench.gpu_sharing")
    assert bench.parse_jobs("unet_3d:2,unet_2d") == [("unet_3d", 2), ("unet_2d", None)]
    assert bench.main(["--quick", "--jobs", "unet_3d:2,unet_2d", "--seconds", "0.5", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gpu_sharing.json").read_text())
    assert list(doc["modes"]) == ["time-sliced"] and doc["jobs"] == ["unet_3d:2", "unet_2d"]
    rows = doc["modes"]["time-sliced"]
    assert [r["job"] for r in rows] == ["unet_3d", "unet_2d"] and rows[0]["batch"] == 2
    assert all(r["steps"] > 0 and r["samples_per_s"] > 0 for r in rows)
    assert "| unet_3d | 2 × 16×16×16 |" in (tmp_path / "gpu_sharing.md").read_text()
