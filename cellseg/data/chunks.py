"""Which chunks of a local zarr array hold data: present on disk, known absent at the source, or never fetched.

A partial download (`cellseg fetch`, the official `csc fetch-data`) mirrors the metadata of every EM level but
the chunks only of the levels and boxes it was asked for. zarr and tensorstore read a chunk file that does not
exist as the fill value (0 for EM), so a level whose chunks were never fetched reads as an all-black volume,
silently. A chunk that is absent *at the source* (empty space the server never stored) is legitimate and is
recorded by `cellseg fetch` in a per-array ledger, `<array>/.cellseg-fetch.json` (`LEDGER`).

`coverage` tells, for a box of an array, the fraction of the chunks covering it that hold data (present on disk
or known absent at the source). Remote arrays (http, s3) always count as covered: there an absent chunk is the
server's fill value, not a missing download.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

LEDGER = ".cellseg-fetch.json"  # per array: chunk keys known to be absent at the source (`cellseg.fetch`)


def chunk_keys(ranges: Sequence[tuple[int, int]], *, chunks: Sequence[int], separator: str) -> tuple[str, ...]:
    """Keys (`"1.0.2"` or `"1/0/2"`) of the chunks that intersect the voxel index box `ranges` (`[start, stop)`
    per axis, z, y, x); none for an empty box."""
    if any(hi <= lo for lo, hi in ranges):
        return ()
    per_axis = [range(lo // c, (hi - 1) // c + 1) for (lo, hi), c in zip(ranges, chunks, strict=True)]
    return tuple(separator.join(map(str, index)) for index in itertools.product(*per_axis))


def read_ledger(array_dir: Path) -> set[str]:
    """Chunk keys recorded as absent at the source for the array in `array_dir`.

    Raises:
        ValueError: the ledger exists but is not valid.
    """
    path = Path(array_dir) / LEDGER
    if not path.is_file():
        return set()
    try:
        return set(json.loads(path.read_text())["absent"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: corrupt fetch ledger ({err}); delete it to re-check absent chunks") from None


@functools.lru_cache(maxsize=4096)
def _is_complete(array_dir: str, num_chunks: int, separator: str) -> bool:
    """True when every chunk of the array exists on disk (counted once per process: then no per-read checks)."""
    if separator == "/":
        found = sum(1 for _, _, files in os.walk(array_dir) for f in files if not f.startswith("."))
    else:
        found = sum(1 for e in os.scandir(array_dir) if e.is_file() and not e.name.startswith("."))
    return found >= num_chunks


@functools.lru_cache(maxsize=4096)
def _ledger(array_dir: str) -> frozenset[str]:
    return frozenset(read_ledger(Path(array_dir)))


def coverage(array_dir: str | os.PathLike[str], zarray: dict, ranges: Sequence[tuple[int, int]]) -> float:
    """Fraction of the chunks covering `ranges` (voxel `[start, stop)` per axis, clipped to the array) of a local
    array that hold data: present on disk or known absent at the source. 1.0 for a box outside the array.

    Args:
        array_dir: the array's folder (holding `.zarray`).
        zarray: its parsed `.zarray` (`shape`, `chunks`, `dimension_separator`).
    """
    shape, chunks = [int(n) for n in zarray["shape"]], [int(c) for c in zarray["chunks"]]
    separator = zarray.get("dimension_separator") or "."
    clipped = [(max(0, lo), min(n, hi)) for (lo, hi), n in zip(ranges, shape, strict=True)]
    if any(hi <= lo for lo, hi in clipped):
        return 1.0
    folder = str(array_dir)
    if _is_complete(folder, math.prod(-(-n // c) for n, c in zip(shape, chunks, strict=True)), separator):
        return 1.0
    keys = chunk_keys(clipped, chunks=chunks, separator=separator)
    absent = _ledger(folder)
    held = sum(1 for k in keys if k in absent or os.path.isfile(os.path.join(folder, k)))
    return held / len(keys)


def forget() -> None:
    """Drop the per-process caches (after a download changed the files)."""
    _is_complete.cache_clear()
    _ledger.cache_clear()
