"""Compiling in the background (`cellseg.train.background`): the room rule, the child process end to end (on the
CPU with dynamo's "eager" backend, which traces without inductor), its failures, and on a GPU a cold job that
trains eagerly, then loads the child's graphs from the compile cache and trains compiled."""

import json
import os
import time
from pathlib import Path

import pytest
import torch

from cellseg.config import load_run_config
from cellseg.runtime.gpu_memory import MARGIN, background_budget
from cellseg.train.background import BackgroundCompile

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke"
GiB = 2**30


def test_the_child_gets_what_the_job_leaves_and_only_if_it_is_enough():
    step, loss, params = 30 * GiB, 10 * GiB, GiB
    job = step + loss + (1 + 3) * params + MARGIN  # the job's step, loss, gradients and 3 state copies
    child = step + 2 * params + MARGIN  # weights, gradients and step of its own (its loss is compiled)
    assert background_budget(free=job + child, step=step, loss=loss, params=params, state_copies=3) == child
    assert background_budget(free=job + child + 5 * GiB, step=step, loss=loss, params=params,
                             state_copies=3) == child + 5 * GiB
    assert background_budget(free=job + child - 1, step=step, loss=loss, params=params, state_copies=3) is None
    assert background_budget(free=job // 2, step=step, loss=loss, params=params, state_copies=3) is None


def _start(cfg, tmp_path, monkeypatch, **kwargs) -> BackgroundCompile:
    monkeypatch.setenv("CELLSEG_COMPILE_BACKEND", "eager")  # dynamo traces, nothing is code-generated: seconds
    monkeypatch.setenv("CELLSEG_CACHE", str(tmp_path / "cache"))
    args = {"device": torch.device("cpu"), "batch": 1, "precision": "fp32", "max_bytes": 0,
            "log_path": tmp_path / "compile.log", **kwargs}
    return BackgroundCompile.start(cfg, **args)


def test_the_child_builds_compiles_and_runs_the_jobs_model_and_loss(tmp_path, monkeypatch):
    cfg = load_run_config(SMOKE / "unet_2d.yaml")  # 2D, with the boundary channels of its instance classes
    job = _start(cfg, tmp_path, monkeypatch)
    job.wait()
    text = job.log_path.read_text()
    assert job.failure() is None, text
    assert job.done() and job.seconds is not None and job.seconds > 0
    assert "compiled unet_2d and its loss for micro-batch 1 in" in text


def test_a_failed_child_reports_its_exit_status_and_log(tmp_path, monkeypatch):
    cfg = load_run_config(SMOKE / "unet_3d.yaml")
    job = _start(cfg, tmp_path, monkeypatch, precision="float8")  # refused by the child's argument parser
    job.wait()
    failure = job.failure()
    assert failure is not None and failure.startswith("exit status 2:") and "float8" in failure


def test_close_ends_a_running_child(tmp_path, monkeypatch):
    cfg = load_run_config(SMOKE / "unet_3d.yaml")
    job = _start(cfg, tmp_path, monkeypatch)
    job.close()  # at once: it is still importing torch
    assert job.process.returncode is not None and job.done()
    job.close()  # twice is harmless


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cold_gpu_job_trains_eagerly_then_compiled_from_the_childs_cache(tiny_synth_root, tmp_path, monkeypatch):
    from torch._dynamo.utils import counters

    from cellseg.train.stop import StopRequest
    from cellseg.train.trainer import Trainer

    monkeypatch.setenv("CELLSEG_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    overrides = [f"data.root={tiny_synth_root}", "train.compile=on", "train.device=cuda", "train.max_steps=3",
                 "train.log_every=1", "train.val_every=100"]
    cfg = load_run_config(SMOKE / "unet_3d.yaml", [*overrides, f"run_dir={tmp_path / 'cold'}"])
    stop = StopRequest()
    trainer = Trainer(cfg, stop=stop)
    try:
        s = trainer.s
        assert s.background is not None and s.net is s.model  # eager until the child is done
        batches = trainer.batch_stream(stop)
        trainer.train_step([next(batches)])
        batches.close()
        s.background.wait()
        before = {group: dict(counters[group]) for group in ("inductor", "aot_autograd")}
        trainer.fit()  # finds the child done before its next step: switches, then trains compiled to step 3
        assert s.background is None and s.net is not s.model and s.state.step == 3
        meta = json.loads((tmp_path / "cold" / "meta.json").read_text())["compile"]
        assert meta["background"] and meta["compiled"] and meta["background_error"] is None and meta["switch_step"] == 1
        records = [json.loads(line) for line in (tmp_path / "cold" / "metrics.jsonl").read_text().splitlines()]
        switch = [r for r in records if "compile" in r]
        assert len(switch) == 1 and switch[0]["step"] == 1 and switch[0]["compile"]["compiled"] is True
        def new(group: str, name: str) -> int:
            return counters[group][name] - before.get(group, {}).get(name, 0)

        # the model's forward and backward and the loss's, all from the cache (AOTAutograd's or inductor's)
        assert new("inductor", "fxgraph_cache_miss") == 0, dict(counters["inductor"])
        assert new("inductor", "fxgraph_cache_hit") + new("aot_autograd", "autograd_cache_hit") >= 2
        # compiling is over once a step ran compiled: inductor's compile-worker pool no longer holds host memory
        assert not _compiling_children(b"_inductor/compile_worker")
    finally:
        trainer.close()
    # the next job of the same shape finds the cache warm and compiles before its first step
    cfg = load_run_config(SMOKE / "unet_3d.yaml", [*overrides, f"run_dir={tmp_path / 'warm'}"])
    trainer = Trainer(cfg, stop=StopRequest())
    try:
        assert trainer.s.background is None and trainer.s.net is not trainer.s.model
    finally:
        trainer.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_job_that_ends_before_the_child_leaves_no_process(tiny_synth_root, tmp_path, monkeypatch):
    from cellseg.train.trainer import train

    monkeypatch.setenv("CELLSEG_CACHE", str(tmp_path / "cache"))
    cfg = load_run_config(SMOKE / "unet_3d.yaml", [f"data.root={tiny_synth_root}", f"run_dir={tmp_path / 'run'}",
                                                   "train.compile=on", "train.device=cuda", "train.max_steps=2"])
    started = time.perf_counter()
    train(cfg)
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())["compile"]
    assert meta["background"] and not meta["compiled"]
    assert not _compiling_children(b"cellseg.train.background"), (tmp_path / "run" / "compile.log").read_text()
    assert time.perf_counter() - started < 120  # not waiting for the child's compilation


def _compiling_children(marker: bytes) -> list[int]:
    """This process's children whose command line holds `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if parent == os.getpid() and marker in command:
            found.append(int(pid))
    return found
