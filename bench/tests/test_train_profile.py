"""bench/train_profile.py runs on the CPU (``--quick``), so the GPU run is known to start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_run_times_every_phase_and_groups_the_kernels(tiny_synth_root: Path, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.train_profile", "--root", str(tiny_synth_root), "--out",
                           str(tmp_path), "--names", "unet_3d", "--quick", "--steps", "2", "--warmup", "1"],
                          cwd=REPO, capture_output=True, text=True,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    [row] = json.loads((tmp_path / "train_profile.json").read_text())["rows"]
    assert row["name"] == "unet_3d" and row["samples_per_s"] > 0
    assert list(row["ms"]) == ["step", "augment", "forward + loss + backward", "clip + update"]
    assert all(v > 0 for v in row["ms"].values())
    assert row["profile"]["step"]["device"] == "CPU" and row["profile"]["step"]["top_kernels"]
    md = (tmp_path / "train_profile.md").read_text()
    assert "| unet_3d |" in md and "### unet_3d: step" in md and "### unet_3d: augment" in md
