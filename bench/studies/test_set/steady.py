"""Steady-state rates: seconds per tile and per written channel-voxel of one model on one large box (what the
real test set's 1000³ crops are made of), measured here or read from `bench/forward_probe.py` reports."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.studies.test_set.layout import (
    LOW_OVERLAP,
    MODEL_VOXEL_NM,
    QUICK_STEADY,
    STEADY_BOX,
    STEADY_SLICES,
    TTA,
)
from bench.studies.test_set.records import timed


def steady_probe(run_dir: Path, work: Path, *, device: str, channels: int, batch: int, quick: bool) -> dict[str, Any]:
    """Seconds per tile and per written channel-voxel on one large box, what the real test set's 1000³ crops
    are made of (the synthetic crops are mostly context and part-filled batches): `predict_volume` as
    `predict_run` calls it (TTA 8, the run's batch, compiled on CUDA, `channels` outputs kept) over random EM of
    `STEADY_BOX` (3D) or `STEADY_SLICES` (2D), after an untimed one-tile call (compilation, autotuning); then the
    result written into a store as `predict_run` writes a crop."""
    import numpy as np
    import torch

    from cellseg.data.arrays import MultiscaleImage
    from cellseg.data.grid import Grid
    from cellseg.data.prediction_store import PredictionStore
    from cellseg.data.write import write_multiscale
    from cellseg.infer.engine import Window, predict_volume, tta_fold
    from cellseg.infer.run import load_run, run_transforms
    from cellseg.infer.tiling import count_tiles
    from cellseg.runtime.compile import CompiledModel

    run = load_run(run_dir, "last", device=device)
    patch = run.cfg.data.patch_shape_vox
    shape = QUICK_STEADY if quick else STEADY_SLICES if run.spatial_dims == 2 else STEADY_BOX
    vs = (MODEL_VOXEL_NM,) * 3
    data = np.random.default_rng(0).integers(0, 256, size=shape, dtype=np.uint8)
    path = write_multiscale(work / "steady_em", data, voxel_size_nm=vs, translation_nm=tuple(v / 2 for v in vs),
                            kind="em", num_levels=1)
    em = MultiscaleImage(str(path), backend="tensorstore", expected_dtype="uint8")
    compiled = CompiledModel(run.model) if device == "cuda" else None
    keep, tfms = list(range(channels)), run_transforms(run, TTA)
    fold = tta_fold(batch, patch, len(tfms), run.device)  # as `predict_run`
    window = Window(patch_vox=tuple(patch), device=run.device, precision="bf16" if device == "cuda" else "fp32",
                    batch_size=batch, transforms=tuple(tfms), channels_last=True, compiled=compiled, tta_fold=fold)
    common = dict(num_outputs=len(run.channels), keep=keep, dtype=torch.float16)
    record: dict[str, Any] = {"shape_vox": list(shape), "channels": channels, "batch_size": batch, "tta_fold": fold}
    with timed(record, "warmup_seconds"):
        predict_volume(run.model, em, Grid(translation_nm=tuple(v / 2 for v in vs), shape_vox=(patch[0], 8, 8),
                                           voxel_size_nm=vs), window, **common)
    grid = Grid(translation_nm=tuple(v / 2 for v in vs), shape_vox=shape, voxel_size_nm=vs)  # type: ignore[arg-type]
    with timed(record, "predict_seconds"):
        probs = predict_volume(run.model, em, grid, window, **common)
        if device == "cuda":
            torch.cuda.synchronize()
    store = PredictionStore.create(work / "steady.zarr", kind="probabilities", channels=run.channels,
                                   instance_channels=[], provenance={})
    with timed(record, "write_seconds"):
        writer = store.crop_writer("crop1", grid, channels=run.channels[:channels])
        writer.write_all({c: probs[k] for k, c in enumerate(run.channels[:channels])})
        writer.commit()
    tiles = count_tiles(shape, patch, 0.5)
    record.update(tiles=tiles, seconds_per_tile=record["predict_seconds"] / tiles,
                  write_seconds_per_channel_voxel=record["write_seconds"] / (channels * math.prod(shape)),
                  compiled=bool(compiled and compiled.compiled_ok))
    shutil.rmtree(work / "steady.zarr", ignore_errors=True)
    shutil.rmtree(work / "steady_em", ignore_errors=True)
    return record


def steady_rates(paths: Sequence[Path]) -> dict[str, dict[str, Any]]:
    """Per model, the engine seconds per tile of `bench/forward_probe.py` reports (measured at overlap 0.25)."""
    rates = {}
    for path in paths:
        for row in json.loads(path.read_text())["rows"]:
            engine = row["engine"]
            rates[row["model"]] = {"seconds_per_tile": engine["ms_per_tile"] / 1e3, "tta_fold": engine["tta_fold"],
                                   "batch_size": row["batch"],
                                   "source": f"{path.name}: bench/forward_probe.py engine, overlap "
                                             f"{engine.get('overlap', LOW_OVERLAP)}"}
    return rates
