"""`map_bounded`: independent jobs on a pool of threads or spawned processes, in order, with bounded memory.

Threads suit work that releases the GIL (zarr's codecs, numpy on large arrays: `write_submission`);
processes suit work that holds it (cc3d's connected components, the scoring: `evaluate`, and
`validate_submission` on large submissions). Processes are started with `spawn` (no inherited locks or
zarr handles) and decode Blosc on one thread each; each opens its own stores from the picklable `Source`.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")
DEFAULT_BUDGET_FRACTION = 0.8  # of the memory available when a pool starts


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity (a SLURM job's allocation, `taskset`), not the whole
    machine's count (`os.cpu_count`) where the platform tells them apart."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # platforms without affinity (macOS)
        return os.cpu_count() or 1


def available_memory_bytes() -> int:
    """Memory available now (Linux `/proc/meminfo`), or 8 GiB when it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 1024**3


def default_budget() -> int:
    """The memory budget of a pool: `DEFAULT_BUDGET_FRACTION` of the memory available now."""
    return int(DEFAULT_BUDGET_FRACTION * available_memory_bytes())


# Thread pools that numerical libraries start per process, one thread per core each (OpenBLAS at numpy's import):
# idle, but about 28 processes x 32 threads on a 32-core GPU host failed to start more ("pthread_create failed").
ONE_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def one_thread_per_process() -> None:
    """Pool process initializer (spawned processes, before they import numpy): one thread for the BLAS and OpenMP
    pools (`ONE_THREAD_ENV`) and Blosc's own threads off. Each process is one of `workers` parallel jobs, but
    numcodecs lets Blosc start min(8, cores) threads in a process's main thread: 64 threads on a 16-core host
    for 8 workers, over chunks of 256 KiB."""
    for var in ONE_THREAD_ENV:
        os.environ[var] = "1"
    try:
        import numcodecs.blosc
    except ImportError:  # nothing here decodes Blosc then
        return
    numcodecs.blosc.use_threads = False


_INIT_ERROR: list[BaseException] = []  # what the initializer raised in this pool process, re-raised by every task


def _guarded_init(initializer: Callable[[], None]) -> None:
    """Run a pool process's initializer; its error is kept and raised by the process's tasks (`_task`), so that
    it reaches the parent once, as itself (an initializer that raises only breaks the pool: the parent would see
    a dead process, and retrying it fails the same way)."""
    try:
        initializer()
    except BaseException as err:  # whatever it is, the parent must see it
        err.add_note("in the initializer of a worker process (`cellseg.pool`)")
        _INIT_ERROR.append(err)


def _task(fn: Callable[[T], R], item: T) -> R:
    """Run one item in a pool process, or raise its initializer's error."""
    if _INIT_ERROR:
        raise _INIT_ERROR[0]
    return fn(item)


def _succeeded(future: Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def map_bounded(fn: Callable[[T], R], items: Sequence[T], workers: int, *, done: Callable[[], Any] | None = None,
                processes: bool = False, cost: Callable[[T], int] | None = None, budget: int | None = None,
                died: Callable[[T], R] | None = None) -> list[R]:
    """`[fn(item) for item in items]` on `workers` threads (or processes), never more than `workers` items in flight.

    Results are in the order of `items`; `done` is called in this thread as each item finishes (progress).
    `workers=1` runs in this thread without a pool. With `cost` (an item's peak bytes), items start largest
    first and only while the costs in flight sum to at most `budget`; an item costing more runs alone. The
    first error (in item order among those finishing together) is raised once the items already running
    have finished; no further item is started.

    With `processes` (spawned; `fn` and the items must pickle), a process that dies (killed for memory)
    breaks the pool: the items then in flight run again in a fresh pool, one at a time, and an item whose
    process dies while it runs alone gets `died(item)` as its result (without `died`, `BrokenProcessPool`
    is raised).

    Raises:
        ValueError: `workers` < 1.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    results: list[Any] = [None] * len(items)

    def finish(i: int, result: Any) -> None:
        results[i] = result
        if done is not None:
            done()

    if workers == 1:
        for i, item in enumerate(items):
            finish(i, fn(item))
        return results
    costs = [0] * len(items) if cost is None else [cost(item) for item in items]
    limit = float("inf") if budget is None else budget
    need = [min(c, limit) for c in costs]
    pending = sorted(range(len(items)), key=lambda i: -costs[i])  # stable: item order among equals
    alone: set[int] = set()  # in flight when a process died: run again one at a time
    running: dict[Future[Any], int] = {}
    used = 0
    new_pool = functools.partial(ProcessPoolExecutor, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_guarded_init, initargs=(one_thread_per_process,)
                                 ) if processes else ThreadPoolExecutor
    pool = new_pool(max_workers=workers)
    try:
        while pending or running:
            for i in list(pending):
                if len(running) >= workers or not alone.isdisjoint(running.values()):
                    break
                if running and (i in alone or used + need[i] > limit):
                    continue
                pending.remove(i)
                running[pool.submit(_task, fn, items[i]) if processes else pool.submit(fn, items[i])] = i
                used += need[i]
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in sorted(finished, key=running.__getitem__):
                i = running.pop(future)
                used -= need[i]
                try:
                    finish(i, future.result())
                except BrokenProcessPool:
                    pool.shutdown(cancel_futures=True)  # every future of a broken pool is settled
                    victims = sorted([i, *(j for f, j in running.items() if not _succeeded(f))])
                    for f, j in running.items():
                        if _succeeded(f):
                            finish(j, f.result())
                    running.clear()
                    used = 0
                    if victims == [i]:  # it ran alone (or was the only one not to finish): its process died
                        if died is None:
                            raise
                        finish(i, died(items[i]))
                    else:
                        alone.update(victims)
                        pending = victims + pending
                    pool = new_pool(max_workers=workers)
                    break
    finally:
        pool.shutdown(cancel_futures=True)
    return results
