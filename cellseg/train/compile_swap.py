"""The switch to the compiled model, and the end of compiling, as the training loop sees them.

A cold one-GPU job whose model compiles in a child process (`cellseg.train.background`) trains eagerly until the
child is done; before the next step the job compiles the model and the loss itself from the cache the child
filled, decides as `train.compile` says, and trains with that from then on (`CompileSwap.finish`, off the
training clock). Once a step has run as the job will train, nothing compiles again: inductor's idle
compile-worker pool is shut down (`CompileSwap.release_workers`).
"""

from __future__ import annotations

import json
import logging
import time

import torch

from cellseg.runtime.checkpoint import save_atomic_text
from cellseg.runtime.compile import release_compile_workers
from cellseg.train.clock import off_the_clock
from cellseg.train.run_log import RunLog
from cellseg.train.setup import Setup

log = logging.getLogger(__name__)
SWITCH_KEYS = ("compiled", "background_s", "switch_s", "background_error")  # the "compile" record of metrics.jsonl


class CompileSwap:
    """Watches the background compile of `s` for the loop (module docstring)."""

    def __init__(self, s: Setup) -> None:
        self.s = s
        self.workers_released = False

    def poll(self, run_log: RunLog) -> None:
        """Switch to the compiled model now if the background compile has ended (a non-blocking check)."""
        if self.s.background is not None and self.s.background.done():
            self.finish(run_log)

    def finish(self, run_log: RunLog | None = None) -> None:
        """Train compiled from the next step, waiting for the background compile if it still runs; the pause to
        load the compiled graphs is not charged to the training clock."""
        with off_the_clock(self.s.clock, self.s.dist.device):
            _switch(self.s)
        if run_log is not None:
            record = {k: self.s.meta["compile"].get(k) for k in SWITCH_KEYS}
            run_log.record(self.s.state.step, record, prefix="compile")

    def release_workers(self) -> None:
        """Once a step has run as the job will train (no background compile pending), shut inductor's idle
        compile-worker pool down (`cellseg.runtime.compile.release_compile_workers`); at most once."""
        if self.workers_released or self.s.background is not None:
            return
        self.workers_released = True
        if release_compile_workers():
            log.info("step %d: compilation done, inductor's compile workers shut down", self.s.state.step)


def _switch(s: Setup) -> None:
    """Once the background compile has ended: compile here from the cache it filled (or, if it failed, from
    scratch) and train compiled from now on. The random generators are left as they were."""
    job, s.background = s.background, None
    assert job is not None
    job.wait()
    failure = job.failure()
    if failure:
        log.warning("the background compile failed (%s; %s): compiling here", failure, job.log_path)
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[s.dist.device]):
        s.compile_now()
    pause = time.perf_counter() - start
    s.meta["compile"].update(background=True, background_s=round(job.seconds or 0.0, 1),
                             background_error=failure, switch_step=s.state.step, switch_s=round(pause, 1))
    log.info("step %d: the background compile took %.1f s; %s model and %s loss from here (%.1f s to load)",
             s.state.step, job.seconds, "compiled" if s.meta["compile"]["compiled"] else "eager",
             "compiled" if s.meta["compile_loss"]["compiled"] else "eager", pause)
    if s.dist.is_main:
        save_atomic_text(json.dumps(s.meta, indent=1, default=str), s.run_dir / "meta.json")
