"""`release_compile_workers`: inductor's compile-worker pool, started as a compile starts it, is shut down and its
processes end; with no pool it does nothing; a compile afterwards starts a new pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs in a process of its own (the pool is per process): starts the pool as a compile does, then releases it;
# then starts and releases it once more; prints the pool processes seen and what each release returned.
SCRIPT = textwrap.dedent("""
    import json, os, time
    from cellseg.runtime.compile import release_compile_workers

    def pool_pids():
        pids = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().decode(errors="replace")
            except OSError:  # ended meanwhile
                continue
            if "_inductor/compile_worker" in cmd and f"--parent={os.getpid()}" in cmd:  # the pool of this process
                pids.append(int(pid))
        return pids

    def wait(predicate, timeout_s=60.0):
        end = time.monotonic() + timeout_s
        while not predicate() and time.monotonic() < end:
            time.sleep(0.1)

    before_any = release_compile_workers()
    import torch._inductor.async_compile as async_compile
    async_compile.AsyncCompile.process_pool()  # what inductor does when it compiles its first kernels
    wait(pool_pids)
    started = pool_pids()
    released = release_compile_workers()
    left = pool_pids()  # the release waits for the pool's process to end
    twice = release_compile_workers()
    async_compile.AsyncCompile.process_pool()  # a later compile
    wait(pool_pids)
    restarted = pool_pids()
    print(json.dumps({"before_any": before_any, "started": started, "released": released, "left": left,
                      "twice": twice, "restarted": restarted, "released_again": release_compile_workers(),
                      "left_again": pool_pids()}))
""")


def test_release_compile_workers_ends_the_pool_processes() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "TORCHINDUCTOR_COMPILE_THREADS": "2"}  # a pool even on a one-core runner
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["before_any"] is False  # nothing compiled yet: nothing to release
    assert result["started"], "the compile-worker pool did not start"
    assert result["released"] is True
    assert result["left"] == []
    assert result["twice"] is False  # released once: nothing left to release
    assert result["restarted"] and not set(result["restarted"]) & set(result["started"])  # a new pool
    assert result["released_again"] is True and result["left_again"] == []
