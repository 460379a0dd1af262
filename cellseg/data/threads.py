"""How many threads a training job's set-up reads crops with: tensorstore reads and decodes chunks without holding
the GIL, so opening the crops, indexing their foreground and reading resident data overlap their reads
(`cellseg.pool.map_bounded` on threads; results in the items' order, so nothing depends on the count)."""

from __future__ import annotations

from cellseg.pool import usable_cores

MAX_READ_THREADS = 8  # beyond this the Python parts (json, planning) serialise on the GIL anyway


def read_threads() -> int:
    """This process's CPU cores (its affinity, as SLURM or taskset set it), at most `MAX_READ_THREADS`."""
    return max(1, min(MAX_READ_THREADS, usable_cores()))
