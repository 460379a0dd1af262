"""Decoding and scoring validation classes in a pool of spawned processes (`val.workers`).

Validation predicts each crop on the GPU in the training process; what follows is CPU work per (crop, class):
decode the class on its grid (`cellseg.postprocess.native.decode_on_grid`), read its truth there and score it
(`cellseg.eval.crop_score.score_class`). `ClassTask` is that work for one class, with only what it needs (the
class's probability channel and its boundary channel, the grids, the parameters and the crop, whose array
handles travel empty and re-open in the worker: `cellseg.data.targets.CropArrays`); `score_task` does it, in
the training process (`val.workers: 0`) or in a worker, with the same code, so the scores are the same.

`ValidationPool` holds the worker processes of one training run: started at the first validation, reused by
every later one, shut down when training ends (or fails, or stops on a signal). They start the way the loader
workers do (`cellseg.train.stop`): "spawn", the stop signals ignored while they start, then SIGINT and
SIGUSR1 ignored for good and SIGTERM ignored while the training process is stopping (it finishes the
validation, checkpoints and shuts the pool down). A worker whose training process is gone (killed outright)
exits on its own.

Measured on 2026-11-27 on a 2-core CPU machine (no GPU: the model predicts on the CPU too; no other load):
one validation of 3 crops of 128³ voxels at 4 nm, 48 classes (58 channels with boundaries), model grid 8 nm,
a seeded untrained tiny `unet_3d`, `val.report_crops` on, a synthetic root of two 320³ datasets at 4 nm. With
`val.workers: 0` 13.5 s (13.4 s of CPU in the training process); with 2 workers 7.5 s (2.4 s of CPU in the
training process, 5.7 s in each worker): 1.8×, medians of 2 validations each on warm pools, alternating. The
first validation, which starts the workers, took 12.5 s against 14.0 s. The scores were identical. With the
machine's cores busy with other work the gain vanishes (2 workers: 14.8 s against 13.6 s).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellseg.classes import is_instance
from cellseg.data.grid import Grid
from cellseg.data.targets import CropSource
from cellseg.eval.crop_score import score_class
from cellseg.eval.eras import get_era
from cellseg.eval.truth import read_class_truth
from cellseg.pool import one_thread_per_process
from cellseg.postprocess.native import decode_on_grid
from cellseg.postprocess.params import InstanceParams, SemanticParams

log = logging.getLogger(__name__)
PARENT_POLL_S = 1.0  # how often a worker checks that its training process is still there
_CROPS: dict[CropSource, CropSource] = {}  # in a worker: the crops of its tasks (`_score_in_worker`)


@dataclass(frozen=True, kw_only=True)
class ClassTask:
    """Decode and score one class of one validation crop (`score_task`)."""

    crop: CropSource  # reads the truth (its array handles re-open in the process that runs the task)
    name: str
    prob: np.ndarray  # (z, y, x) probability of the class on `source`
    boundary: np.ndarray | None  # its boundary channel on `source` (instance classes trained with one)
    source: Grid  # the grid of the prediction (the model's)
    target: Grid  # where the class is decoded and scored (`val.grid`)
    params: InstanceParams | SemanticParams
    metric: str  # the scoring era (`val.metric`)


def score_task(task: ClassTask) -> dict[str, Any] | None:
    """Per-class scores of `task` on its target grid, only inside the annotated voxels (with `num_voxels` and
    `voxel_size`, nm); None where the crop does not annotate the class there."""
    read = read_class_truth(task.crop, task.name, task.target)
    if read is None:
        return None  # not annotated here: nothing to score against
    truth, inside = read
    pred = decode_on_grid(task.name, task.prob, task.boundary, source=task.source, target=task.target,
                          params=task.params)
    pred = np.where(inside, pred, 0).astype(pred.dtype) if is_instance(task.name) else pred & inside
    s = score_class(pred, truth, label=task.name, era=get_era(task.metric), voxel_size_nm=task.target.voxel_size_nm)
    return {**s, "num_voxels": int(inside.sum()), "voxel_size": list(task.target.voxel_size_nm)}


def _score_in_worker(task: ClassTask) -> dict[str, Any] | None:
    """`score_task` in a worker, with the first copy of the task's crop that the worker saw (an equal crop: the
    same crop opened for the same classes), whose arrays stay open for its other classes and later validations
    (a crop unpickled anew would open them again); tensorstore's chunk cache is one per process, so the crops
    kept add little memory."""
    return score_task(dataclasses.replace(task, crop=_CROPS.setdefault(task.crop, task.crop)))


class ValidationPool:
    """`workers` spawned processes that run `score_task`, started on first use (`submit`) and kept until
    `close`; `workers=0` runs every task in the calling process.

    `worker_init` runs first in every worker (`StopRequest.worker_init_fn`: the loader workers' signal rules)
    and `shield` is entered while they start (`StopRequest.shield_workers`).

    Example:
        >>> with ValidationPool(2) as pool:
        ...     scores = [f.result() for f in [pool.submit(t) for t in tasks]]
    """

    def __init__(self, workers: int, *, worker_init: Callable[[int], None] | None = None,
                 shield: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext) -> None:
        if workers < 0:
            raise ValueError(f"validation workers must be >= 0, got {workers}")
        self.workers, self._worker_init, self._shield = workers, worker_init, shield
        self._executor: ProcessPoolExecutor | None = None

    def __enter__(self) -> ValidationPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> ProcessPoolExecutor:
        with self._shield():
            executor = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                                           initializer=_init_worker, initargs=(self._worker_init, os.getpid()))
            # A process starts per task submitted while none is idle: `workers` tasks start them all here, inside
            # the shield (they import in the background while the first crop is predicted).
            for _ in range(self.workers):
                executor.submit(os.getpid)
        self._executor = executor
        log.info("validation: %d worker processes started", self.workers)
        return executor

    def submit(self, task: ClassTask) -> Future[dict[str, Any] | None]:
        """A future of `score_task(task)`: run by a worker, or here at once with `workers=0`."""
        if self.workers == 0:
            future: Future[dict[str, Any] | None] = Future()
            try:
                future.set_result(score_task(task))
            except Exception as err:  # as a worker's error would be: raised by `result()`
                future.set_exception(err)
            return future
        return (self._executor or self._start()).submit(_score_in_worker, task)

    def close(self) -> None:
        """Cancel the tasks not started, wait for the running ones and end the workers (idempotent)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
            log.debug("validation: %d worker processes ended", self.workers)


def gather(futures: dict[str, Future[dict[str, Any] | None]], crop: str) -> dict[str, dict[str, Any]]:
    """The scores of one crop's classes, in the order of `futures` (classes without truth left out).

    Raises:
        RuntimeError: a worker process died (killed for memory, say); the message names the crop.
    """
    scores = {}
    for name, future in futures.items():
        try:
            result = future.result()
        except BrokenProcessPool as err:
            raise RuntimeError(f"validation of {crop} ({name}): a validation worker process died (out of "
                               "memory?); lower val.workers (0 scores in the training process)") from err
        if result is not None:
            scores[name] = result
    return scores


def _init_worker(worker_init: Callable[[int], None] | None, parent: int) -> None:
    """In a worker: the signal rules of `worker_init`, Blosc on one thread, and an exit when `parent` is gone."""
    if worker_init is not None:
        worker_init(0)
    one_thread_per_process()
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True, name="parent-watch").start()


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)  # the training process is gone: nobody will ever collect a result
