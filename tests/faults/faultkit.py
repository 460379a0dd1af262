"""Fault injection for the fault suite: tiny CPU training runs, `cellseg` in its own process group (so that a
SIGTERM can go to the whole group, loader workers included, as SLURM and `timeout` send it), and a full disk.

A full disk is a small tmpfs mounted over a test folder where the container allows `mount` (root with
CAP_SYS_ADMIN); elsewhere it is simulated honestly with RLIMIT_FSIZE, under which a write past the limit
fails with EFBIG ("File too large") instead of ENOSPC: the same code paths, another errno.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from cellseg.config import RunConfig, load_run_config

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "configs" / "smoke" / "unet_3d.yaml"
# Deterministic, short, no validation before the end; the schedule is constant so that runs of different
# lengths (a resumed run and its reference) see the same learning rates.
COMMON = ("train.log_every=1", "train.val_every=1000", "optim.schedule=constant", "optim.warmup_steps=0")


def overrides(root: Path, run_dir: Path, *extra: str) -> list[str]:
    """`key=value` overrides of a tiny smoke run."""
    return [f"data.root={root}", f"run_dir={run_dir}", *COMMON, *extra]


def config(root: Path, run_dir: Path, *extra: str) -> RunConfig:
    """The smoke config of a tiny CPU run."""
    return load_run_config(SMOKE, overrides(root, run_dir, *extra))


def losses(run_dir: Path) -> dict[int, float]:
    """step → training loss from metrics.jsonl (the last record of a step wins)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["step"]: r["train"]["loss"] for r in records if "train" in r}


def env(**extra: str) -> dict[str, str]:
    """The environment of a `cellseg` subprocess: this checkout first on the path, one thread."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", **extra}


def start(args: list[str], *, log: Path, preexec: Callable[[], None] | None = None,
          extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `python ARGS` in a new session (its own process group); output goes to `log`."""
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, *args], stdout=out, stderr=subprocess.STDOUT,
                                env=env(**(extra_env or {})), start_new_session=True, preexec_fn=preexec, cwd=REPO)


def finish(proc: subprocess.Popen, *, timeout: float = 180) -> int:
    """Wait for `proc`; a run that does not end is killed (group-wide) and reported as a hang."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"pid {proc.pid} did not end within {timeout} s: it needed kill") from None


def wait_for(predicate: Callable[[], bool], *, timeout: float = 120, proc: subprocess.Popen | None = None) -> None:
    """Poll `predicate` until it holds (fails if `proc` ends first or time runs out)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"pid {proc.pid} ended early with status {proc.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.05)


# ------------------------------------------------------------------------------------------- a full disk


def try_mount_tmpfs(path: Path, size_kb: int) -> bool:
    """Mount a tmpfs of `size_kb` KiB at `path` (created); False where mounting is not permitted."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@contextlib.contextmanager
def small_disk(path: Path, size_kb: int) -> Iterator[Callable[[], None] | None]:
    """A folder `path` that fills up after about `size_kb` KiB.

    Yields None when it is a real tmpfs (ENOSPC), or a `preexec_fn` that sets RLIMIT_FSIZE in a subprocess
    (EFBIG) where mounting is not permitted.
    """
    if try_mount_tmpfs(path, size_kb):
        try:
            yield None
        finally:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)
        return
    limit = size_kb * 1024

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    yield preexec


@contextlib.contextmanager
def file_size_limit(limit_bytes: int) -> Iterator[None]:
    """Writes past `limit_bytes` fail with EFBIG in this process for the duration of the block."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def sigterm_driver(module: str, function: str, env_var: str, doc: str) -> str:
    """A script running `cellseg ARGS` that sends SIGTERM to its own process group when `module.function` is
    called for the Nth time (N from the environment variable `env_var`), then lets the call proceed."""
    return f'''"""`cellseg ARGS`, sending SIGTERM to its own process group {doc}."""
import os, signal, sys


def main():
    import {module} as target
    from cellseg.cli import main as cli

    real, count = target.{function}, [0]

    def wrapped(*args, **kwargs):
        count[0] += 1
        if count[0] == int(os.environ["{env_var}"]):
            os.killpg(os.getpgid(0), signal.SIGTERM)
        return real(*args, **kwargs)

    target.{function} = wrapped
    return cli(sys.argv[1:])


if __name__ == "__main__":  # spawned workers import this file without running it
    sys.exit(main())
'''
