"""From a probability store to a segmentation store, crop by crop (what `cellseg postprocess` runs).

Each class channel of the input becomes one output channel: a uint8 0/1 mask for semantic classes, uint32
object ids for instance classes (their `<class>_boundary` channel, when present, feeds the seeds and is
not written). `segment_class` (`cellseg.postprocess.native`) chooses the implementation: device "cpu" runs
the CPU path (numpy, cc3d, scipy), any torch device ("cuda", "cuda:1") the torch path; both give the same
arrays.

Where the output lies (`grid`):
- "annotation" (default): each (crop, class) on its annotation grid (`cellseg.postprocess.annotation`), decoded
  there by `cellseg.postprocess.native` (probability interpolated linearly, ids of the model-grid decoding),
  in z-slabs; a channel whose grid differs from the crop's is stored with its own (`PredictionStore.grid`);
- "model": on the probability's own grid, as the model predicted it (`cellseg submit` then nearest-upsamples).

A class with a hierarchy option (`cellseg.postprocess.hierarchy`) has its probability edited on the model grid from
the crop's other predicted classes before it is decoded, on either grid.

Classes named `plain` (those a decisions file keeps on the plain decoding: `cellseg.decide`) are decoded as the
evaluators read a binary prediction (`plain_params`: `p > 0.5`, instance classes as 26-connected components, no
hierarchy option), while the other classes' hierarchy options still read their rivals' tuned thresholds: the
result is, class by class, the tuned decoding of every class or the plain one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cellseg.classes import is_instance
from cellseg.data.crops import Crop
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import CropWriter, PredictionStore, boundary_channel, grid_to_json
from cellseg.data.write import DEFAULT_CHUNK
from cellseg.pool import map_bounded, usable_cores
from cellseg.postprocess.annotation import AnnotationGrids, most_common
from cellseg.postprocess.hierarchy import Rivals, crop_rivals, edited_probability
from cellseg.postprocess.native import (
    SLAB_VOXELS,
    decode_coarse,
    finish_on_grid,
    iter_decode,
    piece_limit,
    plain_params,
    segment_class,
    slab_planes,
)
from cellseg.postprocess.params import ClassParams, ParamSet

log = logging.getLogger(__name__)
ALGORITHM = "cellseg.postprocess/1"  # bump when a change alters any output voxel
DECODER = "cellseg.postprocess.native/1"  # the same for the decoding on annotation grids
GridMode = Literal["annotation", "model"]
GRID_MODES: tuple[str, ...] = ("annotation", "model")
CLASS_MEMORY_BYTES = 32 * 2**30  # host memory the classes in flight may use (as the ensemble's channels)
MAX_CLASS_THREADS = 8  # classes of a crop read, segmented and written at once
_GPU_LOCK = threading.Lock()  # see `_device_lock`


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


def class_params(params: ParamSet, name: str, plain: Collection[str] = ()) -> ClassParams:
    """The parameters `name` is decoded with: `plain_params` for a class of `plain`, else `params`'."""
    return plain_params(name) if name in plain else params.get(name)


def _class_settings(params: ParamSet, classes: Sequence[str], plain: Collection[str] = ()
                    ) -> dict[str, dict[str, Any]]:
    """Class → its settings, as recorded in the output's provenance (no `hierarchy` key when off, as before the
    option existed, so such stores still resume; "plain": true for a class of `plain`)."""
    settings = {}
    for c in classes:
        chosen = class_params(params, c, plain)
        settings[c] = {"kind": chosen.kind, **dataclasses.asdict(chosen), **({"plain": True} if c in plain else {})}
    for entry in settings.values():
        if entry["hierarchy"] is None:
            del entry["hierarchy"]
    return settings


def _open_output(out: Path, pred: PredictionStore, params: ParamSet, *, grid: GridMode,
                 overwrite: bool, plain: Collection[str] = (), provenance: Mapping[str, Any] | None = None
                 ) -> PredictionStore:
    """Create the segmentation store, or reopen one written by the same source and settings (resume)."""
    classes = list(pred.classes)
    settings = {"algorithm": ALGORITHM, "source": str(pred.path.resolve()),
                "classes": _class_settings(params, classes, plain), "grid": grid}
    if grid == "annotation":
        settings["decoder"] = DECODER
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
                  "scores": {c: dict(s) for c, s in params.scores.items()}, "source_provenance": pred.provenance,
                  **dict(provenance or {})}
    if pred.provenance.get("data_root"):
        provenance["data_root"] = pred.provenance["data_root"]
    return PredictionStore.create(out, kind="segmentation", channels=classes,
                                  instance_channels=[c for c in classes if is_instance(c)], provenance=provenance,
                                  overwrite=overwrite)


def _device_lock(device: str) -> contextlib.AbstractContextManager[Any]:
    """One class at a time on a GPU (its temporaries are several volumes of the crop); no lock on the CPU."""
    return _GPU_LOCK if device != "cpu" else contextlib.nullcontext()


class _Hierarchy:
    """What the hierarchy options of a crop's classes read: the crop's predicted classes, their probabilities and
    thresholds, and its `Rivals` (built once, on first use, for every class with "argmax")."""

    def __init__(self, pred: PredictionStore, crop: str, classes: Sequence[str], params: ParamSet):
        self.pred, self.crop, self.classes, self.params = pred, crop, list(classes), params
        self._rivals: Rivals | None = None
        self._lock = threading.Lock()

    def threshold(self, name: str) -> float:
        return self.params.get(name).threshold

    def read(self, name: str) -> np.ndarray:
        return read_class(self.pred, self.crop, name)[0]

    def rivals(self) -> Rivals:
        with self._lock:
            if self._rivals is None:
                self._rivals = crop_rivals(self.classes, threshold_of=self.threshold, read=self.read)
            return self._rivals

    def edit(self, name: str, prob: np.ndarray) -> np.ndarray:
        return edited_probability(name, self.params.get(name).hierarchy, prob, present=self.classes,
                                  threshold_of=self.threshold, read=self.read, rivals=self.rivals)


def _segment_one(pred: PredictionStore, crop: str, name: str, writer: CropWriter, *, params: ParamSet,
                 device: str, hierarchy: _Hierarchy | None = None, plain: Collection[str] = ()) -> int | None:
    """Read, segment and write one class of one crop on the writer's grid of that channel; its object count."""
    source, target = pred.grid(crop), writer.grid_of(name)
    prob, boundary = read_class(pred, crop, name)
    chosen = class_params(params, name, plain)
    if hierarchy is not None and chosen.hierarchy:
        prob = hierarchy.edit(name, prob)
    instance = is_instance(name)
    if target == source:
        with _device_lock(device):
            labels = segment_class(name, prob, boundary, voxel_size_nm=source.voxel_size_nm, params=chosen,
                                   device=device)
        del prob, boundary
        writer.write(name, labels)
        return int(labels.max(initial=0)) if instance else None
    with _device_lock(device):
        coarse = decode_coarse(name, prob, boundary, voxel_size_nm=source.voxel_size_nm, params=chosen,
                               device=device)
    del prob, boundary
    if _decoded_whole(name, source, target):
        writer.write(name, finish_on_grid(coarse, source, target))
        return coarse.num_objects
    for z0, slab in iter_decode(coarse, source, target, planes=_planes(target)):
        writer.write(name, slab, offset=(z0, 0, 0))
    return coarse.num_objects if instance else None


def _decoded_whole(name: str, source: Grid, target: Grid) -> bool:
    """An instance class on a grid finer than its source is decoded in one piece, not in slabs: step 5 of
    `cellseg.postprocess.native` looks at the pieces of each id over the whole crop."""
    return is_instance(name) and piece_limit(source, target) > 0


def _planes(target: Grid) -> int:
    """Slab planes: whole store chunks along z where `SLAB_VOXELS` allows one."""
    return slab_planes(target, SLAB_VOXELS, multiple=DEFAULT_CHUNK)


def postprocess_store(pred: PredictionStore, out: str | os.PathLike[str], *, params: ParamSet,
                      device: str = "auto", overwrite: bool = False, progress: bool = True,
                      workers: int | None = None, grid: GridMode = "annotation", data_root: str | None = None,
                      crops: Mapping[int, Crop] | None = None, plain: Collection[str] = (),
                      provenance: Mapping[str, Any] | None = None) -> PredictionStore:
    """Segment every crop of a probability store into a segmentation store (resuming finished crops).

    The classes of a crop go through `workers` threads (default: as many as the cores and `CLASS_MEMORY_BYTES`
    allow): each reads its probabilities, segments them and writes the result, so reading and writing (zarr
    decompression and compression: most of the time) overlap across classes; the segmentation itself runs one
    class at a time on a GPU (`_GPU_LOCK`). The result does not depend on `workers`.

    Args:
        grid: "annotation" or "model" (module docstring).
        data_root: where the annotation grids are looked up (default: the store's recorded data root).
        crops: annotation geometry of these crops, overriding the data root's (e.g. a truth store's).
        plain: classes decoded plainly (`plain_params`, no hierarchy option; module docstring).
        provenance: recorded beside the settings in the output's provenance (e.g. the decisions applied).

    Raises:
        ValueError: the parameters name classes the store lacks; `out` exists with other settings; `workers` < 1;
            an unknown `grid`.
    """
    from tqdm import tqdm


    if grid not in GRID_MODES:
        raise ValueError(f"grid must be one of {GRID_MODES}, got {grid!r}")
    params.check_classes(pred.classes, store=str(pred.path))
    done = pred.completed()
    if not done:
        raise ValueError(f"{pred.path}: no complete crops to post-process")
    device = resolve(device)
    unknown = sorted(set(plain) - set(pred.classes))
    if unknown:
        raise ValueError(f"{pred.path}: classes {unknown} to decode plainly are not in the store "
                         f"({list(pred.classes)})")
    seg = _open_output(Path(out), pred, params, grid=grid, overwrite=overwrite, plain=plain, provenance=provenance)
    annotation = AnnotationGrids(data_root or pred.provenance.get("data_root"), crops) if grid == "annotation" else None
    todo = [c for c in done if c not in seg]
    for crop in tqdm(todo, desc="postprocess", unit="crop", disable=not progress):
        classes = [c for c in pred.classes if c in pred.crop_channels(crop)]  # a test crop: its scored classes
        grids = annotation.of(pred, crop, classes) if annotation else dict.fromkeys(classes, pred.grid(crop))
        segment_crop(pred, crop, seg, params=params, grids=grids, device=device, workers=workers,
                     attrs={"grid": grid}, plain=plain)
    if len(todo) < len(done):
        log.info("%d crops were already written", len(done) - len(todo))
    return seg


def segment_crop(pred: PredictionStore, crop: str, seg: PredictionStore, *, params: ParamSet,
                 grids: Mapping[str, Grid], device: str, workers: int | None = None,
                 attrs: Mapping[str, Any] | None = None, plain: Collection[str] = ()) -> dict[str, int]:
    """Segment the classes `grids` names of one crop, each on its grid, into `seg` (committed with the source
    crop's attributes, `attrs` and timings under "postprocess"); returns class → object count (instance classes).

    The classes go through `workers` threads (default `class_workers`); `device` is a resolved one ("cpu",
    "cuda", "cuda:N").
    """
    start = time.perf_counter()
    source = pred.grid(crop)
    classes = list(grids)
    writer = seg.crop_writer(crop, most_common(list(grids.values())), channels=classes, grids=grids)
    slab = max((math.prod(g.shape_vox[1:]) * _planes(g) for g in grids.values() if g != source), default=0)
    whole = max((math.prod(g.shape_vox) for c, g in grids.items() if _decoded_whole(c, source, g)), default=0)
    edits = any(class_params(params, c, plain).hierarchy for c in classes)
    hierarchy = _Hierarchy(pred, crop, classes, params) if edits else None
    threads = workers or class_workers(math.prod(source.shape_vox), slab, whole, hierarchy=edits)
    try:
        counts = map_bounded(lambda name: _segment_one(pred, crop, name, writer, params=params, device=device,
                                                       hierarchy=hierarchy, plain=plain), classes, threads)
    except ValueError:  # refused input (NaN probabilities): nothing of the crop is kept; a kill keeps it to resume
        writer.discard()
        raise
    objects = {name: n for name, n in zip(classes, counts, strict=True) if n is not None}
    seconds = time.perf_counter() - start
    crop_attrs = {k: v for k, v in pred.crop_attrs(crop).items() if k not in ("grid", "channels", "channel_grids")}
    crop_attrs["postprocess"] = {"objects": objects, "seconds": round(seconds, 3), "device": device,
                                 "model_grid": grid_to_json(source), **dict(attrs or {})}
    writer.commit(crop_attrs)
    summary = ", ".join(f"{k} {v}" for k, v in objects.items()) or "no instance classes"
    log.info("%s: %d classes on %s in %.2f s, %d threads (objects: %s)", crop, len(classes), device, seconds,
             threads, summary)
    return objects


# Bytes per voxel of a class in flight: on the model grid float32 probability and boundary and uint32 ids; per
# target voxel of a slab (annotation grids), its ids and the source planes on the target's (y, x) grid
# (`cellseg.postprocess.native`, upsampling; a coarser target is smaller than its model grid anyway).
# A hierarchy option adds the edited copy, one partner's probability and a temporary (float32 each).
MODEL_BYTES_PER_VOXEL = 12
SLAB_BYTES_PER_VOXEL = 8
PIECE_BYTES_PER_VOXEL = 17  # a whole instance class on its target grid: ids, the slab planes, pieces, a mask
HIERARCHY_BYTES_PER_VOXEL = 12


def class_workers(voxels: int, slab_voxels: int = 0, whole_voxels: int = 0, *, hierarchy: bool = False) -> int:
    """Threads `postprocess_store` gives a crop of `voxels` (model grid) decoded in slabs of `slab_voxels` target
    voxels, or whole (`whole_voxels`: an instance class on a finer grid, `native` step 5): the cores (at most 8),
    fewer when their classes in flight would pass `CLASS_MEMORY_BYTES`."""
    per_voxel = MODEL_BYTES_PER_VOXEL + HIERARCHY_BYTES_PER_VOXEL * hierarchy
    per_class = per_voxel * voxels + max(SLAB_BYTES_PER_VOXEL * slab_voxels, PIECE_BYTES_PER_VOXEL * whole_voxels)
    return max(1, min(usable_cores(), MAX_CLASS_THREADS, CLASS_MEMORY_BYTES // max(1, per_class)))
