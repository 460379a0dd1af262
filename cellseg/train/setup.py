"""Everything a training job needs before its first step, in order: process group and backends → seeds →
model → batch size → run directory (its lock, config.yaml, meta.json) → data → loss/optimizer/schedule →
resume → compile (or, for a cold one-GPU job, a compiling child process while training starts eagerly:
`cellseg.train.background`, `Setup.finish_compile`) → DDP. `Setup` holds the results and knows how to
write and read a checkpoint of them. The GPU-memory rules (room for data, for a background compile) are
`cellseg.runtime.gpu_memory`'s.

The run directory is claimed first (`cellseg.train.lock`): a second training there fails at once. Resuming reads
the newest intact checkpoint (`run_checkpoints.load_latest`: a corrupt `last.pt` is named and skipped) of the same
model (`check_checkpoint_model`).
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cellseg import runtime
from cellseg.config.load import dump, to_dict
from cellseg.config.schema import RunConfig
from cellseg.data.loader import TrainData, build_train_data, read_train_crops, skipped_record
from cellseg.models import build_model
from cellseg.runtime import gpu_memory
from cellseg.runtime.checkpoint import check_checkpoint_model, git_commit, save_atomic_text, versions
from cellseg.train.background import LOG_FILE, BackgroundCompile
from cellseg.train.batch import find_batch_size
from cellseg.train.build import example_input, make_criterion, make_model, model_params
from cellseg.train.clock import TrainClock
from cellseg.train.compile_choice import loss_step_bytes, maybe_compile, maybe_compile_loss
from cellseg.train.lock import RunLock
from cellseg.train.optim import EMA, build_optimizer, build_scheduler
from cellseg.train.perf import matmul_peak_tflops, train_flops_per_sample
from cellseg.train.run_checkpoints import CheckpointKeeper, candidates, load_latest, set_rng_state
from cellseg.train.warm_start import StartupRecord, startup_key

log = logging.getLogger(__name__)
MICRO_BATCH_FILE = "micro_batch.json"


@dataclass
class TrainState:
    """What changes every step (and is checkpointed)."""

    step: int = 0
    micro_batch: int = 1


@dataclass
class Setup:
    """The assembled training job (see the module docstring for the order)."""

    cfg: RunConfig
    dist: runtime.Dist
    precision: runtime.Precision
    run_dir: Path
    model: torch.nn.Module  # unwrapped, on device
    net: torch.nn.Module  # compiled and/or DDP-wrapped view used for training
    memory_format: torch.memory_format
    batch_size: int
    data: TrainData
    criterion: torch.nn.Module  # SegmentationLoss, possibly compiled
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    ema: EMA | None
    keeper: CheckpointKeeper
    flops_per_sample: int
    peak_tflops: float | None
    voxels_per_sample: int
    state: TrainState = field(default_factory=TrainState)
    meta: dict[str, Any] = field(default_factory=dict)
    lock: RunLock | None = None  # held by rank 0 until `close`
    resumed_from: Path | None = None  # the checkpoint the run continues from
    clock: TrainClock = field(default_factory=TrainClock)  # training seconds (budget and time schedule)
    startup_s: dict[str, float] = field(default_factory=dict)  # set-up phase → seconds (`Phases`), in order
    startup: StartupRecord = field(default_factory=StartupRecord.disabled)  # `cellseg.train.warm_start`
    background: BackgroundCompile | None = None  # compiling while training starts (`cellseg.train.background`)

    def close(self) -> None:
        """End the background compile, the loader's workers, and release the run directory."""
        if self.background is not None:
            self.background.close()
        self.data.close()
        if self.lock is not None:
            self.lock.release()

    def state_dict(self, *, metric: float | None, rng: dict[str, Any]) -> dict[str, Any]:
        """A complete checkpoint (see `cellseg.train.run_checkpoints`)."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                "ema": self.ema.state_dict() if self.ema else None, "step": self.state.step,
                "micro_batch": self.state.micro_batch, "train_seconds": self.clock.seconds(), "rng": rng,
                "config": to_dict(self.cfg), "meta": self.meta, "metric": metric}

    def load_state(self, ckpt: dict[str, Any]) -> None:
        """Restore a checkpoint written by `state_dict`."""
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.scaler.load_state_dict(ckpt["scaler"])
        if self.ema is not None and ckpt.get("ema") is not None:
            self.ema.load_state_dict(ckpt["ema"], updates=ckpt["step"])
        self.state = TrainState(step=ckpt["step"], micro_batch=ckpt["micro_batch"])
        self.clock.restore(ckpt.get("train_seconds", 0.0))  # checkpoints written before the clock existed: 0
        set_rng_state(ckpt["rng"])

    def eval_model(self) -> torch.nn.Module:
        """The unwrapped model (with EMA weights, if any) for validation."""
        if self.ema is None:
            return self.model
        model = build_model(self.cfg.model.name, 1, self.cfg.data.num_target_channels, preset=self.cfg.model.preset,
                            **self.cfg.model.params).to(self.dist.device)
        model.load_state_dict({k: v.to(model.state_dict()[k].dtype) for k, v in self.ema.state_dict().items()})
        return model

    def compile_now(self) -> None:
        """Compile the model and the loss as `train.compile` says (`cellseg.train.compile_choice`), reusing the start-up
        record's decisions when the micro-batch is the one it describes, and record them for the next job."""
        cfg, d = self.cfg, self.dist
        same = self.state.micro_batch == self.batch_size  # a resumed run's smaller micro-batch is not the record's
        compiled, self.meta["compile"], layout = maybe_compile(
            self.model, cfg, d.device, precision=self.precision, fmt=self.memory_format, batch=self.state.micro_batch,
            reuse=self.startup.get("compile") if same else None)
        self.criterion, self.meta["compile_loss"] = maybe_compile_loss(
            self.criterion, cfg, d.device, precision=self.precision, batch=self.state.micro_batch,
            fmt=self.memory_format, layout=layout, reuse=self.startup.get("compile_loss") if same else None)
        for name in ("compile", "compile_loss"):
            if same and "eager_step_s" in self.meta[name]:  # decided by timing (or by the record): kept for reuse
                self.startup.put(name, {k: self.meta[name][k] for k in ("compiled", "compiled_step_s", "eager_step_s")})
        if same and "compile_s" in self.meta["compile"]:  # the compile cache now holds this model's graphs
            self.startup.put("compile_cache", True)
        if d.is_main:
            self.startup.save()
        self.net = runtime.wrap_ddp(compiled, d)

    def finish_compile(self) -> None:
        """Once the background compile has ended: compile here from the cache it filled (or, if it failed, from
        scratch) and train compiled from now on. The random generators are left as they were."""
        job, self.background = self.background, None
        assert job is not None
        job.wait()
        failure = job.failure()
        if failure:
            log.warning("the background compile failed (%s; %s): compiling here", failure, job.log_path)
        start = time.perf_counter()
        with torch.random.fork_rng(devices=[self.dist.device]):
            self.compile_now()
        pause = time.perf_counter() - start
        self.meta["compile"].update(background=True, background_s=round(job.seconds or 0.0, 1),
                                    background_error=failure, switch_step=self.state.step, switch_s=round(pause, 1))
        log.info("step %d: the background compile took %.1f s; %s model and %s loss from here (%.1f s to load)",
                 self.state.step, job.seconds, "compiled" if self.meta["compile"]["compiled"] else "eager",
                 "compiled" if self.meta["compile_loss"]["compiled"] else "eager", pause)
        if self.dist.is_main:
            save_atomic_text(json.dumps(self.meta, indent=1, default=str), self.run_dir / "meta.json")

    def persist_micro_batch(self, micro_batch: int) -> None:
        """Record a reduced micro-batch so that an elastic restart picks it up."""
        if self.dist.is_main:
            (self.run_dir / MICRO_BATCH_FILE).write_text(json.dumps({"micro_batch": micro_batch}))


def seed_everything(seed: int) -> None:
    """Python, NumPy and torch generators (per rank: pass seed + rank)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - seeds the legacy generator third-party code may use
    torch.manual_seed(seed)


def _batch_size(cfg: RunConfig, model: torch.nn.Module, d: runtime.Dist, precision: runtime.Precision,
                fmt: torch.memory_format) -> int:
    if cfg.train.batch_size != "auto":
        return int(cfg.train.batch_size)
    if d.device.type != "cuda":
        log.info("train.batch_size=auto on CPU: using 2")
        return 2
    with runtime.autocast(d.device, precision):
        found = find_batch_size(model, lambda b: example_input(cfg, d.device, batch=b, fmt=fmt),
                                lambda out: out.float().square().mean(), device=d.device,
                                memory_fraction=cfg.train.memory_fraction, max_batch=cfg.train.max_auto_batch)
    return gpu_memory.min_over_ranks(found, d)


def _startup_record(cfg: RunConfig, model: torch.nn.Module, d: runtime.Dist, precision: runtime.Precision,
                    fmt: torch.memory_format, batch: int) -> StartupRecord:
    """An earlier job's start-up measurements for this model, batch and software (`cellseg.train.warm_start`)."""
    if d.device.type != "cuda" or not cfg.train.startup_cache:
        return StartupRecord.disabled()
    record = StartupRecord(startup_key(cfg, model, device=d.device, batch=batch, fmt=fmt, precision=precision))
    if record.loaded:
        log.info("start-up record %s: reusing the GPU-room probe and compile decisions of an earlier job "
                 "(train.startup_cache=false measures again)", record.path)
    return record


def _gpu_room(cfg: RunConfig, model: torch.nn.Module, d: runtime.Dist, precision: runtime.Precision,
              fmt: torch.memory_format, batch: int, startup: StartupRecord) -> int:
    """GPU bytes that training leaves free for resident data (`data.resident`; `cellseg.runtime.gpu_memory`):
    the minimum over ranks, so every rank places its data alike. 0 off CUDA or when the data may not go to the
    GPU."""
    if d.device.type != "cuda" or cfg.data.resident not in ("auto", "gpu"):
        return 0
    step = _step_bytes_recorded(cfg, model, d, precision, fmt, batch, startup)
    return gpu_memory.min_over_ranks(gpu_memory.data_room(model, step, d.device), d)


def _step_bytes_recorded(cfg: RunConfig, model: torch.nn.Module, d: runtime.Dist, precision: runtime.Precision,
                         fmt: torch.memory_format, batch: int, startup: StartupRecord) -> int | None:
    """Peak GPU bytes of one eager step at `batch` (`cellseg.runtime.gpu_memory.step_bytes`), from `startup` when
    an earlier job measured it (the eager probe is then skipped)."""
    step = startup.get("gpu_step_bytes")
    if step is None:
        step = gpu_memory.step_bytes(model, lambda: example_input(cfg, d.device, batch=batch, fmt=fmt), d.device,
                                     precision)
        if step is not None:  # out of memory may be another process's doing: measured again next time
            startup.put("gpu_step_bytes", step)
    return step


def _background_room(s: Setup) -> int | None:
    """GPU bytes a background compile may use (`cellseg.train.background`), None when it does not apply: not
    one CUDA process, compiling off or not wanted, a warm compile cache or a recorded decision, a resumed run's
    smaller micro-batch, or no room beside the job."""
    cfg, d = s.cfg, s.dist
    if (d.device.type != "cuda" or d.distributed or cfg.train.compile == "off" or not cfg.train.background_compile
            or s.startup.get("compile") is not None or s.startup.get("compile_cache")
            or s.state.micro_batch != s.batch_size):
        return None
    with torch.random.fork_rng(devices=[d.device]):  # the probes' draws leave no trace
        step = _step_bytes_recorded(cfg, s.model, d, s.precision, s.memory_format, s.batch_size, s.startup)
        try:
            loss = loss_step_bytes(s.criterion, cfg, d.device, precision=s.precision, batch=s.batch_size,
                                   fmt=s.memory_format)
        except torch.OutOfMemoryError:
            step = loss = None  # no room for the eager loss beside the data: none for a second process either
    room, why_not = gpu_memory.background_room(s.model, step, loss, d.device)
    if room is None:
        s.meta["background_compile"] = why_not
        log.info("compiling before the first step: %s", why_not)
    return room


def _refuse_while_spawn_imports_main() -> None:
    """The loader's workers start by spawn, which imports the parent's `__main__` script again. A script that
    builds a training at its top level (no `if __name__ == "__main__":`) would build one more in every worker;
    say so, instead of the run directory's lock error that would follow.

    Raises:
        RuntimeError: when called while this process is a spawned child still importing its parent's script.
    """
    # `_inheriting` is multiprocessing's own flag for that phase (its "bootstrapping phase" error reads it too)
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            "a training was started while a spawned worker process imported the parent's script: put the code that "
            "starts training under `if __name__ == \"__main__\":` (the data loader's workers start by spawn and "
            "re-import that script)")


def _claim(run_dir: Path, d: runtime.Dist) -> RunLock | None:
    """Rank 0 locks the run directory; every rank raises if that failed (none waits at a barrier for ever)."""
    lock, error = None, None
    if d.is_main:
        try:
            lock = RunLock(run_dir).acquire()
        except FileExistsError as err:
            error = str(err)
    error = runtime.broadcast_object(error, d)
    if error:
        raise FileExistsError(error)
    return lock


def _resume_wanted(resume: bool | str, ckpt_dir: Path) -> bool:
    """`resume="auto"` continues when a checkpoint exists; a torchrun restart always continues."""
    if resume == "auto":
        resume = bool(candidates(ckpt_dir)) if ckpt_dir.is_dir() else False
    return bool(resume) or runtime.restart_count() > 0


class Phases:
    """Wall seconds of the set-up's phases, in order (`Setup.startup_s`, meta.json's `startup_s`): where the time
    before the first step goes. Lazy work (torch.compile compiles at the first forward) shows in the trainer's
    first step, not here."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 3)


def build_setup(cfg: RunConfig, *, resume: bool | str = False,
                before_compile: Callable[[Setup], None] | None = None) -> Setup:
    """Assemble a training job (module docstring); resumes from the run's newest intact checkpoint if asked.

    `resume="auto"` continues when a checkpoint exists and starts fresh otherwise. `before_compile(setup)` runs
    once the data and the resumed state are in place, before compilation (the trainer starts its loader workers
    there, so that their start-up overlaps the compilation).

    Raises:
        FileExistsError: another training holds `run_dir`, or it holds a run and `resume` is not given.
    """
    _refuse_while_spawn_imports_main()
    tc, phase = cfg.train, Phases()
    with phase("devices"):
        d = runtime.init_distributed(tc.device)
        runtime.configure_backends(tf32=tc.tf32, cudnn_benchmark=tc.cudnn_benchmark)
        precision = runtime.resolve_precision(tc.precision, d.device)
    seed_everything(tc.seed + d.rank)
    run_dir = Path(cfg.run_dir)
    ckpt_dir = run_dir / "checkpoints"
    spatial_dims = 2 if cfg.data.is_2d else 3
    fmt = runtime.memory_format(spatial_dims, tc.channels_last and d.device.type == "cuda")
    with phase("model"):
        model = make_model(cfg, d.device, fmt)
    with phase("batch size"):
        batch = _batch_size(cfg, model, d, precision, fmt)
    lock = _claim(run_dir, d)
    try:
        return _assemble(cfg, d, precision, model, batch, fmt, lock=lock, resume=_resume_wanted(resume, ckpt_dir),
                         phase=phase, before_compile=before_compile)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _assemble(cfg: RunConfig, d: runtime.Dist, precision: runtime.Precision, model: torch.nn.Module, batch: int,
              fmt: torch.memory_format, *, lock: RunLock | None, resume: bool, phase: Phases,
              before_compile: Callable[[Setup], None] | None = None) -> Setup:
    """The rest of `build_setup`, holding the run directory's lock."""
    run_dir = Path(cfg.run_dir)
    ckpt_dir = run_dir / "checkpoints"
    if not resume and ckpt_dir.is_dir() and candidates(ckpt_dir):
        raise FileExistsError(f"{run_dir} already holds a run: pass --resume to continue it, or choose another run_dir")
    startup = _startup_record(cfg, model, d, precision, fmt, batch)
    data = _train_data(cfg, d, precision, model, batch, fmt, startup=startup, phase=phase)
    s = _new_setup(cfg, d, precision, model, batch, fmt, data, lock=lock, startup=startup)
    if d.is_main and ckpt_dir.is_dir():
        s.keeper.remove_partial_files()
    if resume:
        _resume(s, phase)
    if before_compile is not None:
        with phase("loader start"):
            before_compile(s)
    with phase("compile"):  # "auto" times eager against compiled here (or reuses `startup`); "on" compiles here
        _compile_or_start_background(s)
    s.startup_s = s.meta["startup_s"] = phase.seconds
    s.meta.update(flops_per_sample=s.flops_per_sample, matmul_peak_tflops=s.peak_tflops)
    if d.is_main:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(dump(cfg))
            (run_dir / "meta.json").write_text(json.dumps(s.meta, indent=1, default=str))
        except BaseException:
            if s.background is not None:  # the child ends with the failed set-up (the caller ends the rest)
                s.background.close()
            raise
    return s


def _train_data(cfg: RunConfig, d: runtime.Dist, precision: runtime.Precision, model: torch.nn.Module, batch: int,
                fmt: torch.memory_format, *, startup: StartupRecord, phase: Phases) -> TrainData:
    """The training data, placed where the GPU's room (`_gpu_room`) allows."""
    tc, run_dir = cfg.train, Path(cfg.run_dir)
    # The crops are opened and indexed in a thread while the GPU probe runs (it touches no GPU and writes nothing
    # in the run directory); the main process of a run also builds the boundary caches there, before the barrier.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="read-crops") as reader:
        reading = reader.submit(read_train_crops, cfg.data, cfg.loader, cfg.augment, seed=tc.seed,
                                warm_caches=d.is_main)
        with phase("batch size"):
            room = _gpu_room(cfg, model, d, precision, fmt, batch, startup)
        with phase("data"):  # what of the reading the probe did not hide, then the rest
            crops = reading.result()
    runtime.barrier(d)
    with phase("data"):
        return build_train_data(cfg.data, cfg.loader, cfg.augment, batch_size=batch, seed=tc.seed, rank=d.rank,
                                world_size=d.world_size, run_dir=run_dir if d.is_main else None, device=d.device,
                                gpu_room_bytes=room, crops=crops)


def _new_setup(cfg: RunConfig, d: runtime.Dist, precision: runtime.Precision, model: torch.nn.Module, batch: int,
               fmt: torch.memory_format, data: TrainData, *, lock: RunLock | None, startup: StartupRecord) -> Setup:
    """A fresh `Setup` (step 0): loss, optimizer, schedule over the training clock, checkpoint keeper, meta."""
    tc, run_dir = cfg.train, Path(cfg.run_dir)
    criterion = make_criterion(cfg, d.device)
    optimizer = build_optimizer(model, cfg.optim, d.device)
    clock = TrainClock()
    budget_s = 60.0 * tc.time_budget_min if tc.time_budget_min is not None else None
    # The schedule reads the clock value every rank agrees on (`cellseg.train.clock`), so DDP ranks step alike.
    scheduler = build_scheduler(optimizer, cfg.optim, tc.max_steps, budget_s=budget_s, clock_s=lambda: clock.shared_s)
    patch = cfg.data.patch_shape_vox
    meta = {"git_commit": git_commit(), "versions": versions(), "model": model.spec.to_dict(),
            "classes": list(cfg.data.classes), "boundary_classes": list(cfg.data.boundary_classes),
            "channels": list(cfg.data.classes) + [f"{c}_boundary" for c in cfg.data.boundary_classes],
            "voxel_size_nm": list(cfg.data.voxel_size_nm), "patch_shape_vox": list(patch), "batch_size": batch,
            "world_size": d.world_size, "precision": precision, "device": str(d.device), "resident_data": data.resident,
            "gpu": torch.cuda.get_device_name(d.device) if d.device.type == "cuda" else "cpu",
            "skipped_crops": skipped_record(data.skipped)}
    return Setup(cfg=cfg, dist=d, precision=precision, run_dir=run_dir, model=model, net=model, memory_format=fmt,
                 batch_size=batch, data=data, criterion=criterion, optimizer=optimizer, scheduler=scheduler,
                 scaler=runtime.make_scaler(precision, d.device),
                 ema=EMA(model, cfg.optim.ema_decay) if cfg.optim.ema_decay else None,
                 keeper=CheckpointKeeper(run_dir / "checkpoints", top_k=tc.keep_top_k),
                 flops_per_sample=train_flops_per_sample(cfg.model.name, 1, cfg.data.num_target_channels, patch,
                                                         preset=cfg.model.preset, params=model_params(cfg)),
                 peak_tflops=matmul_peak_tflops(d.device), voxels_per_sample=math.prod(patch),
                 state=TrainState(micro_batch=batch), meta=meta, lock=lock, clock=clock, startup=startup)


def _resume(s: Setup, phase: Phases) -> None:
    """Continue from the run's newest intact checkpoint, at the smaller micro-batch an OOM left, if any."""
    with phase("resume"):
        ckpt, s.resumed_from = load_latest(s.keeper.directory, map_location=s.dist.device)
        s.load_state(check_checkpoint_model(ckpt, s.meta["model"], source=str(s.resumed_from)))
    override = s.run_dir / MICRO_BATCH_FILE
    if override.is_file():
        s.state.micro_batch = min(s.state.micro_batch, json.loads(override.read_text())["micro_batch"])
    log.info("resumed %s at step %d from %s", s.run_dir, s.state.step, s.resumed_from.name)


def _compile_or_start_background(s: Setup) -> None:
    """Compile here, or start a compiling child process while this one trains eagerly (`_background_room`)."""
    room = _background_room(s)
    if room is None:
        s.compile_now()
        return
    s.background = BackgroundCompile.start(s.cfg, device=s.dist.device, batch=s.batch_size, precision=s.precision,
                                           max_bytes=room, log_path=s.run_dir / LOG_FILE)
    for name in ("compile", "compile_loss"):
        s.meta[name] = {"mode": s.cfg.train.compile, "background": True, "compiled": False}
    s.startup.save()  # one process: rank 0
