"""`predict_all`: every member's predictions of the crops a report needs, for one stage (no TTA, or 8 transforms).

Each member (run) predicts into its own store (`Layout.predictions`), so the members are independent: with
`predict_jobs` > 1 they run in that many spawned processes, each calling `predict_run` for one member at a
time, and the stores hold what the one-after-the-other path writes (to float rounding: a process's number of
CPU threads, or cuDNN's choice of algorithm, can change the order of a sum). A member's time is mostly its own
process's latency and CPU work (loading the model, reading EM, writing its store, compiling the model on
CUDA) rather than GPU work on a report's small crops, so a few members overlap well on one GPU. On a machine
with several GPUs the processes are spread over them (worker i sees GPU i mod n alone, through
`CUDA_VISIBLE_DEVICES`). With one job the members predict in this process, one after the other (no subprocess).
A member that runs out of GPU memory beside the others is predicted again once they are done, one process per
GPU and one TTA pass per forward; the others are not disturbed.

A store left half-written (a worker killed, the report stopped) resumes on the next run: `predict_run` adds
the missing crops to a store made with the same settings; nothing here deletes a store.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING

from cellseg import logs
from cellseg.decide.inputs import CropPlan, RunInfo
from cellseg.decide.options import DecideOptions, Layout, check_predict_jobs
from cellseg.decide.reuse import open_candidates, reused_store, store_differences

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized

    from cellseg.config.inference import InferConfig

log = logging.getLogger(__name__)
# "auto" on CUDA: one process per this many GiB of GPU memory, at most `MAX_AUTO_JOBS` per GPU. Each process holds
# its own CUDA context (~0.5 GiB), its model and one batch of tiles, with TTA folded into the batch (`tta_fold`):
# measured on 2x H100 (80 GB) with four 3D members per GPU and 8x TTA, a process held 13-25 GiB and swin_3d asked
# for 12 GiB more at once (out of memory); without TTA 16 GiB each leaves room for the largest next to the others.
# The cap of 4 is a judgement, not a measurement: enough for one member's loading and store writing to overlap
# the others' GPU work, few enough that the processes' host memory and CPU threads stay modest. A member that runs
# out of GPU memory anyway is predicted again afterwards, one process per GPU (`predict_all`).
MAX_AUTO_JOBS = 4
GIB_PER_JOB = 16
GIB_PER_JOB_TTA = 32
PARENT_POLL_S = 1.0  # how often a worker checks that the report's process is still there


def visible_gpus(device: str) -> list[str]:
    """The GPUs the members' processes are spread over, as `CUDA_VISIBLE_DEVICES` entries (the ones this
    process sees: its own `CUDA_VISIBLE_DEVICES` entries where set, else indices); none on the CPU."""
    if device == "cpu":
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    count = torch.cuda.device_count()
    listed = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return listed[:count] if len(listed) >= count else [str(i) for i in range(count)]


def predict_jobs(requested: int | str, members: int, device: str, *, tta: int = 1) -> int:
    """Processes that predict the members: `requested`, or for "auto" on CUDA min(members, `MAX_AUTO_JOBS` per
    GPU, GPU memory GiB // `GIB_PER_JOB` (with TTA `GIB_PER_JOB_TTA`) per GPU, at least 1) and on CPU 1 (the
    cores are the bottleneck there, and the report's scoring processes share them); never more than `members`."""
    check_predict_jobs(requested)
    if requested != "auto":
        return max(1, min(int(requested), members))
    gpus = visible_gpus(device)
    if not gpus:  # the CPU, or "auto" without a GPU ("cuda" without one fails in `predict_run`)
        return 1
    import torch

    gib = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory // 2**30
    return auto_jobs(members, len(gpus), gib, tta=tta)


def auto_jobs(members: int, gpus: int, gib_per_gpu: int, *, tta: int) -> int:
    """`predict_jobs`'s "auto" for `gpus` GPUs of `gib_per_gpu` GiB each."""
    per_job = GIB_PER_JOB_TTA if tta > 1 else GIB_PER_JOB
    return max(1, min(members, gpus * MAX_AUTO_JOBS, gpus * (gib_per_gpu // per_job)))


def infer_config(opts: DecideOptions, tta: int, *, progress: bool) -> InferConfig:
    """How every member predicts in a report stage."""
    from cellseg.config.inference import InferConfig

    return InferConfig(tta=tta, overlap=opts.overlap, checkpoint=opts.checkpoint, device=opts.device,
                       data_root=opts.data_root, progress=progress)


def _init_worker(level: int, threads: int, parent: int, gpus: Sequence[str],
                 started: Synchronized) -> None:
    """Worker initializer: see one of `gpus` (round robin over the workers in the order they start: `started`
    counts them; before torch touches CUDA), log at the report's level (which member is loaded; `predict_run`
    prints each crop's summary line itself), use `threads` CPU threads, so the workers together use the cores
    once, and exit when the report's process (`parent`) is gone (killed outright: nobody would collect the
    result, the worker would wait for the next one forever, and the store it leaves resumes on the next run)."""
    gpu = next_gpu(gpus, started)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    import torch

    logs.configure(level, force=True)
    torch.set_num_threads(threads)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True, name="parent-watch").start()


def next_gpu(gpus: Sequence[str], started: Synchronized) -> str | None:
    """The GPU of the next worker to start: `gpus` round robin in start order (`started` counts the workers);
    None without GPUs."""
    with started.get_lock():
        index = started.value
        started.value += 1
    return gpus[index % len(gpus)] if gpus else None


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _predict_or_free(run_dir: str | Path, crops: str, out: str | Path, opts: InferConfig) -> str | None:
    """`predict_run`; out of GPU memory, the message, once what the attempt held is let go (its frames, the
    allocator's cache: room for the processes beside this one, or for another attempt)."""
    import torch

    from cellseg.infer.predict import predict_run

    message = None
    try:
        predict_run(run_dir, crops, out, opts)
    except torch.OutOfMemoryError as err:
        message = str(err)
    finally:
        sys.stdout.flush()  # the crop summary lines, before the report's next lines
    if message is not None:  # outside the handler: the traceback, and the tensors its frames hold, are gone
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return message


def _predict_member(run_dir: str, crops: str, out: str, opts: InferConfig) -> str:
    """One member's predictions, in a worker process; out of GPU memory, a fresh `torch.OutOfMemoryError` with
    the same message, raised once the worker has let go of what the attempt held."""
    import torch

    message = _predict_or_free(run_dir, crops, out, opts)
    if message is not None:
        raise torch.OutOfMemoryError(message)
    return out


def _out_of_memory(err: BaseException) -> bool:
    import torch

    return isinstance(err, torch.OutOfMemoryError)


def _member_error(run_dir: Path, err: BaseException) -> BaseException:
    """`err` with the member's run directory in its message, of the same type when it can be made again (the
    command line prints user errors in one line by their type)."""
    if isinstance(err, BrokenProcessPool):
        return RuntimeError(f"member {run_dir}: its prediction process ended abruptly (killed, out of memory?); "
                            "run the report again to resume the stores it left")
    message = f"member {run_dir}: {err}"
    try:
        return type(err)(message)
    except Exception:  # an exception type with other constructor arguments
        return RuntimeError(f"{type(err).__name__}: {message}")


def _predict_in_processes(members: Sequence[tuple[RunInfo, Path]], crops: str, popts: InferConfig, jobs: int,
                          skip: Callable[[RunInfo], bool] | None = None) -> list[tuple[RunInfo, Path]]:
    """Every member in `jobs` spawned processes, each submitted when a process is free (a member for which
    `skip` is true by then is left out); returns the members that ran out of GPU memory (the others go on). Any
    other failure: the first failing member (in member order among those failed when the first failure is seen)
    is raised here with its run directory, the members not yet started are dropped and those running finish
    their stores."""
    threads = max(1, len(os.sched_getaffinity(0)) // jobs)
    level = logging.getLogger("cellseg").getEffectiveLevel()
    context = multiprocessing.get_context("spawn")
    gpus = visible_gpus(popts.device)
    if len(gpus) > 1:
        log.info("predicting in %d processes over %d GPUs (%s)", jobs, len(gpus), ",".join(gpus))
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_init_worker,
                               initargs=(level, threads, os.getpid(), gpus, context.Value("i", 0)))
    queue = list(members)
    futures: dict[Future[str], tuple[RunInfo, Path]] = {}  # in member order
    pending: set[Future[str]] = set()
    short_of_memory: list[Future[str]] = []
    try:
        while queue or pending:
            while queue and len(pending) < jobs:
                run, out = queue.pop(0)
                if skip is not None and skip(run):
                    continue
                future = pool.submit(_predict_member, str(run.run_dir), crops, str(out), popts)
                futures[future] = (run, out)
                pending.add(future)
            if not pending:
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            failed = [f for f in done if f.exception()]
            short_of_memory += [f for f in failed if _out_of_memory(f.exception())]
            failed = [f for f in failed if not _out_of_memory(f.exception())]
            if failed:
                queue.clear()
                order = {f: i for i, f in enumerate(futures)}  # member order
                # a worker that raised beats those whose pool broke because another worker died
                future = min(failed, key=lambda f: (isinstance(f.exception(), BrokenProcessPool), order[f]))
                err = future.exception()
                raise _member_error(futures[future][0].run_dir, err) from err
        return [futures[f] for f in futures if f in short_of_memory]  # in member order
    finally:  # also on Ctrl-C: no member starts after this
        pool.shutdown(wait=True, cancel_futures=True)


def predict_all(runs: Sequence[RunInfo], layout: Layout, plan: CropPlan, opts: DecideOptions, *, tta: int,
                skip: Callable[[RunInfo], bool] | None = None) -> list[Path]:
    """Every run's predictions of every crop the report needs (a finished store is only checked; a store named by
    `opts.reuse` that stands for the prediction is used as it is, `cellseg.decide.reuse`), in
    `opts.predict_jobs` processes (module docstring); the stores' paths, in the order of `runs`. A run for which
    `skip` is true when its turn comes is not predicted (its store is left as it is).

    Raises:
        Whatever a member's prediction raised (in processes: the same type where possible, its message
        prefixed with the member's run directory).
        RuntimeError: a member out of GPU memory even alone on a GPU (with TTA: with one TTA pass per forward).
    """
    started = time.perf_counter()
    wanted, candidates = infer_config(opts, tta, progress=False), open_candidates(opts.reuse, runs)
    reused = {run.name: reused_store(run, candidates, plan.predicted, wanted) for run in runs}
    every = [(run, reused[run.name] or layout.predictions(run, tta)) for run in runs]
    members = [(run, out) for run, out in every
               if not reused[run.name] and store_differences(run, out, plan.predicted, wanted)]
    if len(members) < len(every):
        log.info("%d of %d members' stores (tta=%d) hold every crop from their current checkpoint: not loaded",
                 len(every) - len(members), len(every), tta)
    for _, out in members:
        out.parent.mkdir(parents=True, exist_ok=True)
    skipped: list[str] = []

    def skipping(run: RunInfo) -> bool:
        if skip is None or not skip(run):
            return False
        log.info("%s (tta=%d): not predicted, no longer needed", run.name, tta)
        skipped.append(run.name)
        return True

    crops = ",".join(plan.predicted)
    jobs = predict_jobs(opts.predict_jobs, len(members), opts.device, tta=tta) if members else 1
    if jobs == 1:
        from cellseg.infer.predict import predict_run

        popts = infer_config(opts, tta, progress=opts.progress)
        for run, out in members:
            if skipping(run):
                continue
            message = _predict_or_free(run.run_dir, crops, out, popts)
            if message is not None and tta == 1:
                raise RuntimeError(f"member {run.run_dir}: out of GPU memory alone on the GPU ({message})")
            if message is not None:  # a second time out of memory raises as it is
                log.warning("%s ran out of GPU memory: predicting again with one TTA pass per forward (resuming "
                            "the store)", run.name)
                predict_run(run.run_dir, crops, out, dataclasses.replace(popts, tta_fold=1))
    else:
        popts = infer_config(opts, tta, progress=False)
        again = _predict_in_processes(members, crops, popts, jobs, skipping)
        if again:  # alone on a GPU, one TTA pass per forward (the same predictions, to float rounding)
            alone = max(1, len(visible_gpus(opts.device)))
            log.warning("%s ran out of GPU memory beside the other members' processes: predicting again in %d "
                        "process(es), one per GPU, one TTA pass per forward (resuming the store)",
                        ", ".join(run.name for run, _ in again), alone)
            again = _predict_in_processes(again, crops, dataclasses.replace(popts, tta_fold=1), alone)
        if again:
            raise RuntimeError(f"member {again[0][0].run_dir}: out of GPU memory even alone on a GPU with one TTA "
                               "pass per forward; predict on a GPU with more memory")
    where = "in this process" if jobs == 1 else f"in {jobs} processes"
    log.info("predicted %d members (tta=%d) %s: %.1f s", len(members) - len(skipped), tta, where,
             time.perf_counter() - started)
    return [out.resolve() for _, out in every]


class BackgroundPredictions:
    """`predict_all` in a thread of its own, so that the GPU predicts while this thread does CPU work (a report's
    ensembling and weight fit); `keep` narrows the runs to predict before their turn comes (the others are
    skipped, those already begun finish), `result` waits for the predictions and raises what they raised."""

    def __init__(self, runs: Sequence[RunInfo], layout: Layout, plan: CropPlan, opts: DecideOptions, *,
                 tta: int) -> None:
        self._keep: set[Path] | None = None
        self._lock = threading.Lock()
        self._outcome: list[Path] | BaseException = RuntimeError("predictions not finished")
        self._thread = threading.Thread(target=self._run, args=(runs, layout, plan, opts, tta), daemon=True,
                                        name=f"predict-tta{tta}")
        self._thread.start()

    def _run(self, runs: Sequence[RunInfo], layout: Layout, plan: CropPlan, opts: DecideOptions, tta: int) -> None:
        try:
            self._outcome = predict_all(runs, layout, plan, opts, tta=tta, skip=self._skip)
        except BaseException as err:  # raised in `result`, on the thread that waits
            self._outcome = err

    def _skip(self, run: RunInfo) -> bool:
        with self._lock:
            return self._keep is not None and run.run_dir not in self._keep

    def keep(self, runs: Sequence[RunInfo]) -> None:
        """Predict only `runs` from now on."""
        with self._lock:
            self._keep = {run.run_dir for run in runs}

    def abandon(self) -> None:
        """Start no more members and wait for those begun (their stores finish; their errors are dropped: the
        caller is failing already)."""
        self.keep([])
        self._thread.join()

    def result(self) -> list[Path]:
        """The stores' paths of every run given (`predict_all`), once the predictions are done."""
        self._thread.join()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome
