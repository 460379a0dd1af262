"""The switch to the compiled model, and the end of compiling, as the training loop sees them.

A cold one-GPU job whose model compiles in a child process (`cellseg.train.background`) trains eagerly until the
child is done; before the next step the job compiles the model and the loss itself from the cache the child
filled, decides as `train.compile` says, and trains with that from then on (`CompileSwap.finish`, off the
training clock; `Setup.finish_compile`). Once a step has run as the job will train, nothing compiles again:
inductor's idle compile-worker pool is shut down (`CompileSwap.release_workers`).
"""

from __future__ import annotations

import logging

from cellseg.runtime.compile import release_compile_workers
from cellseg.train.clock import off_the_clock
from cellseg.train.run_log import LOOP_LOGGER, RunLog
from cellseg.train.setup import Setup

log = logging.getLogger(LOOP_LOGGER)
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
            self.s.finish_compile()
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

