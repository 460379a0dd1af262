"""bench/train_e2e.py runs end to end on CPU (``--quick``), so the GPU run is known to start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = ["-m", "bench.train_e2e"]  # run from the repository root (cwd=REPO)


def test_quick_run_measures_end_to_end_and_in_memory(tiny_synth_root: Path, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, *BENCH, "--root", str(tiny_synth_root), "--out", str(tmp_path),
                           "--names", "unet_3d", "--quick", "--steps", "2", "--warmup", "1", "--repeats", "2"],
                          capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    [row] = json.loads((tmp_path / "train_e2e.json").read_text())["rows"]
    assert row["name"] == "unet_3d" and row["e2e_samples_per_s"] > 0 and row["in_memory_samples_per_s"] > 0
    before, after = row["in_memory_before_samples_per_s"], row["in_memory_after_samples_per_s"]  # bracketing
    assert abs(2 / (1 / before + 1 / after) - row["in_memory_samples_per_s"]) < 1e-6 * before  # the e2e timing
    assert 0 < row["first_step_s"] < 300 and row["first_step_warm_s"] is not None
    md = (tmp_path / "train_e2e.md").read_text()
    assert "| unet_3d | 1 | 2 |" in md and "- unet_3d: " in md  # one GPU, batch 2
    assert "in-memory drift" in md and " %" in md.split("| unet_3d | 1 | 2 |")[1].split("|")[4]
    phases = row["startup_s"]  # where the time before the first step went
    assert list(phases)[:3] == ["imports", "devices", "model"] and list(phases)[-2:] == ["first batch", "first step"]
    assert sum(phases.values()) <= row["first_step_s"] + 0.1
    warm = row["startup_warm_s"]  # the second process, with the caches the first left
    assert list(warm) == list(phases) and row["warm_reused_startup_record"] is False  # CPU jobs keep no record
    assert row["graphs_compiled_at_first_step"] == row["warm_graphs_compiled_at_first_step"] == 0  # compile off
    assert "Warm (the compile cache" in md


def test_quick_ddp_run_reports_scaling_end_to_end(tiny_synth_root: Path, tmp_path: Path) -> None:
    """`--gpus 1,2` runs the architecture as one process and as a 2-rank torchrun job (gloo on the CPU) and
    divides their rates: the DDP efficiency of the same run."""
    done = subprocess.run([sys.executable, *BENCH, "--root", str(tiny_synth_root), "--out", str(tmp_path),
                           "--names", "unet_3d", "--quick", "--steps", "2", "--warmup", "1", "--repeats", "1",
                           "--gpus", "1,2", "--cores-per-gpu", "1"],
                          capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "train_e2e.json").read_text())
    one, two = report["rows"]
    assert (one["gpus"], two["gpus"]) == (1, 2) and one["batch"] == two["batch"]  # per-GPU batch fixed
    [scaling] = report["ddp_efficiency"]
    assert scaling["gpus"] == 2
    assert scaling["e2e"] == two["e2e_samples_per_s"] / (2 * one["e2e_samples_per_s"])
    md = (tmp_path / "train_e2e.md").read_text()
    assert "| unet_3d | 2 | 2 |" in md and "- unet_3d on 2 GPUs: " in md and "DDP scaling efficiency" in md
