"""The trainer on the tiny synthetic set, on CPU: learning, exact resume, pre-emption, OOM back-off,
compile fallback, config errors and DDP equivalence."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cellseg.cli import main as cli
from cellseg.config import load_run_config
from cellseg.train.stop import EXIT_RESUMABLE
from cellseg.train.trainer import Trainer, train

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke" / "unet_3d.yaml"


def _cfg(root, run_dir, *overrides):
    return load_run_config(SMOKE, [f"data.root={root}", f"run_dir={run_dir}", *overrides])


def _losses(run_dir):
    lines = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train"]["loss"] for r in lines if "train" in r}


def test_loss_falls(tiny_synth_root, tmp_path):
    # BCE alone: Dice of rare classes moves slowly in a few steps and would hide the signal.
    cfg = _cfg(tiny_synth_root, tmp_path / "run", "train.max_steps=30", "train.log_every=1", "train.val_every=30",
               "optim.lr=1e-2", "optim.warmup_steps=2", "augment.enabled=false", "loss.dice_weight=0")
    train(cfg)
    losses = list(_losses(tmp_path / "run").values())
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3
    for name in ("config.yaml", "meta.json", "datasplit.csv", "metrics.jsonl", "checkpoints/last.pt",
                 "checkpoints/best.pt", "tensorboard"):
        assert (tmp_path / "run" / name).exists(), name
    assert load_run_config(tmp_path / "run" / "config.yaml") == cfg  # the resolved config round-trips
    # Where the time before the first step went: one "startup" record, the set-up's phases in meta.json too.
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (startup,) = [r["startup"] for r in records if "startup" in r]
    assert list(startup["setup"]) == ["devices", "model", "batch size", "data", "loader start", "compile"]
    assert all(v >= 0 for v in startup["setup"].values()) and startup["first_step"] > 0
    assert startup["job_to_first_step"] >= sum(startup["setup"].values()) + startup["first_step"]
    assert startup["process_to_first_step"] >= startup["job_to_first_step"]  # imports and config loading too
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["startup_s"] == startup["setup"]
    # How much of each logged window waited for the loader: a share, logged with every training record.
    waits = [r["train"]["data_wait_frac"] for r in records if "train" in r]
    assert len(waits) == 30 and all(0.0 <= w <= 1.0 for w in waits)


def test_resume_continues_exactly(tiny_synth_root, tmp_path):
    common = ["train.log_every=1", "train.val_every=100", "train.checkpoint_every=3", "optim.schedule=constant",
              "optim.warmup_steps=0"]
    train(_cfg(tiny_synth_root, tmp_path / "a", "train.max_steps=6", *common))
    train(_cfg(tiny_synth_root, tmp_path / "b", "train.max_steps=3", *common))
    train(_cfg(tiny_synth_root, tmp_path / "b", "train.max_steps=6", *common), resume=True)
    a, b = _losses(tmp_path / "a"), _losses(tmp_path / "b")
    assert [a[s] for s in (4, 5, 6)] == [b[s] for s in (4, 5, 6)]
    with pytest.raises(FileExistsError, match="--resume"):
        train(_cfg(tiny_synth_root, tmp_path / "b", "train.max_steps=6", *common))
    # "auto" (requeued SLURM jobs): continue where a checkpoint exists, start fresh where none does.
    assert train(_cfg(tiny_synth_root, tmp_path / "b", "train.max_steps=7", *common), resume="auto")
    assert max(_losses(tmp_path / "b")) == 7
    train(_cfg(tiny_synth_root, tmp_path / "c", "train.max_steps=1", *common), resume="auto")


def test_loader_workers_start_before_compilation_with_the_same_batches(tiny_synth_root, tmp_path):
    """`train` starts the loader's workers during set-up (they import while the model compiles); the batches,
    hence the losses, are those of a trainer that starts them at its first batch."""
    import multiprocessing

    from cellseg.train.stop import StopRequest

    def workers_after(trainer_of_stop):
        before, stop = set(multiprocessing.active_children()), StopRequest()
        try:
            trainer = trainer_of_stop(stop)
            started = set(multiprocessing.active_children()) - before
            return trainer, started
        finally:
            stop.restore()

    common = ["train.max_steps=4", "train.log_every=1", "train.val_every=100", "data.resident=off",
              "loader.num_workers=1", "loader.persistent_workers=true"]
    early, started = workers_after(lambda stop: Trainer(_cfg(tiny_synth_root, tmp_path / "early", *common),
                                                        stop=stop))
    assert started, "no loader worker started during set-up"
    assert "loader start" in early.s.startup_s and list(early.s.startup_s)[-1] == "compile"
    early.fit()
    early.close()  # ends the persistent loader's workers, not only at the end of the process
    deadline = time.time() + 30
    while any(p.is_alive() for p in started) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(p.is_alive() for p in started), "a persistent loader's worker outlived close()"
    late = Trainer(_cfg(tiny_synth_root, tmp_path / "late", *common))  # no stop request: workers at the first batch
    late.fit()
    late.close()
    assert _losses(tmp_path / "early") == _losses(tmp_path / "late")
    # A trainer closed before it trained ends the workers it started (not kept by a persistent loader).
    unused, started = workers_after(lambda stop: Trainer(
        _cfg(tiny_synth_root, tmp_path / "unused", *common, "loader.persistent_workers=false"), stop=stop))
    assert started
    unused.close()
    deadline = time.time() + 30
    while any(p.is_alive() for p in started) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(p.is_alive() for p in started), "a loader worker outlived close()"


def test_sigterm_checkpoints_and_exits_resumable(tiny_synth_root, tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "cellseg", "train", str(SMOKE), f"data.root={tiny_synth_root}", f"run_dir={run}",
           "train.max_steps=100000", "train.log_every=1", "train.val_every=100000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not ((run / "metrics.jsonl").exists() and len(_losses(run)) >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_RESUMABLE == 75, err[-2000:]  # stopped early: resumable, not finished
    step = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["step"]
    assert 2 <= step < 100000
    assert not (run / "result.json").exists()


def test_oom_backoff_keeps_training(tiny_synth_root, tmp_path):
    trainer = Trainer(_cfg(tiny_synth_root, tmp_path / "run", "train.max_steps=3", "train.log_every=1"))
    raised = []

    def oom_once(module, args):
        if not raised:
            raised.append(True)
            raise torch.OutOfMemoryError("simulated CUDA out of memory")

    trainer.s.model.register_forward_pre_hook(oom_once)
    result = trainer.fit()
    assert raised and trainer.s.state.micro_batch == 1 and trainer.s.state.step == 3
    assert result["micro_batch"] == 1 and torch.isfinite(torch.tensor(result["loss"]))


def test_compile_error_falls_back_to_eager(tiny_synth_root, tmp_path, monkeypatch):
    monkeypatch.setenv("CELLSEG_COMPILE_BACKEND", "no_such_backend")
    train(_cfg(tiny_synth_root, tmp_path / "run", "train.compile=on", "train.max_steps=1"))
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["compile"]["compiled"] is False and "compile error" in meta["compile"]["reason"]


@pytest.mark.parametrize(("override", "message"), [
    ("train.max_stpes=3", "unknown config key train.max_stpes"),
    ("train.max_steps=three", "train.max_steps: expected int"),
    ("data.patch_shape_vox=[30,30,30]", "data.patch_shape_vox=\\[30, 30, 30\\] does not suit unet_3d"),
    ("model.name=unet_2d", "model.name=unet_2d is 2D"),
    ("data.classes=[mitochondrion]", "unknown CellMap class 'mitochondrion'"),
])
def test_config_errors_name_the_key(tiny_synth_root, tmp_path, override, message, capsys):
    code = cli(["train", str(SMOKE), f"data.root={tiny_synth_root}", f"run_dir={tmp_path / 'r'}", override])
    assert code == 2
    assert pytest.importorskip("re").search(message, capsys.readouterr().err)


def test_ddp_two_processes_equal_one_with_double_batch(tiny_synth_root, tmp_path):
    # Instance norm (batch-independent) and SGD (updates linear in the gradient; Adam's first steps are
    # sign-like and amplify float noise in near-zero gradients) make the comparison meaningful.
    common = ["train.max_steps=3", "augment.enabled=false", "model.params.norm=instance", "optim.name=sgd", "optim.lr=1e-2",
              "optim.warmup_steps=0", "optim.schedule=constant", "train.val_every=1000", "loader.samples_per_epoch=16"]
    train(_cfg(tiny_synth_root, tmp_path / "single", "train.batch_size=2", *common))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29517",
           "-m", "cellseg", "-q", "train", str(SMOKE), f"data.root={tiny_synth_root}", f"run_dir={tmp_path / 'ddp'}",
           "train.batch_size=1", *common]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    single = torch.load(tmp_path / "single" / "checkpoints" / "last.pt", weights_only=False)["model"]
    ddp = torch.load(tmp_path / "ddp" / "checkpoints" / "last.pt", weights_only=False)["model"]
    for key, value in single.items():
        torch.testing.assert_close(ddp[key], value, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("path", sorted(SMOKE.parent.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_smoke_config_trains_on_cpu(tiny_synth_root, tmp_path, path):
    cfg = load_run_config(path, [f"data.root={tiny_synth_root}", f"run_dir={tmp_path / path.stem}",
                                 "train.max_steps=2", "train.val_every=2"])
    result = train(cfg)
    assert torch.isfinite(torch.tensor(result["loss"]))
    assert (tmp_path / path.stem / "checkpoints" / "best.pt").is_file()
    assert result["val"]["metric"] == "2026-07"  # the default era: the leaderboard's


def test_profile_writes_a_trace(tiny_synth_root, tmp_path):
    code = cli(["train", str(SMOKE), f"data.root={tiny_synth_root}", f"run_dir={tmp_path / 'run'}",
                "train.max_steps=6", "--profile", "2"])
    assert code == 0
    profile = tmp_path / "run" / "profile"
    assert list(profile.glob("*.json")) and (profile / "summary.txt").read_text().strip()
