"""The predict stages: `predict_run` per run with its steady-state probe, or one `predict_ensemble` of every run
(`--fused`), each timed with its model loads and compile warm-up apart."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.studies.test_set.layout import MEASURE_RECIPE, QUICK_STEADY, REPO, STEADY_BOX, TTA, load_infer
from bench.studies.test_set.records import store_channel_voxels, store_voxels, timed
from bench.studies.test_set.steady import steady_probe
from cellseg.config.inference import InferConfig
from cellseg.data.inspect import disk_bytes


def measure_opts(device: str) -> InferConfig:
    """The measured recipe, compiled: the real test set is a job `compile: auto` compiles (≥ 20 Gvoxels of model
    input per member), and the small warm-up crop must compile too, so that the timed run holds no compilation."""
    return dataclasses.replace(load_infer(MEASURE_RECIPE), checkpoint="last", device=device, progress=False,
                               compile="on")


def predict_model(run_dir: Path, store: Path, *, device: str, warmup: tuple[str, Path] | None,
                  patch_vox: Sequence[int], probe_channels: int, quick: bool = False) -> dict[str, Any]:
    """`predict_run` over the test crops (wall, model load, compile, per-crop compute, tiles), then the
    steady-state probe (`steady_probe`)."""
    import torch

    from cellseg.data.prediction_store import PredictionStore
    from cellseg.infer.predict import predict_run
    from cellseg.infer.run import load_run

    opts = measure_opts(device)
    record: dict[str, Any] = {}
    if warmup is not None:  # torch.compile and cuDNN autotuning on the smallest crop, outside the timed run
        with timed(record, "warmup_seconds"):
            predict_run(run_dir, warmup[0], warmup[1], opts)
    with timed(record, "load_seconds"):
        run = load_run(run_dir, "last", device=device)  # the load `predict_run` starts with
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with timed(record):
        summaries = predict_run(run_dir, "test", store, opts)
    pred = PredictionStore.open(store)
    crops = [(pred.grid(c).shape_vox, len(pred.crop_channels(c))) for c in pred.completed()]
    compute = sum(s.get("seconds", 0.0) for s in summaries) or record["seconds"] - record["load_seconds"]
    voxels = sum(math.prod(shape) for shape, _ in crops)
    tiles = sum(s["tiles"] for s in summaries)
    record.update(crops=len(crops), voxels=voxels, tiles=tiles, tta=TTA, overlap=opts.overlap,
                  patch_shape_vox=list(patch_vox), channels=list(run.channels), device=device,
                  compute_seconds=compute, other_seconds=max(0.0, record["seconds"] - record["load_seconds"] - compute),
                  mvox_per_s=voxels / 1e6 / (record["seconds"] - record["load_seconds"]),
                  compute_mvox_per_s=voxels / 1e6 / compute, tiles_per_s=tiles / compute, bytes=disk_bytes(store))
    if device == "cuda":
        record["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        record["gpu_total_bytes"] = torch.cuda.get_device_properties().total_memory  # plans the real crops' columns
    del run
    record["steady"] = steady_probe(run_dir, store.parent, device=device, channels=probe_channels,
                                    batch=int(summaries[0].get("batch", 1)) if summaries else 1, quick=quick)
    return record


def fused_stage(builds: Mapping[str, Mapping[str, Any]], work: Path, *, device: str, warm_crop: str,
                steady: Mapping[str, Mapping[str, Any]], previous_job: bool = False) -> dict[str, Any]:
    """`predict_ensemble` of every built run over the test crops (uniform weights, TTA 8, as `cellseg
    predict-ensemble`), after a warm-up on the smallest crop (loading and compiling every member); then the
    largest crop's channels written again into a fresh store, for the write cost per channel-voxel.

    `previous_job`: before the warm-up, `cellseg predict-ensemble` of the smallest crop in a process of its own
    (a validation job with the same members), which leaves its compiled graphs in the compile cache; the
    warm-up then loads them as a test-set job would."""
    import torch

    from cellseg.data.prediction_store import PredictionStore
    from cellseg.infer.fused import predict_ensemble

    runs = [Path(b["run_dir"]) for b in builds.values()]
    opts = measure_opts(device)
    record: dict[str, Any] = {"members": {n: {"patch_shape_vox": b["patch_shape_vox"], "channels": b["channel_names"],
                                              "batch_size": b["batch_size"], **({"steady": steady[n]} if n in steady else {})}
                                          for n, b in builds.items()}}
    if device == "cuda":
        if previous_job:
            command = [sys.executable, "-m", "cellseg", "-q", "predict-ensemble", *map(str, runs), "--crops", warm_crop,
                       "--out", str(work / "warmup" / "previous_job.zarr"), "--checkpoint", "last", "--tta", str(TTA)]
            with timed(record, "previous_job_seconds"):
                path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
                subprocess.run(command, check=True, env={**os.environ, "PYTHONPATH": path})
        with timed(record, "warmup_seconds"):
            predict_ensemble(runs, warm_crop, work / "warmup" / "fused.zarr", opts=opts)
        record["compile_cache"] = "warm (a previous job)" if previous_job else "cold"
        torch.cuda.reset_peak_memory_stats()
    out = work / "fused.zarr"
    with timed(record):
        summaries = predict_ensemble(runs, "test", out, opts=opts)
    compute = sum(s["seconds"] for s in summaries)
    store = PredictionStore.open(out)
    record.update(crops=len(summaries), tiles=sum(s["tiles"] for s in summaries), compute_seconds=compute,
                  load_seconds=max(0.0, record["seconds"] - compute), voxels=store_voxels(out),
                  channel_voxels=store_channel_voxels(out), bytes=disk_bytes(out), overlap=opts.overlap, tta=TTA,
                  device=device, crop_seconds={s["crop"]: s["seconds"] for s in summaries})
    if device == "cuda":
        record["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        record["gpu_total_bytes"] = torch.cuda.get_device_properties().total_memory
    # The write probe: the largest crop's ensemble channels repeated to fill the steady box (its values, so its
    # compressibility), written as `predict-ensemble` writes a crop; the synthetic crops are too small to time.
    import numpy as np

    from cellseg.data.grid import Grid

    largest = max(store.completed(), key=lambda c: math.prod(store.grid(c).shape_vox) * len(store.crop_channels(c)))
    channels = store.crop_channels(largest)
    shape = QUICK_STEADY if device == "cpu" else STEADY_BOX
    arrays = {c: np.resize(store.read(largest, c).astype(np.float16), shape) for c in channels}
    grid = Grid(translation_nm=(4.0, 4.0, 4.0), shape_vox=shape, voxel_size_nm=(8.0, 8.0, 8.0))  # type: ignore[arg-type]
    again = PredictionStore.create(work / "rewrite.zarr", kind="probabilities", channels=store.channels,
                                   instance_channels=store.instance_channels, provenance={})
    with timed(record, "write_seconds"):
        writer = again.crop_writer(largest, grid, channels=channels)
        writer.write_all(arrays)
        writer.commit()
    record.update(write_probe={"crop": largest, "channels": len(channels), "shape_vox": list(shape)},
                  write_seconds_per_channel_voxel=record["write_seconds"] / (len(channels) * math.prod(shape)))
    shutil.rmtree(work / "rewrite.zarr", ignore_errors=True)
    return record
