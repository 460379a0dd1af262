"""Bookkeeping shared by the stages: wall-time records, failures recorded instead of raised, the training
backend flags undone, voxel counts of prediction stores, and a stage's cost model (per item + per voxel)."""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def timed(record: dict[str, Any], key: str = "seconds") -> Iterator[None]:
    """Store the wall time of the block in `record[key]` (the stages return host arrays: GPU work is done)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        record[key] = time.perf_counter() - start


def attempt(record: dict[str, Any], fn: Callable[[], dict[str, Any]]) -> bool:
    """Run a stage into `record`; a failure (out of memory included) is recorded, not raised."""
    import torch

    try:
        record.update(fn())
        record["status"] = "ok"
        return True
    except (RuntimeError, ValueError, OSError) as err:  # torch.OutOfMemoryError is a RuntimeError
        record.update(status="error", error=f"{type(err).__name__}: {str(err)[:500]}")
        print(f"    failed: {record['error'][:200]}", flush=True)
        return False
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


@contextlib.contextmanager
def restored_backends() -> Iterator[None]:
    """Undo the backend flags `build_setup` sets for training (TF32, cuDNN autotuning): a `cellseg predict`
    process runs with the ones it started with."""
    import torch

    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.get_float32_matmul_precision())
    try:
        yield
    finally:
        (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
         precision) = saved
        torch.set_float32_matmul_precision(precision)


def store_voxels(path: Path) -> int:
    """Voxels over every crop of a prediction store (one channel)."""
    from cellseg.data.prediction_store import PredictionStore

    store = PredictionStore.open(path)
    return sum(math.prod(store.grid(c).shape_vox) for c in store.completed())


def store_channel_voxels(path: Path) -> int:
    """Voxels × channels over every crop of a prediction store (each crop holds its scored channels)."""
    from cellseg.data.prediction_store import PredictionStore

    store = PredictionStore.open(path)
    return sum(math.prod(store.grid(c).shape_vox) * len(store.crop_channels(c)) for c in store.completed())


def cost_model(record: dict[str, Any], *, per_item: float, items: int, key: str) -> dict[str, Any]:
    """Add a stage's cost model: `per_item` seconds per crop or array, the rest of its time per `key` voxel."""
    rest = max(0.0, record["seconds"] - per_item * items)
    return {**record, "items": items, "per_item_seconds": per_item, "per_voxel_seconds": rest / record[key],
            "mvox_per_s": record[key] / 1e6 / record["seconds"]}
