"""CUDA MPS (Multi-Process Service) for the jobs that share a GPU.

Without it the GPU time-slices between processes: one process's kernels run at a time, and a job whose step leaves
gaps (a small 2D kernel, a 3D job at batch 2, the host work between steps) leaves the GPU idle for its slice. Under
MPS the kernels of every client run on the GPU at once. `mps_daemon` starts NVIDIA's control daemon for this user
only, with its pipe and log folders under the benchmark's work folder (no root, no compute-mode change, nothing
outside that folder touched), yields the environment that makes a CUDA process its client, and quits the daemon
afterwards (it exits once its clients have).

The daemon never outlives the step that started it, and a stale one never blocks the next step:
- SIGTERM (a step's time limit, `scancel`, `timeout`) to the step during the block unwinds it (`SystemExit`), so the
  jobs are stopped and the daemon is quit before the step ends;
- at set-up, a daemon of these folders left by a step killed outright (SIGKILL) is asked to quit; one that does not
  within `QUIT_TIMEOUT_S` (a server waiting for clients that are gone) is ended with SIGTERM, then SIGKILL. Only
  processes of this user whose environment names this pipe folder are touched (`owned_daemons`); then a stale
  pipe (the folder's files, with no daemon behind them) is removed, as a new daemon would refuse it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CONTROL = "nvidia-cuda-mps-control"  # ships with the NVIDIA driver
QUIT_TIMEOUT_S = 30.0  # the daemon waits for its server, which waits for its clients
CLIENT_MARK = "new client"  # control.log's line for each client process that connects (any case)
PROCESS_NAME = "nvidia-cuda-mps"  # /proc/PID/comm (15 characters) of the control daemon and of its server
KILL_WAIT_S = 10.0  # after SIGTERM, before SIGKILL


def control_binary() -> str:
    """The path of the control daemon.

    Raises:
        ValueError: not on PATH (no NVIDIA driver tools on this machine).
    """
    path = shutil.which(CONTROL)
    if path is None:
        raise ValueError(f"--mps: {CONTROL} is not on PATH (it ships with the NVIDIA driver); run without --mps")
    return path


def client_env(folder: Path) -> dict[str, str]:
    """The variables that make a CUDA process a client of the daemon whose folders are under `folder`."""
    return {"CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(folder / "log")}


@contextlib.contextmanager
def mps_daemon(folder: Path, *, quit_timeout_s: float = QUIT_TIMEOUT_S) -> Iterator[dict[str, str]]:
    """Run the MPS control daemon (pipe and log under `folder`) while the block runs; yields `client_env`.
    A daemon that does not quit within `quit_timeout_s` of being asked is ended (module docstring).

    Raises:
        ValueError: no control binary, or the daemon did not start (its message and log folder say why).
    """
    binary, env = control_binary(), client_env(folder)
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    full = {**os.environ, **env}
    stop_daemon(binary, full, quit_timeout_s)  # one left by a step that was killed: its clients are gone with it
    started = subprocess.run([binary, "-d"], env=full, capture_output=True, text=True, check=False)
    if started.returncode != 0:
        raise ValueError(f"--mps: {CONTROL} -d failed (exit {started.returncode}): "
                         f"{(started.stderr or started.stdout).strip()} (log: {env['CUDA_MPS_LOG_DIRECTORY']})")
    previous = _exit_on_sigterm()
    try:
        yield env
    finally:
        stop_daemon(binary, full, quit_timeout_s)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm() -> Any:
    """Turn SIGTERM into `SystemExit(143)` (128 + 15, the status of a SIGTERM) so that the block unwinds; the
    previous handler, or None where signals are not this thread's to set."""
    def on_sigterm(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        return signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread
        return None


def stop_daemon(binary: str, env: dict[str, str], quit_timeout_s: float = QUIT_TIMEOUT_S) -> None:
    """Quit the daemon of these folders (`_quit`); end the daemon processes this folder owns that did not quit
    (`owned_daemons`); remove a stale pipe left behind."""
    _quit(binary, env, quit_timeout_s)
    pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"])
    for pid in owned_daemons(pipe):
        _end(pid)
    if not owned_daemons(pipe):
        for entry in pipe.iterdir():  # the folder is this benchmark's: only its own daemon's files are there
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def owned_daemons(pipe: Path) -> list[int]:
    """The pids of this user's MPS control daemon and server processes whose environment names `pipe` as their
    pipe folder (Linux /proc; none elsewhere)."""
    wanted = f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode()
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if not (proc / "comm").read_text().startswith(PROCESS_NAME):
                continue
            if wanted in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return sorted(pids)


def _end(pid: int) -> None:
    """SIGTERM, then SIGKILL after `KILL_WAIT_S`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + KILL_WAIT_S
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _running(pid):
            return


def _running(pid: int) -> bool:
    """Whether `pid` runs (an exited process not yet reaped, a zombie, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _quit(binary: str, env: dict[str, str], timeout_s: float) -> None:
    """Ask a running daemon of these folders to quit and wait until its pipe is gone; nothing when none runs."""
    pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"]) / "control"
    if not pipe.exists():
        return
    try:
        asked = subprocess.run([binary], input="quit\n", env=env, capture_output=True, text=True,
                               timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return
    if asked.returncode != 0:  # no daemon behind the pipe (the control program found none to talk to)
        return
    deadline = time.monotonic() + timeout_s
    while pipe.exists() and time.monotonic() < deadline:
        time.sleep(0.5)


def clients_served(folder: Path) -> int:
    """How many client connections the daemon's log records (0 before any or without a log): the evidence that
    the jobs ran under MPS."""
    log = Path(client_env(folder)["CUDA_MPS_LOG_DIRECTORY"]) / "control.log"
    return sum(CLIENT_MARK in line.lower() for line in log.read_text(errors="replace").splitlines()) if log.is_file() else 0
