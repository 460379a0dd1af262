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
child is done, then switches to the compiled model before its next step (`finish_compile`, off the clock).

With `train.time_budget_min` the run also stops when its training clock (`cellseg.train.clock`: compilation,
set-up, validation and checkpoints not charged) reaches the budget, with a final validation and checkpoint;
`train.val_every_min` validates at fixed clock times. Every metrics.jsonl record carries `train_min` (that
clock) and `job_min` (wall-clock minutes since this job started, set-up included).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import torch

from cellseg import runtime
from cellseg.config.schema import RunConfig
from cellseg.runtime.checkpoint import save_atomic_text
from cellseg.runtime.compile import release_compile_workers
from cellseg.train.batch import free_memory, shrink
from cellseg.train.checkpoint import rng_state, set_rng_state
from cellseg.train.clock import crossed
from cellseg.train.guard import NonFiniteGuard
from cellseg.train.logs import RunLog, process_age_s
from cellseg.train.setup import Setup, build_setup
from cellseg.train.stop import StopRequest, TrainingStopped
from cellseg.train.validate import run_validation, validation_sets, validation_workers
from cellseg.train.valpool import ValidationPool

log = logging.getLogger(__name__)
Batch = dict[str, Any]
RANKING_FILE = "ranking.json"  # beside index.json: which score (and crops) its numbers are


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
        self._started: Iterator[Batch] | None = None  # the batch stream begun during set-up (`_start_batches`)
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
        # A run resumed from last.pt has its current step on disk: stopping before a step must not rewrite it.
        resumed = self.s.resumed_from
        self._compile_done = False  # set once the model trains as it will: `_release_compile_workers`
        self._saved_step = self.s.state.step if resumed is not None and resumed.name == "last.pt" else -1
        self.val_pool: ValidationPool | None = None  # the validation workers of `fit` (started at its first validation)

    def close(self) -> None:
        """End the loader and validation workers, if any, and release the run directory (its lock)."""
        self._close_val_pool()
        self._close_started()
        self.s.close()

    def _close_started(self) -> None:
        started, self._started = self._started, None
        if started is not None:
            started.close()  # its DataLoader iterator goes with it, and with that its workers

    def _close_val_pool(self) -> None:
        pool, self.val_pool = self.val_pool, None
        if pool is not None:
            pool.close()

    # -- data -------------------------------------------------------------------------------------------
    def _start_early(self, s: Setup) -> None:
        """Set-up's hook before compilation: the loader's workers start now and import while the model compiles
        (a 2D job's first batch waited 7-8 s for them after compilation on the GPU host)."""
        assert self.stop is not None
        self._started = self._start_batches(s, self.stop)

    def batch_stream(self, stop: StopRequest) -> Iterator[Batch]:
        """Loader batches from where the run stands: the stream begun during set-up, else one begun now."""
        started, self._started = self._started, None
        return started or self._start_batches(self.s, stop)

    def _start_batches(self, s: Setup, stop: StopRequest) -> Iterator[Batch]:
        """Loader batches from where the run stands (the sample stream is a pure function of the index); the
        first epoch's workers start here, not at the first batch."""
        sampler, loader = s.data.sampler, s.data.loader
        loader.worker_init_fn = stop.worker_init_fn
        epoch, offset = divmod(s.state.step * self.cfg.train.grad_accum_steps, sampler.batches_per_epoch)
        sampler.set_epoch(epoch, start_batch=offset)
        with stop.shield_workers():  # workers start here (and every epoch if not persistent)
            first = iter(loader)
        return self._epochs(first, epoch, stop)

    def _epochs(self, batches: Iterator[Batch], epoch: int, stop: StopRequest) -> Iterator[Batch]:
        sampler, loader = self.s.data.sampler, self.s.data.loader
        while True:
            yield from batches
            epoch += 1
            sampler.set_epoch(epoch, start_batch=0)
            with stop.shield_workers():
                batches = iter(loader)

    def _to_device(self, batch: Batch) -> Batch:
        return {k: v.to(self.s.dist.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}

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
        s, tc, clock = self.s, self.cfg.train, self.s.clock
        budget_s = 60.0 * tc.time_budget_min if tc.time_budget_min is not None else math.inf
        val_every_s = 60.0 * tc.val_every_min if tc.val_every_min is not None else 0.0
        run_log = RunLog(s.run_dir, enabled=s.dist.is_main, start_step=s.state.step, stamp=self._stamp,
                         total_steps=tc.max_steps if tc.time_budget_min is None else None)  # a budget: steps unknown
        stop = self.stop or StopRequest()
        if s.dist.is_main and s.data.val_crops:  # the ranks that validate; workers start at the first validation
            self.val_pool = ValidationPool(validation_workers(self.cfg, s.data.val_crops),
                                           worker_init=stop.worker_init_fn, shield=stop.shield_workers)
        batches, last = self.batch_stream(stop), {}
        window_start, window_steps, loss_steps = time.perf_counter(), 0, 0
        wait_s = 0.0  # host seconds of this logging window spent waiting for the loader's next batch
        loss_sum = torch.zeros((), device=s.dist.device)
        try:
            with self._profiler() as prof:
                while s.state.step < tc.max_steps and clock.shared_s < budget_s:
                    if self._stop_requested(stop):
                        self._stop(stop, run_log)
                    if s.background is not None and s.background.done():
                        self.finish_compile(run_log)
                    first, fetch_start = not clock.running, time.perf_counter()  # running from the first step on
                    step_batches = self._next_batches(batches, stop, run_log)
                    step_start = time.perf_counter()
                    loss, grad_norm = self.train_step(step_batches)
                    if first:
                        self._record_startup(run_log, step_start - fetch_start, step_start)
                    else:
                        wait_s += step_start - fetch_start
                    clock.start()  # from the end of the job's first step: compilation and set-up are not charged
                    if self.guard.last_ok:  # a skipped step's NaN stays out of the logged mean (counted apart)
                        loss_sum, loss_steps = loss_sum + loss, loss_steps + 1
                    window_steps += 1
                    if prof is not None:
                        prof.step()
                    step, before = s.state.step, clock.shared_s
                    self._tick()
                    final = step == tc.max_steps or clock.shared_s >= budget_s
                    if step % tc.log_every == 0 or final:
                        mean = loss_sum / loss_steps if loss_steps else torch.full_like(loss_sum, float("nan"))
                        last = self._log(run_log, mean, grad_norm, window_steps, time.perf_counter() - window_start,
                                         wait_s=wait_s)
                        window_start, window_steps, loss_steps, wait_s = time.perf_counter(), 0, 0, 0.0
                        loss_sum = torch.zeros_like(loss_sum)
                        self._release_compile_workers()
                    if step % tc.val_every == 0 or final or crossed(before, clock.shared_s, val_every_s):
                        with self._off_the_clock():
                            last["val"] = self._validate(run_log)
                    elif step % tc.checkpoint_every == 0:
                        with self._off_the_clock():
                            self._checkpoint()
        finally:
            try:
                self._close_val_pool()  # on every way out: the end, an error, a stop signal
            finally:
                batches.close()
                stop.release_workers()
                if self.stop is None:
                    stop.restore()
                run_log.close()
        return last

    def finish_compile(self, run_log: RunLog | None = None) -> None:
        """Train compiled from the next step, the background compile having ended (`cellseg.train.background`);
        the pause to load the compiled graphs is not charged to the training clock."""
        with self._off_the_clock():
            self.s.finish_compile()
        if run_log is not None:
            keys = ("compiled", "background_s", "switch_s", "background_error")
            run_log.record(self.s.state.step, {k: self.s.meta["compile"].get(k) for k in keys}, prefix="compile")

    def _release_compile_workers(self) -> None:
        """Once a step has run as the job will train (no background compile pending), nothing compiles again:
        inductor's idle compile-worker pool is shut down (`cellseg.runtime.compile.release_compile_workers`)."""
        if self._compile_done or self.s.background is not None:
            return
        self._compile_done = True
        if release_compile_workers():
            log.info("step %d: compilation done, inductor's compile workers shut down", self.s.state.step)

    def _tick(self) -> None:
        """Refresh the clock value decisions read (`TrainClock.shared_s`): every step in a single process; under
        DDP the ranks' maximum every `log_every` steps (a collective and a host sync), so every rank sets the same
        learning rate and validates and stops at the same step."""
        clock = self.s.clock
        if not self.s.dist.distributed:
            clock.shared_s = clock.seconds()
            return
        if self.s.state.step % self.cfg.train.log_every:
            return
        seconds = torch.tensor(clock.seconds(), device=self.s.dist.device, dtype=torch.float64)
        torch.distributed.all_reduce(seconds, op=torch.distributed.ReduceOp.MAX)
        clock.shared_s = float(seconds.item())

    @contextlib.contextmanager
    def _off_the_clock(self) -> Iterator[None]:
        """Validation and checkpoints are not charged: the clock pauses once the queued GPU work is done."""
        if self.s.dist.device.type == "cuda":
            torch.cuda.synchronize(self.s.dist.device)
        with self.s.clock.paused():
            yield

    def _record_startup(self, run_log: RunLog, batch_s: float, step_start: float) -> None:
        """Where the time before the first optimizer step went (metrics.jsonl record "startup", and the log):
        the set-up's phases (`cellseg.train.setup.Phases`), the first batch, the first step (lazy compilation)."""
        if self.s.dist.device.type == "cuda":
            torch.cuda.synchronize(self.s.dist.device)
        now = time.perf_counter()
        values = {"setup": dict(self.s.startup_s), "first_batch": round(batch_s, 3),
                  "first_step": round(now - step_start, 3), "job_to_first_step": round(now - self._job_start, 3),
                  "process_to_first_step": process_age_s()}
        run_log.record(self.s.state.step, values, prefix="startup")
        parts = ", ".join(f"{k} {v:.1f}" for k, v in self.s.startup_s.items())
        total = values["process_to_first_step"] or values["job_to_first_step"]
        log.info("first step %.1f s after the start (set-up: %s; first batch %.1f; first step %.1f s)", total, parts,
                 batch_s, values["first_step"])

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
        path = self._checkpoint()
        step = self.s.state.step
        run_log.record(step, {"signal": stop.signal_name, "checkpoint": str(path)}, prefix="stopped")
        log.warning("stopped at step %d on %s; checkpoint %s written: resume with --resume", step,
                    stop.signal_name, path)
        raise TrainingStopped(step=step, signal_name=str(stop.signal_name), checkpoint=str(path))

    def _stop_requested(self, stop: StopRequest) -> bool:
        """Single process: the flag itself, no GPU involved. DDP: every rank must stop at the same step, which
        takes a collective and a host sync, so ranks agree only every `log_every` steps (a pre-emption
        warning leaves minutes, steps take well under a second)."""
        if not self.s.dist.distributed:
            return stop.requested
        if self.s.state.step % self.cfg.train.log_every:
            return False
        flag = torch.tensor(float(stop.requested), device=self.s.dist.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def _log(self, run_log: RunLog, loss: torch.Tensor, grad_norm: torch.Tensor, steps: int, seconds: float, *,
             wait_s: float) -> dict[str, Any]:
        """Record the window's means; `data_wait_frac` is the share of its host time spent waiting for batches
        (near 0: the GPU step or the host's own work bounds training; near 1: the loader does)."""
        s = self.s
        self.guard.check()  # errors before a NaN is logged as if it were a loss
        loss_v = float(runtime.all_reduce_mean(loss, s.dist))
        samples = steps * s.batch_size * self.cfg.train.grad_accum_steps * s.dist.world_size
        values = {"loss": loss_v, "grad_norm": float(grad_norm), "lr": s.scheduler.get_last_lr()[0],
                  "samples_per_s": samples / seconds, "mvox_per_s": samples * s.voxels_per_sample / seconds / 1e6,
                  "data_wait_frac": wait_s / seconds, "micro_batch": s.state.micro_batch, **self.guard.counts()}
        if s.peak_tflops:
            per_gpu = values["samples_per_s"] / s.dist.world_size * s.flops_per_sample / 1e12
            values.update(tflops_per_gpu=per_gpu, mfu=per_gpu / s.peak_tflops,
                          gpu_mem_gb=torch.cuda.max_memory_allocated(s.dist.device) / 1e9)
        run_log.record(s.state.step, values)
        post = {"loss": f"{loss_v:.4f}", "samples/s": f"{values['samples_per_s']:.1f}",
                "data wait": f"{100 * values['data_wait_frac']:.0f}%"}
        if "mfu" in values:
            post["MFU"] = f"{100 * values['mfu']:.1f}%"
        run_log.advance(steps, post)
        return values

    def _validate(self, run_log: RunLog) -> dict[str, Any]:
        """Score the validation crops and offer the checkpoint for `best.pt` by the ranking score (decision
        mode, tuning crops only: `cellseg.train.validate`); metrics.jsonl and checkpoints/ranking.json record
        which score ranked (the numbers of checkpoints/index.json)."""
        s, result = self.s, {}
        self.guard.check()
        if s.dist.is_main and s.data.val_crops:
            model = s.eval_model()
            result = run_validation(model, s.data.val_crops, self.cfg, device=s.dist.device, precision=s.precision,
                                    pool=self.val_pool)
            run_log.record(s.state.step, result, prefix="val")
            log.info("step %d validation (%s metric, %d tuning crops, %s grid, %.1f s): overall %.4f (%d skipped) | "
                     "ranked by %s %.4f | %s", s.state.step, result["metric"], len(result["crops"]["tuning"]),
                     result["grid"], result["seconds"], result["overall_score"], result["skipped_crops"],
                     result["ranked_by"], result["ranking_score"],
                     ", ".join(f"{k} {v:.3f}" for k, v in result["class_scores"].items()))
        runtime.barrier(s.dist)
        self._checkpoint(score=result.get("ranking_score"))
        if result:  # beside index.json (written by the checkpoint): which score its numbers are
            ranking = {"ranked_by": result["ranked_by"], "metric": result["metric"], "combined": "decision mode",
                       "crops": result["crops"]["tuning"], "grid": result["grid"], "note": result["ranking_note"]}
            save_atomic_text(json.dumps(ranking, indent=1), s.keeper.directory / RANKING_FILE)
        return result

    def _checkpoint(self, score: float | None = None) -> Path:
        """Write `last.pt` (and offer it for `best.pt` with a validation score); returns the path of `last.pt`."""
        s = self.s
        self.guard.check()
        path = s.keeper.directory / "last.pt"
        if s.dist.is_main and (self._saved_step != s.state.step or score is not None):
            state = s.state_dict(metric=score, rng=rng_state())
            path = s.keeper.save_last(state)
            if score is not None:
                s.keeper.offer(state, s.state.step, score)
        self._saved_step = s.state.step
        runtime.barrier(s.dist)
        return path

    @contextlib.contextmanager
    def _profiler(self) -> Iterator[torch.profiler.profile | None]:
        n = self.cfg.train.profile_steps
        if n <= 0 or not self.s.dist.is_main:
            yield None
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.s.dist.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        out = self.s.run_dir / "profile"
        schedule = torch.profiler.schedule(wait=2, warmup=2, active=n, repeat=1)
        with torch.profiler.profile(activities=activities, schedule=schedule, record_shapes=True,
                                    on_trace_ready=torch.profiler.tensorboard_trace_handler(str(out))) as prof:
            yield prof
        (out / "summary.txt").write_text(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30))


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
