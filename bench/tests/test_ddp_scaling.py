"""bench/ddp_scaling.py on the CPU: one process and a 2-rank torchrun job (gloo) of the tiny unet_3d, in the
trainer's DDP order and with the options the bench compares, then the efficiency table of the runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = ["-m", "bench.ddp_scaling"]  # run from the repository root (cwd=REPO)
# dynamo traces the model (and splits it at DDP's buckets), nothing is code-generated: seconds on 2 cores
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CELLSEG_COMPILE_BACKEND": "eager"}
ARGS = ["--preset", "tiny", "--device", "cpu", "--batch", "2", "--channels", "4", "--steps", "2", "--warmup", "1"]


def _run(out: Path, ranks: int, *extra: str) -> None:
    launch = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  f"--nproc-per-node={ranks}"]
    done = subprocess.run([*launch, *BENCH, "--out", str(out), *ARGS, *extra], capture_output=True, text=True,
                          env=ENV, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]


def test_one_and_two_ranks_in_both_ddp_orders_give_an_efficiency_table(tmp_path: Path) -> None:
    _run(tmp_path, 1)
    _run(tmp_path, 2)
    _run(tmp_path, 2, "--ddp", "wrap-then-compile", "--broadcast-buffers", "off")
    rows = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("ddp_*.json")}
    assert set(rows) == {"ddp_unet_3d_w1_b2_c4_losson_default", "ddp_unet_3d_w2_b2_c4_losson_default",
                         "ddp_unet_3d_w2_b2_c4_losson_default_wrapfirst_nobcast"}
    variant = rows["ddp_unet_3d_w2_b2_c4_losson_default_wrapfirst_nobcast"]
    assert variant["world_size"] == 2 and variant["ddp"] == "wrap-then-compile"
    assert variant["broadcast_buffers"] == "off" and variant["samples_per_s"] > 0
    done = subprocess.run([sys.executable, *BENCH, "--summarize", str(tmp_path)], capture_output=True,
                          text=True, env=ENV, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    table = done.stdout.splitlines()
    assert len(table) == 2 + 3 and "| - | 1 | 2 |" in table[2]  # the 1-rank run is every 2-rank run's base
    one = rows["ddp_unet_3d_w1_b2_c4_losson_default"]["samples_per_s"]
    assert f"{variant['samples_per_s'] / (2 * one):.1%} |" in "\n".join(table)
    assert any("wrap-then-compile, buffers off | 2 |" in line for line in table)
