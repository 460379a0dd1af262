"""bench/validation_workers.py runs end to end on CPU: the same scores in the training process and in workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = ["-m", "bench.validation_workers"]  # run from the repository root (cwd=REPO)


def test_quick_run_scores_alike_in_and_out_of_process(tiny_synth_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "vw"
    done = subprocess.run([sys.executable, *BENCH, "--root", str(tiny_synth_root), "--out", str(out),
                           "--rounds", "1"], capture_output=True, text=True,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["identical_scores"] is True and [r["workers"] for r in doc["rows"]] == [0, 2]
    assert all(len(r["seconds"]) == 2 and r["tasks"] > 0 for r in doc["rows"])
    assert "| 2 |" in out.with_suffix(".md").read_text()
