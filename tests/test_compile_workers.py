"""`release_compile_workers`: inductor's compile-worker pool, started as a compile starts it, is shut down and its
process ends; with no pool it does nothing; a compile afterwards starts a new pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs in a process of its own (the pool is per process): starts the pool as a compile does (its process is the
# pool's `process`, a Popen), releases it, then does both once more; prints what it saw.
SCRIPT = textwrap.dedent("""
    import json
    from cellseg.runtime.compile import release_compile_workers

    before_any = release_compile_workers()
    import torch._inductor.async_compile as async_compile
    first = async_compile.AsyncCompile.process_pool().process  # what inductor does before its first kernels
    released = release_compile_workers()  # waits for the pool's process to end
    twice = release_compile_workers()
    second = async_compile.AsyncCompile.process_pool().process  # a later compile
    print(json.dumps({"before_any": before_any, "released": released, "first_ended": first.poll() is not None,
                      "twice": twice, "new_pool": second.pid != first.pid and second.poll() is None,
                      "released_again": release_compile_workers(), "second_ended": second.poll() is not None}))
""")


def test_release_compile_workers_ends_the_pool_process() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "TORCHINDUCTOR_COMPILE_THREADS": "2"}  # a pool even on a one-core runner
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["before_any"] is False  # nothing compiled yet: nothing to release
    assert result["released"] is True and result["first_ended"] is True
    assert result["twice"] is False  # released once: nothing left to release
    assert result["new_pool"] is True  # a later compile starts a new pool
    assert result["released_again"] is True and result["second_ended"] is True
