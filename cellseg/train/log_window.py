"""What the loop writes to metrics.jsonl: each logging window's means, and where the time before the first step
went.

A logging window is the steps since the last "train" record: their mean loss (a step whose update was skipped
for a NaN stays out of it, counted apart by `cellseg.train.guard`), throughput in samples and voxels per
second, `data_wait_frac` (the share of the window's host time spent waiting for the loader's next batch: near 0
the GPU step or the host's own work bounds training, near 1 the loader does) and, on a GPU with a measured
matmul peak, TFLOP/s per GPU and MFU (`cellseg.train.perf`). The "startup" record splits the time to the first
step into the set-up's phases (`cellseg.train.setup.Phases`), the first batch and the first step.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from cellseg import runtime
from cellseg.train.guard import NonFiniteGuard
from cellseg.train.run_log import LOOP_LOGGER, RunLog, process_age_s
from cellseg.train.setup import Setup

log = logging.getLogger(LOOP_LOGGER)


class LogWindow:
    """The steps of one logging window on `device` (module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.loss_sum = torch.zeros((), device=device)
        self.restart()

    def restart(self) -> None:
        """Begin a new window now."""
        self.start = time.perf_counter()
        self.steps = self.loss_steps = 0
        self.wait_s = 0.0  # host seconds of this window spent waiting for the loader's next batch
        self.loss_sum = torch.zeros_like(self.loss_sum)

    def add(self, loss: torch.Tensor, *, kept: bool, wait_s: float) -> None:
        """One step: its loss (left out unless `kept`: the step updated the weights) and its wait for batches."""
        if kept:
            self.loss_sum, self.loss_steps = self.loss_sum + loss, self.loss_steps + 1
        self.steps += 1
        self.wait_s += wait_s

    def record(self, run_log: RunLog, s: Setup, guard: NonFiniteGuard, grad_norm: torch.Tensor) -> dict[str, Any]:
        """Record the window's means (raising first if a step was not finite), advance the bar, begin anew."""
        seconds = time.perf_counter() - self.start
        loss = self.loss_sum / self.loss_steps if self.loss_steps else torch.full_like(self.loss_sum, float("nan"))
        guard.check()  # errors before a NaN is logged as if it were a loss
        loss_v = float(runtime.all_reduce_mean(loss, s.dist))
        samples = self.steps * s.batch_size * s.cfg.train.grad_accum_steps * s.dist.world_size
        values = {"loss": loss_v, "grad_norm": float(grad_norm), "lr": s.scheduler.get_last_lr()[0],
                  "samples_per_s": samples / seconds, "mvox_per_s": samples * s.voxels_per_sample / seconds / 1e6,
                  "data_wait_frac": self.wait_s / seconds, "micro_batch": s.state.micro_batch, **guard.counts()}
        if s.peak_tflops:
            per_gpu = values["samples_per_s"] / s.dist.world_size * s.flops_per_sample / 1e12
            values.update(tflops_per_gpu=per_gpu, mfu=per_gpu / s.peak_tflops,
                          gpu_mem_gb=torch.cuda.max_memory_allocated(s.dist.device) / 1e9)
        run_log.record(s.state.step, values)
        post = {"loss": f"{loss_v:.4f}", "samples/s": f"{values['samples_per_s']:.1f}",
                "data wait": f"{100 * values['data_wait_frac']:.0f}%"}
        if "mfu" in values:
            post["MFU"] = f"{100 * values['mfu']:.1f}%"
        run_log.advance(self.steps, post)
        self.restart()
        return values


def record_startup(run_log: RunLog, s: Setup, *, batch_s: float, step_start: float, job_start: float) -> None:
    """Where the time before the first optimizer step went (metrics.jsonl record "startup", and the log): the
    set-up's phases, the first batch (`batch_s`), the first step (lazy compilation), from `step_start`;
    `job_start` is when the trainer began (a `time.perf_counter` reading)."""
    if s.dist.device.type == "cuda":
        torch.cuda.synchronize(s.dist.device)
    now = time.perf_counter()
    values = {"setup": dict(s.startup_s), "first_batch": round(batch_s, 3),
              "first_step": round(now - step_start, 3), "job_to_first_step": round(now - job_start, 3),
              "process_to_first_step": process_age_s()}
    run_log.record(s.state.step, values, prefix="startup")
    parts = ", ".join(f"{k} {v:.1f}" for k, v in s.startup_s.items())
    total = values["process_to_first_step"] or values["job_to_first_step"]
    log.info("first step %.1f s after the start (set-up: %s; first batch %.1f; first step %.1f s)", total, parts,
             batch_s, values["first_step"])
