"""Run the tasks of a whole-volume store on daisy (`daisy` 2.0.0, the scheduler only: blocks, dependencies, done
markers, retries, timeouts, worker processes; every read and write is cellseg's, in the workers).

`run_tasks` builds one daisy task per step (`cellseg.volume.tasks`), with ROIs in s0 voxels of the ROI, and the
pipeline's edges so that each block waits only for the blocks it reads. Every worker slot is a process started
by `Launcher` through the worker entry point (`python -m cellseg.volume.worker`), prefixed by `volume.launch`
(e.g. `srun ...`) on a cluster; prediction workers get a GPU each (`CUDA_VISIBLE_DEVICES`, round robin).

Done markers live in `OUT.zarr/.blocks/<task>/` and worker logs in `OUT.zarr/.blocks/logs/`: a rerun (`--resume`)
skips every finished block. A block that fails is retried `max_retries` times, then reported with its ROI; the
blocks that do not depend on it complete, and `summary.json` lists the failures.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cellseg.volume.store import VolumeStore, level_block_vox
from cellseg.volume.tasks import DECODE, MERGE, PREDICT, RELABEL, pyramid_task
from cellseg.volume.worker import RUN_ENV

log = logging.getLogger(__name__)
WORKER_MODULE = "cellseg.volume.worker"
LOG_DIR = "logs"  # under OUT.zarr/.blocks/


@dataclass(frozen=True, kw_only=True)
class Workers:
    """Where and how many workers run.

    Attributes:
        predict: prediction worker slots.
        cpu: worker slots of each CPU task (instances, pyramids).
        gpus: GPU ids handed to prediction workers round robin (empty: CPU).
        device: the prediction workers' torch device ("auto", "cpu", "cuda").
        launch: command prefix of every worker (e.g. ["srun", "--ntasks=1"]); empty: a local process.
        max_retries: retries of a failing block; timeout_s: a block's time limit.
        host: the address workers connect back to (None: detected).
    """

    predict: int
    cpu: int = 2
    gpus: tuple[str, ...] = ()
    device: str = "auto"
    launch: tuple[str, ...] = ()
    max_retries: int = 2
    timeout_s: float = 3600.0
    host: str | None = None


def visible_gpus(device: str) -> tuple[str, ...]:
    """The GPU ids workers may use: `CUDA_VISIBLE_DEVICES` if set, else every device torch sees; none for CPU."""
    if device == "cpu":
        return ()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return tuple(g.strip() for g in listed.split(",") if g.strip())
    import torch

    return tuple(str(i) for i in range(torch.cuda.device_count()))


@dataclass
class Launcher:
    """A daisy worker function: starts one worker process of `task` and waits for it (a non-zero exit is a
    failed worker, which daisy replaces)."""

    store: str
    task: str
    workers: Workers
    run: str = ""  # the driver's run id (workers record their timing under it)

    def command(self) -> list[str]:
        """The worker's command line."""
        return [*self.workers.launch, sys.executable, "-m", WORKER_MODULE, self.store, "--task", self.task,
                "--device", self.workers.device if self.task == PREDICT else "cpu"]

    def __call__(self, *, context: Any) -> None:
        env = dict(os.environ, DAISY_CONTEXT=context.to_env(), **{RUN_ENV: self.run})
        if self.task == PREDICT and self.workers.gpus and not self.workers.launch:  # a launcher (srun) binds GPUs
            env["CUDA_VISIBLE_DEVICES"] = self.workers.gpus[int(context["worker_id"]) % len(self.workers.gpus)]
        done = subprocess.run(self.command(), env=env, check=False)
        if done.returncode:
            raise RuntimeError(f"worker of {self.task} exited with code {done.returncode} (its log: "
                               f"{os.path.join(self.store, '.blocks', LOG_DIR)})")


def _roi(offset: Sequence[int], shape: Sequence[int]) -> Any:
    from funlib.geometry import Roi

    return Roi(tuple(int(v) for v in offset), tuple(int(v) for v in shape))


def _task(store: VolumeStore, task_id: str, *, block: Sequence[int], context: Sequence[int], workers: int,
          spec: Workers, run: str) -> Any:
    """A daisy task over the ROI (s0 voxels) in blocks of `block`, each reading `context` more per side."""
    import daisy.v2 as daisy

    shape = store.grid.shape_vox
    neg = [-c for c in context]
    return daisy.Task(task_id, _roi(neg, [n + 2 * c for n, c in zip(shape, context, strict=True)]),
                      _roi(neg, [b + 2 * c for b, c in zip(block, context, strict=True)]), _roi((0, 0, 0), block),
                      process_function=Launcher(str(store.path), task_id, spec, run), read_write_conflict=False,
                      fit="shrink", max_workers=workers, max_retries=spec.max_retries, timeout=spec.timeout_s,
                      tracking_path=str(store.tracking_dir(task_id)))


def build_tasks(store: VolumeStore, spec: Workers, *, context_vox: Sequence[int],
                halo_vox: Sequence[int] = (0, 0, 0), run: str = "") -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The daisy tasks of the store (by id, in run order) and the edges (upstream id, downstream id)."""
    block = store.block_vox
    whole = store.grid.shape_vox
    tasks = {PREDICT: _task(store, PREDICT, block=block, context=context_vox, workers=spec.predict, spec=spec,
                            run=run)}
    edges: list[tuple[str, str]] = []

    def pyramid(group: str, after: str) -> None:
        for level in range(1, store.num_levels):
            name = pyramid_task(group, level)
            own = level_block_vox(block, store.chunk_vox, level)  # in the level's voxels
            tasks[name] = _task(store, name, block=[b << level for b in own], context=(0, 0, 0),
                                workers=spec.cpu, spec=spec, run=run)
            edges.append((after, name))
            after = name

    pyramid("probabilities", PREDICT)
    if store.has_labels:
        tasks[DECODE] = _task(store, DECODE, block=block, context=halo_vox, workers=spec.cpu, spec=spec, run=run)
        edges.append((PREDICT, DECODE))
        tasks[MERGE] = _task(store, MERGE, block=whole, context=(0, 0, 0), workers=1, spec=spec, run=run)
        tasks[RELABEL] = _task(store, RELABEL, block=block, context=(0, 0, 0), workers=spec.cpu, spec=spec, run=run)
        edges += [(DECODE, MERGE), (MERGE, RELABEL)]
        pyramid("labels", RELABEL)
    return tasks, edges


class Progress:
    """daisy's progress observer: one bar over every task's blocks, with the prediction's Mvox/s and ETA."""

    def __init__(self, store: VolumeStore, enabled: bool):
        self.enabled, self.bar, self.started = enabled, None, time.perf_counter()
        self.voxels = math.prod(store.grid.shape_vox)
        self.predicted = 0
        self.skipped = 0

    def _counts(self, states: Mapping[str, Any]) -> tuple[int, int]:
        return (sum(s.completed_count + s.failed_count + s.orphaned_count for s in states.values()),
                sum(s.total_block_count for s in states.values()))

    def on_start(self, states: Mapping[str, Any]) -> None:
        self.started = time.perf_counter()
        if self.enabled:
            from tqdm import tqdm

            done, total = self._counts(states)
            self.bar = tqdm(total=total, initial=done, unit="block", desc="predict-volume", dynamic_ncols=True)

    def rate(self, states: Mapping[str, Any]) -> float:
        """Mvoxel/s of the prediction so far (blocks skipped by a resume left out)."""
        p = states.get(PREDICT)
        if p is None or not p.total_block_count:
            return 0.0
        fresh = p.completed_count - p.skipped_count
        return fresh * self.voxels / p.total_block_count / max(time.perf_counter() - self.started, 1e-9) / 1e6

    def on_progress(self, states: Mapping[str, Any]) -> None:
        if self.bar is not None:
            done, _ = self._counts(states)
            self.bar.update(done - self.bar.n)
            p = states.get(PREDICT)
            self.bar.set_postfix_str(f"predict {p.completed_count}/{p.total_block_count}, "
                                     f"{self.rate(states):.2f} Mvox/s", refresh=False)

    def on_finish(self, states: Mapping[str, Any]) -> None:
        self.on_progress(states)
        if self.bar is not None:
            self.bar.close()


@dataclass
class RunResult:
    """What a run did: per-task counts, the failed blocks (with their ROI in voxels and nm), wall time."""

    tasks: dict[str, dict[str, int]]
    failed: list[dict[str, Any]]
    wall_s: float
    predict_mvox_s: float
    errors: dict[str, str] = field(default_factory=dict)
    timing: dict[str, dict[str, float]] = field(default_factory=dict)  # per task, from its workers (`timings`)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.errors and all(
            t["completed"] == t["total"] for t in self.tasks.values())


def _failed(store: VolumeStore, task_id: str, task: Any) -> list[dict[str, Any]]:
    grid = store.grid
    out = []
    for block in task.failed_blocks():
        offset, shape = [int(v) for v in block.write_roi.offset], [int(v) for v in block.write_roi.shape]
        start = [s + o * v for s, o, v in zip(grid.start_nm, offset, grid.voxel_size_nm, strict=True)]
        out.append({"task": task_id, "block_id": int(block.block_id[1]), "offset_vox": offset, "shape_vox": shape,
                    "roi_nm": ",".join(f"{a:g}:{a + n * v:g}" for a, n, v in zip(start, shape, grid.voxel_size_nm,
                                                                                  strict=True))})
    return out


def run_tasks(store: VolumeStore, spec: Workers, *, context_vox: Sequence[int], halo_vox: Sequence[int] = (0, 0, 0),
              progress: bool = True) -> RunResult:
    """Run every task of the store to completion (finished blocks skipped) and write `summary.json`."""
    import daisy.v2 as daisy
    from daisy import logging as daisy_log

    run = f"{time.time():.3f}".replace(".", "")
    tasks, edges = build_tasks(store, spec, context_vox=context_vox, halo_vox=halo_vox, run=run)
    daisy_log.set_log_basedir(str(store.path / ".blocks" / LOG_DIR))
    pipeline = daisy.Pipeline(list(tasks.values()), [(tasks[a], tasks[b]) for a, b in edges])
    observer = Progress(store, progress)
    started = time.perf_counter()
    errors: dict[str, str] = {}
    try:
        states = daisy.run_blockwise(pipeline, multiprocessing=True, progress=observer, return_states=True,
                                     summary=False, host=spec.host)
    except RuntimeError as err:  # a task abandoned: its workers kept dying (the message has the worker's error)
        errors["run"] = str(err)
        states = {}
    wall = time.perf_counter() - started
    counts = {t: {"total": s.total_block_count, "completed": s.completed_count, "skipped": s.skipped_count,
                  "failed": s.failed_count, "orphaned": s.orphaned_count} for t, s in states.items()}
    for t, s in states.items():
        if s.abandoned:
            errors[t] = f"abandoned: {s.abandon_reason}; last worker error: {s.last_worker_error}"
    failed = [f for t, task in tasks.items() for f in _failed(store, t, task)]
    result = RunResult(tasks=counts, failed=failed, wall_s=wall, predict_mvox_s=observer.rate(states) if states
                       else 0.0, errors=errors, timing=timings(store, run))
    write_summary(store, result, spec)
    return result


def timings(store: VolumeStore, run: str) -> dict[str, dict[str, float]]:
    """Per task of run `run`, from its workers' records: workers, blocks, the slowest start-up (process start to
    first block possible: imports, models), busy seconds (inside blocks) and span (first block's start to last
    block's end): the task's time without start-up."""
    out: dict[str, dict[str, float]] = {}
    for path in sorted((store.path / ".blocks" / LOG_DIR).glob(f"*/timing-{run}-*.json")):
        t = json.loads(path.read_text())
        row = out.setdefault(t["task"], {"workers": 0, "blocks": 0, "startup_s": 0.0, "busy_s": 0.0,
                                         "first": math.inf, "last": 0.0})
        row["workers"] += 1
        row["blocks"] += t["blocks"]
        row["startup_s"] = max(row["startup_s"], t["ready_s"])
        row["busy_s"] += t["busy_s"]
        if t["first"] is not None:
            row["first"], row["last"] = min(row["first"], t["first"]), max(row["last"], t["last"])
    for row in out.values():
        row["span_s"] = max(0.0, row.pop("last") - row.pop("first")) if row["blocks"] else 0.0
        for k in ("startup_s", "busy_s", "span_s"):
            row[k] = round(row[k], 3)
    return out


def write_summary(store: VolumeStore, result: RunResult, spec: Workers) -> None:
    """`OUT.zarr/summary.json`: the run's counts, failures, rate and workers (replaced atomically)."""
    doc = {"dataset": store.attrs["dataset"], "out": str(store.path), "roi_nm": store.attrs["roi_nm"],
           "voxel_size_nm": store.attrs["voxel_size_nm"], "block_vox": store.attrs["block_vox"], "ok": result.ok,
           "tasks": result.tasks, "failed_blocks": result.failed, "errors": result.errors,
           "wall_s": round(result.wall_s, 3), "predict_mvox_per_s": round(result.predict_mvox_s, 3),
           "timing": result.timing,
           "workers": {"predict": spec.predict, "cpu": spec.cpu, "gpus": list(spec.gpus),
                       "launch": shlex.join(spec.launch)},
           "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    tmp = store.summary_path.with_name(f".{store.summary_path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(store.summary_path)
