"""`Trainer.fit()`: one architecture, one job. Reads top to bottom: batches → step → log/validate/checkpoint.

Setup (`cellseg.train.setup`) builds the run directory, model, data, optimizer and hardware wrapping;
this file is the loop. A step consumes `grad_accum_steps` loader batches, augments each on the GPU
(deterministically from the step), splits them into micro-batches (smaller after an OOM), and runs forward
under autocast and backward without DDP synchronisation except on the last micro-step.

Nothing non-finite is kept (`train.nonfinite`, `cellseg.train.guard`): a NaN or infinite loss or gradient
stops training with an error naming the step, or skips the step's update, and no checkpoint is written with
non-finite weights. A stop signal (`cellseg.train.stop`) ends the run at the current step with a checkpoint
and `TrainingStopped`; no `result.json` is written then.

A cold one-GPU job whose model compiles in a child process (`cellseg.train.background`) trains eagerly until the
child is done, then switches to the compiled model before its next step (`cellseg.train.compile_swap`).

With `train.time_budget_min` the run also stops when its training clock (`cellseg.train.clock`: compilation,
set-up, validation and checkpoints not charged) reaches the budget, with a final validation and checkpoint;
`train.val_every_min` validates at fixed clock times (`cellseg.train.schedule`). Every metrics.jsonl record
carries `train_min` (that clock) and `job_min` (wall-clock minutes since this job started, set-up included).

The concerns around the loop are small collaborators: `schedule` (when to log, validate, checkpoint, end),
`clock` (the training clock), `stop` (signals), `log_window` (metrics.jsonl), `validation_hook`,
`checkpointing`, `compile_swap` and `perf.step_profiler` (`train.profile_steps`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import torch

from cellseg import runtime
from cellseg.config.schema import RunConfig
from cellseg.runtime.checkpoint import save_atomic_text
from cellseg.runtime.gpu_memory import free_memory
from cellseg.train.batch import shrink
from cellseg.train.batch_stream import Batch, start_batches, to_device
from cellseg.train.checkpointing import Checkpointer
from cellseg.train.clock import off_the_clock, share
from cellseg.train.compile_swap import CompileSwap
from cellseg.train.guard import NonFiniteGuard
from cellseg.train.log_window import LogWindow, record_startup
from cellseg.train.perf import step_profiler
from cellseg.train.run_checkpoints import set_rng_state
from cellseg.train.run_log import RunLog
from cellseg.train.schedule import Schedule, stop_agreed
from cellseg.train.setup import Setup, build_setup
from cellseg.train.stop import StopRequest, TrainingStopped
from cellseg.train.validate import validation_sets
from cellseg.train.validation_hook import ValidationHook

log = logging.getLogger(__name__)


class Trainer:
    """Train `cfg.model` on `cfg.data` into `cfg.run_dir`.

    Example:
        >>> from cellseg.config import load_run_config
        >>> Trainer(load_run_config("configs/smoke/unet_3d.yaml", ["data.root=/tmp/synth"])).fit()
    """

    def __init__(self, cfg: RunConfig, *, resume: bool | str = False, stop: StopRequest | None = None,
                 now: Callable[[], float] | None = None):
        self.cfg = cfg
        self.stop = stop  # installed by `train` before set-up; `fit` makes its own otherwise
        self._job_start = time.perf_counter()
        self._started: Iterator[Batch] | None = None  # the batch stream begun during set-up (`_start_early`)
        try:
            early = self._start_early if stop is not None else None
            self.s: Setup = build_setup(cfg, resume=resume, before_compile=early)
        except BaseException:
            self._close_started()
            raise
        try:
            validation_sets(self.s.data.val_crops)  # no tuning crop to rank checkpoints on: an error now, not later
        except ValueError:
            self._close_started()
            self.s.close()
            raise
        if now is not None:  # another time source for the training clock (tests)
            self.s.clock.now = now
        self.guard = NonFiniteGuard(cfg.train, self.s.dist, fp16_scaler=self.s.scaler.is_enabled())
        self.checkpoints = Checkpointer(self.s, self.guard)
        self.validation = ValidationHook(self.s, self.guard)  # its workers: `fit`'s, from its first validation
        self.compile_swap = CompileSwap(self.s)

    def close(self) -> None:
        """End the loader and validation workers, if any, and release the run directory (its lock)."""
        self.validation.close()
        self._close_started()
        self.s.close()

    def _close_started(self) -> None:
        started, self._started = self._started, None
        if started is not None:
            started.close()  # its DataLoader iterator goes with it, and with that its workers

    # -- data -------------------------------------------------------------------------------------------
    def _start_early(self, s: Setup) -> None:
        """Set-up's hook before compilation: the loader's workers start now and import while the model compiles
        (a 2D job's first batch waited 7-8 s for them after compilation on the GPU host)."""
        assert self.stop is not None
        self._started = start_batches(s, self.stop)

    def batch_stream(self, stop: StopRequest) -> Iterator[Batch]:
        """Loader batches from where the run stands: the stream begun during set-up, else one begun now."""
        started, self._started = self._started, None
        return started or start_batches(self.s, stop)

    def _to_device(self, batch: Batch) -> Batch:
        return to_device(batch, self.s.dist.device)

    # -- one optimizer step ---------------------------------------------------------------------------------
    def _micro_steps(self, batches: list[Batch]) -> torch.Tensor:
        s, step = self.s, self.s.state.step
        chunks = []
        for a, batch in enumerate(batches):
            image, target, known = s.data.augment(self._to_device(batch), step * len(batches) + a)
            for i in range(0, image.shape[0], s.state.micro_batch):
                part = slice(i, i + s.state.micro_batch)
                chunks.append((image[part].contiguous(memory_format=s.memory_format), target[part], known[part]))
        total = sum(c[0].shape[0] for c in chunks)
        loss_sum = torch.zeros((), device=s.dist.device)
        for i, (image, target, known) in enumerate(chunks):
            with runtime.no_sync(s.net, skip=i < len(chunks) - 1), runtime.autocast(s.dist.device, s.precision):
                loss = s.criterion(s.net(image), target, known) * (image.shape[0] / total)
            s.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        return loss_sum

    def train_step(self, batches: list[Batch]) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward/backward over the step's micro-batches (with OOM back-off), then the optimizer update
        (dropped when `train.nonfinite` is "skip" and the loss or gradients are not finite)."""
        s = self.s
        while True:
            try:
                loss = self._micro_steps(batches)
                break
            except torch.OutOfMemoryError:
                s.optimizer.zero_grad(set_to_none=True)
                free_memory()
                smaller = shrink(s.state.micro_batch)
                if smaller == s.state.micro_batch or s.dist.distributed:
                    s.persist_micro_batch(smaller)  # an elastic restart resumes with it
                    raise
                log.warning("out of memory at micro-batch %d: continuing with %d (effective batch unchanged)",
                            s.state.micro_batch, smaller)
                s.state.micro_batch = smaller
        s.scaler.unscale_(s.optimizer)
        clip = self.cfg.optim.grad_clip_norm
        params = [p for p in s.net.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip else float("inf"))
        if self.guard.update_ok(loss, grad_norm, step=s.state.step + 1):
            s.scaler.step(s.optimizer)
            if s.ema is not None:
                s.ema.update(runtime.unwrap(s.net))
        s.scaler.update()  # after a skipped step too: it ends the scaler's step (and lowers an fp16 scale)
        s.scheduler.step()  # a skipped step still counts: the schedule and the sample stream stay functions of it
        s.optimizer.zero_grad(set_to_none=True)
        s.state.step += 1
        return loss, grad_norm

    # -- the loop ---------------------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train to `train.max_steps` or to the end of `train.time_budget_min`; returns the last logged values.

        Raises:
            TrainingStopped: a stop signal ended the run early; `last.pt` holds it at the current step.
            NonFiniteError: the loss or gradients became NaN or infinite (`train.nonfinite`).
        """
        s, tc, clock, plan = self.s, self.cfg.train, self.s.clock, Schedule(self.cfg.train)
        last: dict[str, Any] = {}
        with contextlib.ExitStack() as ends:  # in reverse on every way out: the end, an error, a stop signal
            run_log = ends.enter_context(contextlib.closing(self._run_log()))
            stop = self.stop or StopRequest()
            ends.callback(stop.release_workers if self.stop is not None else stop.restore)
            batches = ends.enter_context(contextlib.closing(self.batch_stream(stop)))
            self.validation.open(stop)
            ends.callback(self.validation.close)
            window = LogWindow(s.dist.device)
            profile_step = ends.enter_context(step_profiler(tc.profile_steps, s.run_dir, s.dist.device,
                                                            enabled=s.dist.is_main))
            while plan.more(s.state.step, clock.shared_s):
                if stop_agreed(stop, s.dist, step=s.state.step, every=tc.log_every):
                    self._stop(stop, run_log)
                self.compile_swap.poll(run_log)
                grad_norm = self._step(batches, stop, run_log, window)
                profile_step()
                step, before = s.state.step, clock.shared_s
                share(clock, s.dist, step=step, every=tc.log_every)
                due = plan.after(step, before, clock.shared_s)
                if due.log:
                    last = window.record(run_log, s, self.guard, grad_norm)
                    self.compile_swap.release_workers()
                if due.validate:
                    last["val"] = self._validate(run_log)
                elif due.checkpoint:
                    with off_the_clock(clock, s.dist.device):
                        self.checkpoints.save()
        return last

    def _step(self, batches: Iterator[Batch], stop: StopRequest, run_log: RunLog, window: LogWindow) -> torch.Tensor:
        """One optimizer step on the next loader batches, counted in `window`, and its gradient norm; the job's
        first step records the start-up and starts the training clock (compilation and set-up are not charged)."""
        s = self.s
        first, fetch_start = not s.clock.running, time.perf_counter()
        step_batches = self._next_batches(batches, stop, run_log)
        step_start = time.perf_counter()
        loss, grad_norm = self.train_step(step_batches)
        if first:
            record_startup(run_log, s, batch_s=step_start - fetch_start, step_start=step_start,
                           job_start=self._job_start)
        s.clock.start()
        window.add(loss, kept=self.guard.last_ok, wait_s=0.0 if first else step_start - fetch_start)
        return grad_norm

    def finish_compile(self, run_log: RunLog | None = None) -> None:
        """Train compiled from the next step, the background compile having ended (`cellseg.train.compile_swap`)."""
        self.compile_swap.finish(run_log)

    def _validate(self, run_log: RunLog) -> dict[str, Any]:
        """Score the validation crops (`cellseg.train.validation_hook`) and offer the checkpoint for `best.pt` by
        the ranking score, off the training clock; checkpoints/ranking.json records which score ranked."""
        with off_the_clock(self.s.clock, self.s.dist.device):
            result = self.validation.run(run_log)
            self.checkpoints.save(score=result.get("ranking_score"))
            self.checkpoints.save_ranking(result)
        return result

    def _run_log(self) -> RunLog:
        s, tc = self.s, self.cfg.train
        return RunLog(s.run_dir, enabled=s.dist.is_main, start_step=s.state.step, stamp=self._stamp,
                      total_steps=tc.max_steps if tc.time_budget_min is None else None)  # a budget: steps unknown

    def _stamp(self) -> dict[str, float]:
        """Minutes stamped on every metrics.jsonl record: the training clock, and wall time since the job began."""
        return {"train_min": round(self.s.clock.seconds() / 60, 4),
                "job_min": round((time.perf_counter() - self._job_start) / 60, 4)}

    def _next_batches(self, batches: Iterator[Batch], stop: StopRequest, run_log: RunLog) -> list[Batch]:
        """The step's loader batches; a loader whose workers died of a stop signal ends the run here, before
        the step changes anything."""
        try:
            return [next(batches) for _ in range(self.cfg.train.grad_accum_steps)]
        except RuntimeError:
            if not stop.requested or self.s.dist.distributed:
                raise
            log.warning("the loader's workers ended with the %s", stop.signal_name)
            self._stop(stop, run_log)

    def _stop(self, stop: StopRequest, run_log: RunLog) -> NoReturn:
        """Checkpoint the current step and raise `TrainingStopped`."""
        path = self.checkpoints.save()
        step = self.s.state.step
        run_log.record(step, {"signal": stop.signal_name, "checkpoint": str(path)}, prefix="stopped")
        log.warning("stopped at step %d on %s; checkpoint %s written: resume with --resume", step,
                    stop.signal_name, path)
        raise TrainingStopped(step=step, signal_name=str(stop.signal_name), checkpoint=str(path))


def train(cfg: RunConfig, *, resume: bool | str = False, stop: StopRequest | None = None) -> dict[str, Any]:
    """Build a `Trainer` and run it; writes `result.json` only when training reached `train.max_steps` or the end
    of `train.time_budget_min`.

    Stop signals are caught from here on (or from where the caller made `stop`, who then restores the
    handlers); the run directory is released and the process group torn down afterwards, whatever happened.

    Raises:
        TrainingStopped: stopped early on a signal (resumable; `cellseg train` exits with 75 then).
        NonFiniteError: the loss or gradients became NaN or infinite (`train.nonfinite`).
    """
    own = stop is None
    stop = stop or StopRequest()
    trainer = None
    try:
        trainer = Trainer(cfg, resume=resume, stop=stop)
        result = trainer.fit()
        result.setdefault("skipped_crops", trainer.s.meta["skipped_crops"])  # the crops the set-up could not use
        if trainer.s.dist.is_main:
            save_atomic_text(json.dumps(result, indent=1, default=str), trainer.s.run_dir / "result.json")
        return result
    finally:
        if trainer is not None:
            trainer.close()
        if own:
            stop.restore()
        runtime.shutdown_distributed()


__all__ = ["Trainer", "TrainingStopped", "set_rng_state", "train"]
