"""One training per run directory: a second one fails at once naming the holder; a dead holder's lock is taken
over with a warning."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultkit import SMOKE, config, dead_pid, env, finish, losses, overrides, start, wait_for

from cellseg.cli import main
from cellseg.train.lock import LOCK_FILE
from cellseg.train.stop import EXIT_RESUMABLE
from cellseg.train.trainer import train


def test_a_second_training_in_the_same_run_directory_fails_at_once(tiny_synth_root: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    first = start(["-m", "cellseg", "-q", "train", str(SMOKE), *overrides(tiny_synth_root, run),
                   "train.max_steps=100000"], log=tmp_path / "first.log")
    wait_for(lambda: len(losses(run)) >= 2, proc=first)
    began = time.monotonic()
    assert main(["train", str(SMOKE), *overrides(tiny_synth_root, run), "--resume", "auto"]) == 2
    assert time.monotonic() - began < 30  # at once: before any data is read
    err = capsys.readouterr().err
    assert f"is in use by another training (host {socket.gethostname()}, pid {first.pid}" in err
    os.killpg(first.pid, signal.SIGTERM)
    assert finish(first) == EXIT_RESUMABLE
    records = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
               if '"train"' in line]
    assert len(records) == len(set(records))  # every step once: the second training wrote nothing


def _lock(run: Path, **holder: object) -> Path:
    run.mkdir(parents=True)
    path = run / LOCK_FILE
    path.write_text(json.dumps({"started": "2026-01-01 00:00:00", **holder}))
    return path


def test_the_lock_of_a_dead_process_is_taken_over(tiny_synth_root: Path, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    run = tmp_path / "run"
    lock = _lock(run, host=socket.gethostname(), pid=dead_pid())
    train(config(tiny_synth_root, run, "train.max_steps=1"))
    assert "taking over the lock of a training that no longer runs" in caplog.text
    assert not lock.exists()  # released at the end


def test_a_holder_on_another_host_is_named_with_the_file_to_delete(tiny_synth_root: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    lock = _lock(run, host="gpu-node-17", pid=4242)
    with pytest.raises(FileExistsError, match=rf"host gpu-node-17, pid 4242.*delete {lock}"):
        train(config(tiny_synth_root, run, "train.max_steps=1"))
    assert lock.exists()  # not ours to remove


def test_a_requeued_job_takes_over_its_earlier_attempt(tiny_synth_root: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    _lock(run, host="gpu-node-17", pid=4242, SLURM_JOB_ID="977", SLURM_RESTART_COUNT=0)
    monkeypatch.setenv("SLURM_JOB_ID", "977")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # the same job, requeued (maybe onto another node)
    train(config(tiny_synth_root, run, "train.max_steps=1"))
    assert (run / "result.json").exists()


def test_a_script_without_a_main_guard_is_told_so_not_sent_to_the_lock(tiny_synth_root: Path, tmp_path: Path) -> None:
    """The loader's spawned workers import the parent's script again; one that starts training at its top level
    would start it once more in each of them, which first met the run directory's lock."""
    cfg = overrides(tiny_synth_root, tmp_path / "run", "train.max_steps=2", "data.resident=off",
                    "loader.num_workers=1")
    script = tmp_path / "no_guard.py"
    script.write_text("from cellseg.config import load_run_config\n"
                      "from cellseg.train.trainer import train\n"
                      f"train(load_run_config({str(SMOKE)!r}, {cfg!r}))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env(), timeout=300)
    assert done.returncode != 0
    assert 'put the code that starts training under `if __name__ == "__main__":`' in done.stderr
    assert "in use by another training" not in done.stderr
