"""Signals as a scheduler sends them: to the whole process group, loader workers included, at any moment.

Every interrupted run ends by itself with status 75 (stopped early, resumable), a checkpoint at the step it
reached, a log that says so and no result.json; resumed, it continues with exactly the losses of a run that
was never interrupted. `bench/faults_sigterm.py` repeats the random-moment trial 20 times and more.
"""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path
from types import ModuleType

import pytest
from faultkit import REPO, finish, losses, sigterm_driver, start, wait_for

from cellseg.runtime.checkpoint import load
from cellseg.train.stop import EXIT_RESUMABLE

STEPS, WORKERS = 8, 2  # saves at steps 3 and 6 (train.checkpoint_every=3), and 8 (the final validation)


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_faults_sigterm", REPO / "bench" / "faults_sigterm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference(bench: ModuleType, tiny_synth_root: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[dict[int, float], float]:
    """Losses and wall time of the run never interrupted (a subprocess, like the interrupted ones)."""
    run = tmp_path_factory.mktemp("reference") / "run"
    status, seconds = bench.run(bench.train_command(tiny_synth_root, run, STEPS, WORKERS), run.with_suffix(".log"))
    assert status == 0, run.with_suffix(".log").read_text()[-3000:]
    return losses(run), seconds


DRIVER = sigterm_driver("cellseg.train.run_checkpoints", "save_atomic", "SIGTERM_AT_SAVE",
                        "as the Nth checkpoint write begins")


def test_sigterm_to_the_group_during_a_checkpoint(bench: ModuleType, reference: tuple[dict[int, float], float],
                                                  tiny_synth_root: Path, tmp_path: Path) -> None:
    driver, run = tmp_path / "driver.py", tmp_path / "run"
    driver.write_text(DRIVER)
    command = bench.train_command(tiny_synth_root, run, STEPS, WORKERS)
    proc = start([str(driver), *command[3:]], log=tmp_path / "log", extra_env={"SIGTERM_AT_SAVE": "2"})
    assert finish(proc) == EXIT_RESUMABLE
    text = (tmp_path / "log").read_text()
    assert "Traceback" not in text and "exited unexpectedly" not in text
    assert f"stopped at step 6 on SIGTERM; checkpoint {run}/checkpoints/last.pt written" in text
    assert load(run / "checkpoints" / "last.pt")["step"] == 6  # the log line told the truth
    assert not (run / "result.json").exists() and not (run / "train.lock").exists()
    status, _ = bench.run(bench.train_command(tiny_synth_root, run, STEPS, WORKERS, "--resume", "auto"),
                          tmp_path / "resume.log")
    assert status == 0 and (run / "result.json").exists()
    assert losses(run) == reference[0]


def test_sigterm_to_the_group_during_start_up(bench: ModuleType, reference: tuple[dict[int, float], float],
                                             tiny_synth_root: Path, tmp_path: Path) -> None:
    record = bench.trial(tiny_synth_root, tmp_path / "run", steps=STEPS, workers=WORKERS, delay=1.0,
                         reference=reference[0])
    assert record["ok"], record  # status 75 (set-up finished, step-0 checkpoint) or killed before any file


def test_sigterm_to_the_group_during_training(bench: ModuleType, reference: tuple[dict[int, float], float],
                                              tiny_synth_root: Path, tmp_path: Path) -> None:
    record = bench.trial(tiny_synth_root, tmp_path / "run", steps=STEPS, workers=WORKERS, after_steps=2,
                         reference=reference[0])
    assert record["ok"] and record["status"] == EXIT_RESUMABLE and 2 <= record["steps_before"] < STEPS, record


def test_ctrl_c_stops_with_a_checkpoint(tiny_synth_root: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = start(["-m", "cellseg", "train", str(REPO / "configs" / "smoke" / "unet_3d.yaml"),
                  f"data.root={tiny_synth_root}", f"run_dir={run}", "train.max_steps=100000", "train.log_every=1",
                  "train.val_every=100000", f"loader.num_workers={WORKERS}"], log=tmp_path / "log")
    wait_for(lambda: len(losses(run)) >= 3, proc=proc)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends to the foreground group
    assert finish(proc) == EXIT_RESUMABLE
    text = (tmp_path / "log").read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    step = load(run / "checkpoints" / "last.pt")["step"]
    assert step == max(losses(run)) >= 3  # nothing trained after the last checkpoint is lost
    assert f"stopped early at step {step} on SIGINT" in text


@pytest.mark.slow
def test_sigterm_to_a_torchrun_group_stops_every_rank_at_one_step(tiny_synth_root: Path, tmp_path: Path) -> None:
    # Two DDP ranks (gloo) with a loader worker each, as on a two-GPU node: the ranks agree on a step, rank 0
    # writes the checkpoint, and no worker's death is raised inside it. torchrun reports the signal itself.
    run = tmp_path / "run"
    proc = start(["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29541", "-m", "cellseg",
                  "-q", "train", str(REPO / "configs" / "smoke" / "unet_3d.yaml"), f"data.root={tiny_synth_root}",
                  f"run_dir={run}", "train.max_steps=100000", "train.log_every=2", "train.val_every=100000",
                  "train.batch_size=1", "loader.num_workers=1", "loader.samples_per_epoch=16"], log=tmp_path / "log")
    wait_for(lambda: len(losses(run)) >= 2, proc=proc, timeout=240)
    os.killpg(proc.pid, signal.SIGTERM)
    finish(proc)
    text = (tmp_path / "log").read_text()
    step = load(run / "checkpoints" / "last.pt")["step"]
    assert step == max(losses(run)) and step % 2 == 0
    assert f"stopped early at step {step} on SIGTERM" in text
    assert "exited unexpectedly" not in text and "killed by signal" not in text
    assert not (run / "result.json").exists() and not (run / "train.lock").exists()
