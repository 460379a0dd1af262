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


def test_the_verdict_waits_for_the_background_compile_and_ignores_falls_and_the_last_sample() -> None:
    if str(BENCH.parents[1]) not in sys.path:
        sys.path.insert(0, str(BENCH.parents[1]))  # the repository root: bench/ is not an installed package
    from bench.host_memory import summarise

    # 60 samples 10 s apart: a background compile's process (+6000 MiB) until step 2000, then a level of 5000 MiB
    # that grows 1 MiB a sample, and a last sample taken while the job ends (its workers gone)
    samples = [{"t_s": 10.0 * i, "rss_mib": (11000.0 if i < 20 else 5000.0 + i), "step": 100 * i} for i in range(60)]
    samples[-1]["rss_mib"] = 2500.0
    blind = summarise(samples)  # warm-up = the first fifth: the process's exit reads as a fall, not a leak
    assert blind["growth_mib"] < -5000 and blind["flat"] is True
    s = summarise(samples, switch_step=1900)
    assert s["warmup_samples"] == 20 and s["switch_step"] == 1900
    assert abs(s["slope_mib_per_min"] - 6.0) < 1e-9  # 1 MiB per 10 s: the ending sample does not tilt it
    assert 0 < s["growth_mib"] < 50 and s["flat"] is True
    leaking = [{**x, "rss_mib": 5000.0 + 100 * i} for i, x in enumerate(samples)]  # 100 MiB per sample
    assert summarise(leaking, switch_step=1900)["flat"] is False
