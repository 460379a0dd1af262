"""bench/host_memory.py runs end to end on CPU (``--quick``): a training job's memory is sampled and summarised."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "host_memory.py"


def test_quick_run_samples_the_job_and_its_steps(tiny_synth_root: Path, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--root", str(tiny_synth_root),
                           "--out", str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((tmp_path / "host_memory.json").read_text())
    samples = result["samples"]
    assert len(samples) >= 10 and max(s["rss_mib"] for s in samples) > 100  # torch alone holds > 100 MiB
    assert any(s["step"] for s in samples), "the job's logged steps are read while it trains"
    summary = result["summary"]
    assert summary["rss_mib_peak"] >= summary["rss_mib_end"] > 0 and isinstance(summary["flat"], bool)
    assert "| 0.1 |" in (tmp_path / "host_memory.md").read_text()


def test_an_existing_run_directory_is_never_reused(tiny_synth_root: Path, tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--root", str(tiny_synth_root),
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode != 0 and "exists" in done.stderr
