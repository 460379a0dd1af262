"""From a probability store to a segmentation store, crop by crop (what `cellseg postprocess` runs).

Each class channel of the input becomes one output channel: a uint8 0/1 mask for semantic classes, uint32
object ids for instance classes (their `<class>_boundary` channel, when present, feeds the seeds and is
not written). `segment_class` (in `native`) chooses the implementation: device "cpu" runs the CPU path (numpy, cc3d,
scipy), any torch device ("cuda", "cuda:1") the torch path; both give the same arrays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cellseg.classes import is_instance
from cellseg.data.grid import Grid
from cellseg.infer.store import CropWriter, PredictionStore, boundary_channel
from cellseg.postprocess.native import segment_class
from cellseg.postprocess.params import ParamSet

log = logging.getLogger(__name__)
ALGORITHM = "cellseg.postprocess/1"  # bump when a change alters any output voxel
CLASS_MEMORY_BYTES = 32 * 2**30  # host memory the classes in flight may use (as the ensemble's channels)
MAX_CLASS_THREADS = 8  # classes of a crop read, segmented and written at once
_GPU_LOCK = threading.Lock()  # one class at a time on a GPU: its temporaries are several volumes of the crop


def resolve(device: str) -> str:
    """"auto" → "cuda" when torch sees a GPU, else "cpu"; other names are checked.

    Raises:
        ValueError: an unknown device name, or "cuda" without a GPU.
    """
    if device == "cpu":
        return device
    from cellseg.postprocess.gpu import resolve_device

    if device != "auto" and not device.startswith("cuda"):
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {device!r}")
    return str(resolve_device(device))


def read_class(store: PredictionStore, crop: str, class_name: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(probability, boundary probability or None) of one class of one crop, float32.

    Raises:
        ValueError: NaN or infinite probabilities (thresholded, they would silently become empty masks); the
            message names the store, crop and channel.
    """
    aux = boundary_channel(class_name)
    boundary = store.read(crop, aux) if is_instance(class_name) and aux in store.crop_channels(crop) else None
    prob = store.read(crop, class_name)
    for name, data in ((class_name, prob), (aux, boundary)):
        if data is not None and (bad := int(np.count_nonzero(~np.isfinite(data)))):
            raise ValueError(f"{store.path}/{crop}/{name}: {bad} NaN or infinite probabilities; refusing to "
                             "segment them (check the prediction or ensemble that wrote this store)")
    return prob, boundary


def open_probabilities(path: str | os.PathLike[str]) -> PredictionStore:
    """Open a probability store.

    Raises:
        FileNotFoundError: no such directory.
        ValueError: not a prediction store, or a segmentation store (already post-processed).
    """
    store = PredictionStore.open(path)
    if store.kind != "probabilities":
        raise ValueError(f"{store.path}: holds {store.kind}, not probabilities; postprocess reads what "
                         "`cellseg predict` or `cellseg ensemble` wrote")
    if not store.classes:
        raise ValueError(f"{store.path}: no class channels (channels: {list(store.channels)})")
    return store


def _class_settings(params: ParamSet, classes: Sequence[str]) -> dict[str, dict[str, Any]]:
    return {c: {"kind": params.get(c).kind, **dataclasses.asdict(params.get(c))} for c in classes}


def _open_output(out: Path, pred: PredictionStore, params: ParamSet, *, overwrite: bool) -> PredictionStore:
    """Create the segmentation store, or reopen one written by the same source and settings (resume)."""
    classes = list(pred.classes)
    settings = {"algorithm": ALGORITHM, "source": str(pred.path.resolve()),
                "classes": _class_settings(params, classes)}
    if out.exists() and not overwrite:
        try:
            existing = PredictionStore.open(out)
        except ValueError as err:
            raise ValueError(f"{out} exists and is not a segmentation store (use --overwrite to replace it)") from err
        if existing.kind != "segmentation" or existing.provenance.get("postprocess") != settings:
            raise ValueError(f"{out} exists with other contents or settings; use --overwrite to replace it")
        log.info("%s: resuming (%d crops already written)", out, len(existing.completed()))
        return existing
    provenance = {"postprocess": settings, "era": params.era, "tuned_on": dict(params.tuned_on),
                  "scores": {c: dict(s) for c, s in params.scores.items()}, "source_provenance": pred.provenance}
    return PredictionStore.create(out, kind="segmentation", channels=classes,
                                  instance_channels=[c for c in classes if is_instance(c)], provenance=provenance,
                                  overwrite=overwrite)


def postprocess_store(pred: PredictionStore, out: str | os.PathLike[str], *, params: ParamSet,
                      device: str = "auto", overwrite: bool = False, progress: bool = True,
                      workers: int | None = None) -> PredictionStore:
    """Segment every crop of a probability store into a segmentation store (resuming finished crops).

    The classes of a crop go through `workers` threads (default: as many as the cores and `CLASS_MEMORY_BYTES`
    allow): each reads its probabilities, segments them and writes the result, so reading and writing (zarr
    decompression and compression: most of the time) overlap across classes; the segmentation itself runs one
    class at a time on a GPU (`_GPU_LOCK`). The result does not depend on `workers`.

    Raises:
        ValueError: the parameters name classes the store lacks; `out` exists with other settings; `workers` < 1.
    """
    from tqdm import tqdm

    from cellseg.eval.submit import map_bounded

    params.check_classes(pred.classes, store=str(pred.path))
    crops = pred.completed()
    if not crops:
        raise ValueError(f"{pred.path}: no complete crops to post-process")
    device = resolve(device)
    seg = _open_output(Path(out), pred, params, overwrite=overwrite)
    todo = [c for c in crops if c not in seg]
    for crop in tqdm(todo, desc="postprocess", unit="crop", disable=not progress):
        start = time.perf_counter()
        grid = pred.grid(crop)
        classes = [c for c in pred.classes if c in pred.crop_channels(crop)]  # a test crop: its scored classes
        writer = seg.crop_writer(crop, grid, channels=classes)

        def one(name: str, writer: CropWriter = writer, crop: str = crop, grid: Grid = grid) -> int | None:
            prob, boundary = read_class(pred, crop, name)
            with _GPU_LOCK if device != "cpu" else contextlib.nullcontext():
                labels = segment_class(name, prob, boundary, voxel_size_nm=grid.voxel_size_nm,
                                       params=params.get(name), device=device)
            del prob, boundary
            writer.write(name, labels)
            return int(labels.max(initial=0)) if is_instance(name) else None

        threads = workers or class_workers(math.prod(grid.shape_vox))
        counts = map_bounded(one, classes, threads)
        objects = {name: n for name, n in zip(classes, counts, strict=True) if n is not None}
        seconds = time.perf_counter() - start
        attrs = {k: v for k, v in pred.crop_attrs(crop).items() if k != "grid"}
        attrs["postprocess"] = {"objects": objects, "seconds": round(seconds, 3), "device": device}
        writer.commit(attrs)
        summary = ", ".join(f"{k} {v}" for k, v in objects.items()) or "no instance classes"
        log.info("%s: %d classes on %s in %.2f s, %d threads (objects: %s)", crop, len(classes), device, seconds,
                 threads, summary)
    if len(todo) < len(crops):
        log.info("%d crops were already written", len(crops) - len(todo))
    return seg


def class_workers(voxels: int) -> int:
    """Threads `postprocess_store` gives a crop of `voxels`: the cores (at most 8), fewer when their classes in
    flight (float32 probability and boundary, uint32 ids: 12 bytes a voxel each) would pass `CLASS_MEMORY_BYTES`."""
    return max(1, min(os.cpu_count() or 1, MAX_CLASS_THREADS, CLASS_MEMORY_BYTES // max(1, 12 * voxels)))
