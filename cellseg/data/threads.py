"""Reading many crops at once in threads: tensorstore reads and decodes chunks without holding the GIL, so a
training job's set-up (opening the crops, indexing their foreground, reading resident data) overlaps its reads
instead of waiting on one array at a time. Results keep the items' order, so nothing depends on the threads."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
MAX_READ_THREADS = 8  # beyond this the Python parts (json, planning) serialise on the GIL anyway


def read_threads() -> int:
    """Threads for set-up reads: this process's CPU cores (its affinity, as SLURM or taskset set it; all cores
    where the platform has no affinity, e.g. macOS), at most 8."""
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return max(1, min(MAX_READ_THREADS, cores))


def ordered_map(fn: Callable[[T], R], items: Sequence[T], threads: int | None = None) -> list[R]:
    """`[fn(x) for x in items]`, run in `threads` threads (default `read_threads()`); the first exception in
    item order is raised."""
    threads = read_threads() if threads is None else threads
    if threads <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(threads, len(items)), thread_name_prefix="cellseg-read") as pool:
        return list(pool.map(fn, items))
