"""`Trainer.fit()`: one architecture, one job. Reads top to bottom: batches → step → log/validate/checkpoint.

Setup (`cellseg.train.setup`) builds the run directory, model, data, optimizer and hardware wrapping;
this file is the loop. A step consumes `grad_accum_steps` loader batches, augments each on the GPU
(deterministically from the step), splits them into micro-batches (smaller after an OOM), and runs forward
under autocast and backward without DDP synchronisation except on the last micro-step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch

from cellseg import runtime
from cellseg.config.schema import RunConfig
from cellseg.train.batch import free_memory, shrink
from cellseg.train.checkpoint import rng_state, set_rng_state
from cellseg.train.logs import RunLog, StopRequest
from cellseg.train.setup import Setup, build_setup
from cellseg.train.validate import run_validation

log = logging.getLogger(__name__)
Batch = dict[str, Any]


class Trainer:
    """Train `cfg.model` on `cfg.data` into `cfg.run_dir`.

    Example:
        >>> from cellseg.config import load_run_config
        >>> Trainer(load_run_config("configs/smoke/unet_3d.yaml", ["data.root=/tmp/synth"])).fit()
    """

    def __init__(self, cfg: RunConfig, *, resume: bool | str = False):
        self.cfg = cfg
        self.s: Setup = build_setup(cfg, resume=resume)

    # -- data -------------------------------------------------------------------------------------------
    def _batches(self) -> Iterator[Batch]:
        """Loader batches from where the run stands (the sample stream is a pure function of the index)."""
        sampler = self.s.data.sampler
        epoch, offset = divmod(self.s.state.step * self.cfg.train.grad_accum_steps, sampler.batches_per_epoch)
        while True:
            sampler.set_epoch(epoch, start_batch=offset)
            yield from self.s.data.loader
            epoch, offset = epoch + 1, 0

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
        """Forward/backward over the step's micro-batches (with OOM back-off), then the optimizer update."""
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
        s.scaler.step(s.optimizer)
        s.scaler.update()
        s.scheduler.step()
        s.optimizer.zero_grad(set_to_none=True)
        if s.ema is not None:
            s.ema.update(runtime.unwrap(s.net))
        s.state.step += 1
        return loss, grad_norm

    # -- the loop ---------------------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train to `train.max_steps` (or until SIGTERM/SIGUSR1); returns the last logged values."""
        s, tc = self.s, self.cfg.train
        run_log = RunLog(s.run_dir, enabled=s.dist.is_main, total_steps=tc.max_steps, start_step=s.state.step)
        stop, batches, last = StopRequest(), self._batches(), {}
        window_start, window_steps, loss_sum = time.perf_counter(), 0, torch.zeros((), device=s.dist.device)
        try:
            with self._profiler() as prof:
                while s.state.step < tc.max_steps:
                    loss, grad_norm = self.train_step([next(batches) for _ in range(tc.grad_accum_steps)])
                    loss_sum += loss
                    window_steps += 1
                    if prof is not None:
                        prof.step()
                    step = s.state.step
                    if step % tc.log_every == 0 or step == tc.max_steps:
                        last = self._log(run_log, loss_sum / window_steps, grad_norm, window_steps,
                                         time.perf_counter() - window_start)
                        window_start, window_steps, loss_sum = time.perf_counter(), 0, loss_sum.zero_()
                    if step % tc.val_every == 0 or step == tc.max_steps:
                        last["val"] = self._validate(run_log)
                    elif step % tc.checkpoint_every == 0:
                        self._checkpoint()
                    if self._stop_requested(stop):
                        log.warning("stopping at step %d on request; checkpoint saved", step)
                        self._checkpoint()
                        break
        finally:
            stop.restore()
            run_log.close()
        return last

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

    def _log(self, run_log: RunLog, loss: torch.Tensor, grad_norm: torch.Tensor, steps: int, seconds: float
             ) -> dict[str, Any]:
        s = self.s
        loss_v = float(runtime.all_reduce_mean(loss, s.dist))
        samples = steps * s.batch_size * self.cfg.train.grad_accum_steps * s.dist.world_size
        values = {"loss": loss_v, "grad_norm": float(grad_norm), "lr": s.scheduler.get_last_lr()[0],
                  "samples_per_s": samples / seconds, "mvox_per_s": samples * s.voxels_per_sample / seconds / 1e6,
                  "micro_batch": s.state.micro_batch}
        if s.peak_tflops:
            per_gpu = values["samples_per_s"] / s.dist.world_size * s.flops_per_sample / 1e12
            values.update(tflops_per_gpu=per_gpu, mfu=per_gpu / s.peak_tflops,
                          gpu_mem_gb=torch.cuda.max_memory_allocated(s.dist.device) / 1e9)
        run_log.record(s.state.step, values)
        post = {"loss": f"{loss_v:.4f}", "samples/s": f"{values['samples_per_s']:.1f}"}
        if "mfu" in values:
            post["MFU"] = f"{100 * values['mfu']:.1f}%"
        run_log.advance(steps, post)
        return values

    def _validate(self, run_log: RunLog) -> dict[str, Any]:
        s, result = self.s, {}
        if s.dist.is_main and s.data.val_crops:
            model = s.eval_model()
            result = run_validation(model, s.data.val_crops, self.cfg, device=s.dist.device, precision=s.precision)
            run_log.record(s.state.step, result, prefix="val")
            log.info("step %d validation (%s metric): overall %.4f | %s", s.state.step, result["metric"],
                     result["overall_score"], ", ".join(f"{k} {v:.3f}" for k, v in result["class_scores"].items()))
        runtime.barrier(s.dist)
        self._checkpoint(score=result.get("overall_score"))
        return result

    def _checkpoint(self, score: float | None = None) -> None:
        s = self.s
        if s.dist.is_main:
            state = s.state_dict(metric=score, rng=rng_state())
            s.keeper.save_last(state)
            if score is not None:
                s.keeper.offer(state, s.state.step, score)
        runtime.barrier(s.dist)

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


def train(cfg: RunConfig, *, resume: bool | str = False) -> dict[str, Any]:
    """Build a `Trainer` and run it; the process group is torn down afterwards."""
    try:
        trainer = Trainer(cfg, resume=resume)
        result = trainer.fit()
        if trainer.s.dist.is_main:
            (trainer.s.run_dir / "result.json").write_text(json.dumps(result, indent=1, default=str))
        return result
    finally:
        runtime.shutdown_distributed()


__all__ = ["Trainer", "set_rng_state", "train"]
