"""CUDA MPS (Multi-Process Service) for the jobs that share a GPU.

Without it the GPU time-slices between processes: one process's kernels run at a time, and a job whose step leaves
gaps (a small 2D kernel, a 3D job at batch 2, the host work between steps) leaves the GPU idle for its slice. Under
MPS the kernels of every client run on the GPU at once. `mps_daemon` starts NVIDIA's control daemon for this user
only, with its pipe and log folders under the benchmark's work folder (no root, no compute-mode change, nothing
outside that folder touched), yields the environment that makes a CUDA process its client, and quits the daemon
afterwards (it exits once its clients have).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"  # ships with the NVIDIA driver
QUIT_TIMEOUT_S = 30.0  # the daemon waits for its server, which waits for its clients
CLIENT_MARK = "new client"  # control.log's line for each client process that connects (any case)


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
def mps_daemon(folder: Path) -> Iterator[dict[str, str]]:
    """Run the MPS control daemon (pipe and log under `folder`) while the block runs; yields `client_env`.

    Raises:
        ValueError: no control binary, or the daemon did not start (its message and log folder say why).
    """
    binary, env = control_binary(), client_env(folder)
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    full = {**os.environ, **env}
    _quit(binary, full)  # one left by a step that was killed: its clients are gone with that step
    started = subprocess.run([binary, "-d"], env=full, capture_output=True, text=True, check=False)
    if started.returncode != 0:
        raise ValueError(f"--mps: {CONTROL} -d failed (exit {started.returncode}): "
                         f"{(started.stderr or started.stdout).strip()} (log: {env['CUDA_MPS_LOG_DIRECTORY']})")
    try:
        yield env
    finally:
        _quit(binary, full)


def _quit(binary: str, env: dict[str, str]) -> None:
    """Ask a running daemon of these folders to quit and wait until its pipe is gone; nothing when none runs."""
    pipe = Path(env["CUDA_MPS_PIPE_DIRECTORY"]) / "control"
    if not pipe.exists():
        return
    try:
        asked = subprocess.run([binary], input="quit\n", env=env, capture_output=True, text=True,
                               timeout=QUIT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return
    if asked.returncode != 0:  # no daemon behind the pipe (the control program found none to talk to)
        return
    deadline = time.monotonic() + QUIT_TIMEOUT_S
    while pipe.exists() and time.monotonic() < deadline:
        time.sleep(0.5)


def clients_served(folder: Path) -> int:
    """How many client connections the daemon's log records (0 before any or without a log): the evidence that
    the jobs ran under MPS."""
    log = Path(client_env(folder)["CUDA_MPS_LOG_DIRECTORY"]) / "control.log"
    return sum(CLIENT_MARK in line.lower() for line in log.read_text(errors="replace").splitlines()) if log.is_file() else 0
