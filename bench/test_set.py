"""The full ensemble (every architecture × 8 TTA) over a synthetic test set laid out like the 16 real test crops,
timed stage by stage and projected to the real test set (issue #7: "≤ 60 minutes on one H200").

1. **Data.** A synthetic CellMap root (`cellseg.synth.generate` of `mirror_preset`) whose test crops mirror the
   16 crops of the packaged 2026 test manifest: the same 6 datasets and 16 crops, each crop's shape the real
   shape divided by `--scale` (in crop voxels). A dataset's EM s0 voxel size is its finest real crop's; each
   coarser crop sits at s0 × 1, 2 or 4 (the generator's crop scales), so real steps of 8× (e.g. 4 → 32 nm)
   become 4× (4 → 16 nm): the synthetic grids keep the order of the real voxel sizes but compress the largest
   steps. Full crops (48 classes) annotate every class, coarse crops the generator's "coarse" set. One 16³
   training crop per dataset (the run builder needs training crops).
2. **Runs.** One run directory per `configs/experiments/*.yaml`, written by the trainer's own `build_setup`
   (`config.yaml`, `meta.json`, datasplit) plus `checkpoints/last.pt` from `Setup.state_dict` as the trainer
   saves it, with randomly initialised weights: inference throughput does not depend on the weight values.
3. **Stages**, with the functions the CLI calls: `predict_run` per run over the test crops (TTA 8, float16
   store, the run's training micro-batch per forward), `ensemble` of all stores (uniform weights),
   `postprocess_store` (default parameters, device "auto": CUDA on a GPU), `write_submission` and
   `validate_submission` against the synthetic test manifest.
4. **Projection** to the real 2026 test crops under two policies: every crop at the models' 8 nm, or at
   max(8 nm, the crop's voxel size) per axis (the 13.9–32 nm crops predicted by members trained at that voxel
   size; assumed to have the same architecture, patch and speed as the 8 nm ones). Predict time per model =
   model load + compile (the warm-up predict) + sliding-window tiles × seconds per tile in the steady state of
   one large box (tiles counted per column exactly as `predict_run` cuts each crop, context included) + the
   store writes per channel-voxel. The other stages: a cost per crop or array (the smallest crop timed alone)
   plus a cost per channel-voxel (ensemble, post-processing) or per submitted voxel (crop grid × labels; submission and validation, measured on a probe:
   the largest crop resubmitted on a 4 nm grid). Every stage is assumed to keep its measured rates at any crop
   size (streaming block by block).

Writes OUT.json (everything) and OUT.md (the tables) and prints the tables. A model that fails (e.g. out of
memory) is recorded and left out of the ensemble. The data, runs and stores go to `--work` (default: a
temporary folder, deleted at the end).

Usage (one H200, about 6 minutes):  PYTHONPATH=. python bench/test_set.py --out OUT/test_set --workers 16
Smoke (CPU, < 1 minute):           PYTHONPATH=. python bench/test_set.py --quick --out /tmp/test_set
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import itertools
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from anywhere, with or without PYTHONPATH=.

# Only light modules at the top: the generator's forkserver workers import this file again, and torch would
# cost each of them seconds. The inference stages import what they need inside their functions.
import cellseg  # noqa: E402
from cellseg.cache import INDUCTOR_ENV  # noqa: E402
from cellseg.data.crops import Catalog, Crop, Geometry  # noqa: E402
from cellseg.data.inspect import disk_bytes  # noqa: E402
from cellseg.eval.rules import is_scored_as_instance  # noqa: E402
from cellseg.eval.submit import load_manifest  # noqa: E402
from cellseg.synth.presets import (  # noqa: E402
    CLASS_SETS,
    MirroredCrop,
    mirror_crops,
    mirror_dataset_name,
    mirror_preset,
)

Vec3 = tuple[float, float, float]
Shape3 = tuple[int, int, int]
EXPERIMENTS = REPO / "configs" / "experiments"
SMOKE = REPO / "configs" / "smoke"  # --quick: tiny presets, 32-voxel patches, 6 classes
MODEL_VOXEL_NM = 8.0  # every configs/experiments model predicts at 8 nm
GOAL_MINUTES = 60.0  # issue #7
TTA = 8
# 5.9 M model voxels at 8 nm and 55 M EM voxels (seconds to generate); predict is bound by its tiles, which
# the crops' context keeps from shrinking with the crops (3D: 226 tiles of 128³ here, 306 at scale 16).
DEFAULT_SCALE = 24.0
QUICK_SCALE = 128.0
QUICK_PATCH_3D = "[16,16,16]"  # --quick: 3D tiles 8x cheaper than the smoke configs' 32³ (the tiny models take 16³)
QUICK_MODELS = ("unet_3d", "unet_2d")
PROBE_VOXEL_NM = 4.0  # the submit/validate probe: the largest crop again on the real 4 nm crops' grid ...
PROBE_LABELS = 8  # ... with up to 8 of its labels, instance and semantic alternating: as many arrays as
# `cellseg submit` and `validate-submission` run at once by default on a 16-core host, so the probe's cost per
# voxel is that of the parallel writer over a test set's hundreds of arrays
DOWNSTREAM = ("ensemble", "postprocess", "submit", "validate")  # the stages after predict, in order
POLICIES = {
    "8nm": "every crop at the models' 8 nm",
    "max8": "max(8 nm, the crop's voxel size) per axis: the 13.9-32 nm crops predicted by members trained at "
            "that voxel size (same architectures, patches and speed as the 8 nm members)",
    "max8_ov25": "as max8, with tiles overlapping by 0.25 instead of 0.5 (`cellseg predict --overlap 0.25`; "
                 "tiles counted at that overlap, each at the measured seconds per tile)",
}
LOW_OVERLAP = 0.25  # the overlap of the "max8_ov25" policy
STEADY_BOX = (256, 256, 256)  # 3D steady-state probe (voxels): 125 tiles of 128³ at overlap 0.5, context included
STEADY_SLICES = (32, 512, 512)  # 2D probe: 32 slices, 800 tiles of 256²
QUICK_STEADY = (32, 32, 32)  # --quick: probe box for both (tiny models on a CPU)
H200_BYTES = 139 * 2**30  # GPU memory for reports made before predict records kept theirs (H200s)
BIG_CROP_SHARE = 0.1  # the probe keeps the channels of the largest scored set among crops with ≥ 10 % of the voxels


# ------------------------------------------------------------------------------------------- the layout


def match_crops(root: Path, crops: Sequence[MirroredCrop]) -> dict[int, MirroredCrop]:
    """Synthetic test crop id → the crop it mirrors (ids rise in the preset's order within a dataset).

    Raises:
        ValueError: the root's test manifest does not hold the layout's crops.
    """
    synth = load_manifest(root / "test_crop_manifest.csv")
    out = {}
    for dataset in dict.fromkeys(c.dataset for c in crops):
        ids = sorted(i for i, c in synth.items() if c.dataset == mirror_dataset_name(dataset))
        mine = [c for c in crops if c.dataset == dataset]
        if len(ids) != len(mine):
            raise ValueError(f"{root}/test_crop_manifest.csv: {len(ids)} test crops of {mirror_dataset_name(dataset)}, "
                             f"the layout has {len(mine)}")
        for crop_id, crop in zip(ids, mine, strict=True):
            if synth[crop_id].geometry.shape_vox != crop.spec.shape_vox:
                raise ValueError(f"{root}: crop {crop_id} has shape {synth[crop_id].geometry.shape_vox}, "
                                 f"the layout {crop.spec.shape_vox}")
            out[crop_id] = crop
    return out


# ------------------------------------------------------------------------------------------- geometry


def grid_shape(extent_nm: Sequence[float], voxel_size_nm: Sequence[float]) -> Shape3:
    """Voxels of a box on a grid (as `cellseg.infer.predict.box_grid` rounds them)."""
    return tuple(max(1, round(e / v)) for e, v in zip(extent_nm, voxel_size_nm, strict=True))  # type: ignore[return-value]


def model_voxel_size(crop_vs: Sequence[float], policy: str) -> Vec3:
    """The grid a crop is predicted on under `policy` (see `POLICIES`)."""
    if policy == "8nm":
        return (MODEL_VOXEL_NM,) * 3
    return tuple(max(MODEL_VOXEL_NM, v) for v in crop_vs)  # type: ignore[return-value]


def real_volumes(real: Mapping[int, Crop], policy: str) -> dict[int, dict[str, Any]]:
    """Per real test crop: the model grid of `policy` and the voxels submitted (crop grid × labels)."""
    out = {}
    for crop_id, crop in sorted(real.items()):
        g = crop.geometry
        vs = model_voxel_size(g.voxel_size_nm, policy)
        shape = grid_shape(g.extent_nm, vs)
        out[crop_id] = {"voxel_size_nm": list(vs), "shape_vox": list(shape), "voxels": math.prod(shape),
                        "submitted_voxels": g.num_voxels * len(crop.labels)}
    return out


def num_arrays(crops: Mapping[int, Crop]) -> int:
    """(crop, label) arrays a submission holds."""
    return sum(len(c.labels) for c in crops.values())


def submitted_voxels(crops: Mapping[int, Crop]) -> int:
    """Voxels of every (crop, label) array a submission holds."""
    return sum(g.num_voxels for c in crops.values() for g in c.labels.values())


# ------------------------------------------------------------------------------------------- bookkeeping


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
    from cellseg.infer.store import PredictionStore

    store = PredictionStore.open(path)
    return sum(math.prod(store.grid(c).shape_vox) for c in store.completed())


def store_channel_voxels(path: Path) -> int:
    """Voxels × channels over every crop of a prediction store (each crop holds its scored channels)."""
    from cellseg.infer.store import PredictionStore

    store = PredictionStore.open(path)
    return sum(math.prod(store.grid(c).shape_vox) * len(store.crop_channels(c)) for c in store.completed())


def scored_count(channels: Sequence[str], crop: Crop) -> int:
    """Channels `cellseg predict --channels scored` writes for a real test crop (its labels + boundaries)."""
    from cellseg.infer.predict import scored_channels

    return len(scored_channels(channels, list(crop.labels)))


# ------------------------------------------------------------------------------------------- the stages


def build_run(arch: str, *, root: Path, run_dir: Path, device: str, quick: bool) -> dict[str, Any]:
    """A run directory with random weights, written by the trainer's `build_setup` and checkpoint code
    (`configs/experiments/<arch>.yaml`; `--quick`: `configs/smoke/<arch>.yaml`)."""
    from cellseg.config import load_run_config
    from cellseg.train.checkpoint import rng_state
    from cellseg.train.setup import build_setup

    overrides = [f"data.root={root}", f"run_dir={run_dir}", f"train.device={device}",
                 "train.max_steps=1",  # the LR schedule needs one step; none is taken
                 "train.compile=off", "loader.num_workers=0", "data.boundary_cache=null"]
    if quick and not arch.endswith("_2d"):
        overrides.append(f"data.patch_shape_vox={QUICK_PATCH_3D}")
    cfg = load_run_config((SMOKE if quick else EXPERIMENTS) / f"{arch}.yaml", overrides)
    with restored_backends():
        setup = build_setup(cfg)
    setup.keeper.save_last(setup.state_dict(metric=None, rng=rng_state()))  # as the trainer saves `last.pt`
    return {"run_dir": str(run_dir), "parameters": sum(p.numel() for p in setup.model.parameters()),
            "patch_shape_vox": list(cfg.data.patch_shape_vox), "batch_size": setup.batch_size,
            "channels": cfg.data.num_target_channels, "channel_names": list(setup.meta["channels"]),
            "preset": cfg.model.preset}


def count_model_tiles(crops: Sequence[tuple[Sequence[int], int]], patch_vox: Sequence[int], overlap: float,
                      device: str, gpu_bytes: int | None = None) -> int:
    """Sliding-window tiles `predict_run` runs over crops given as (shape, channels): per column of
    `plan_crop` (what memory on `device`, a GPU of `gpu_bytes`, allows for that many channels), with context."""
    import torch

    from cellseg.infer.predict import plan_crop
    from cellseg.infer.tiling import count_tiles

    dev = torch.device(device)
    return sum(count_tiles(n, patch_vox, overlap) for shape, k in crops
               for _, n in plan_crop(shape, k, patch_vox, ("z",), dev, gpu_bytes=gpu_bytes).blocks)


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
    from cellseg.data.write import write_multiscale
    from cellseg.infer.engine import tta_fold
    from cellseg.infer.predict import CompiledModel, load_run, predict_volume, run_transforms
    from cellseg.infer.store import PredictionStore
    from cellseg.infer.tiling import count_tiles

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
    common = dict(num_outputs=len(run.channels), device=run.device, precision="bf16" if device == "cuda" else "fp32",
                  batch_size=batch, transforms=tfms, channels_last=True, keep=keep,
                  dtype=torch.float16, compiled=compiled, tta_fold=fold)
    record: dict[str, Any] = {"shape_vox": list(shape), "channels": channels, "batch_size": batch, "tta_fold": fold}
    with timed(record, "warmup_seconds"):
        predict_volume(run.model, em, Grid(translation_nm=tuple(v / 2 for v in vs), shape_vox=(patch[0], 8, 8),
                                           voxel_size_nm=vs), patch_vox=patch, **common)
    grid = Grid(translation_nm=tuple(v / 2 for v in vs), shape_vox=shape, voxel_size_nm=vs)  # type: ignore[arg-type]
    with timed(record, "predict_seconds"):
        probs = predict_volume(run.model, em, grid, patch_vox=patch, **common)
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


def predict_model(run_dir: Path, store: Path, *, device: str, warmup: tuple[str, Path] | None,
                  patch_vox: Sequence[int], probe_channels: int, quick: bool = False) -> dict[str, Any]:
    """`predict_run` over the test crops (wall, model load, compile, per-crop compute, tiles), then the
    steady-state probe (`steady_probe`)."""
    import torch

    from cellseg.config.inference import InferConfig
    from cellseg.infer.predict import load_run, predict_run
    from cellseg.infer.store import PredictionStore

    opts = InferConfig(tta=TTA, checkpoint="last", device=device, progress=False)
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

    from cellseg.config.inference import InferConfig
    from cellseg.infer.fused import predict_ensemble
    from cellseg.infer.store import PredictionStore

    runs = [Path(b["run_dir"]) for b in builds.values()]
    opts = InferConfig(tta=TTA, checkpoint="last", device=device, progress=False)
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


def cost_model(record: dict[str, Any], *, per_item: float, items: int, key: str) -> dict[str, Any]:
    """Add a stage's cost model: `per_item` seconds per crop or array, the rest of its time per `key` voxel."""
    rest = max(0.0, record["seconds"] - per_item * items)
    return {**record, "items": items, "per_item_seconds": per_item, "per_voxel_seconds": rest / record[key],
            "mvox_per_s": record[key] / 1e6 / record["seconds"]}


def ensemble_stage(stores: Sequence[Path], out: Path, smallest: str) -> dict[str, Any]:
    """Uniform-weight ensemble of the member stores, as `cellseg ensemble --weights uniform`; then the smallest
    crop alone (`write_ensemble`, what `ensemble` runs) for the cost per crop that does not grow with voxels."""
    from cellseg.infer.ensemble import ensemble, open_members, plan_channels, uniform_weights, write_ensemble

    record: dict[str, Any] = {}
    with timed(record):
        result = ensemble([str(s) for s in stores], out, weights="uniform")
    members = open_members(stores)
    plan = plan_channels(members)
    with timed(record, "smallest_crop_seconds"):
        write_ensemble(members, out.with_name(f"{out.stem}_{smallest}.zarr"), plan, uniform_weights(plan, len(members)),
                       [smallest])
    record.update(members=len(stores), voxels=store_voxels(out), channel_voxels=store_channel_voxels(out),
                  bytes=disk_bytes(out))
    return cost_model(record, per_item=record["smallest_crop_seconds"], items=len(result.crops), key="channel_voxels")


def postprocess_stage(source: Path, out: Path, device: str) -> dict[str, Any]:
    """Default post-processing parameters, as `cellseg postprocess --device auto` (CUDA on a GPU); cost per crop
    and per voxel fitted to the seconds the store records for each crop."""
    import numpy as np

    from cellseg.infer.store import PredictionStore
    from cellseg.postprocess.apply import open_probabilities, postprocess_store, resolve
    from cellseg.postprocess.params import ParamSet

    record: dict[str, Any] = {"device": resolve(device)}
    with timed(record):
        seg = postprocess_store(open_probabilities(source), out, params=ParamSet(), device=record["device"],
                                progress=False)
    crops = seg.completed()
    probs = PredictionStore.open(source)
    voxels = [math.prod(seg.grid(c).shape_vox) * len(probs.crop_channels(c)) for c in crops]  # channel-voxels
    seconds = [seg.crop_attrs(c).get("postprocess", {}).get("seconds", 0.0) for c in crops]
    per_voxel, per_crop = np.polyfit(voxels, seconds, 1) if len(set(voxels)) > 1 else (0.0, 0.0)
    record.update(voxels=sum(math.prod(seg.grid(c).shape_vox) for c in crops), channel_voxels=sum(voxels),
                  bytes=disk_bytes(out), crop_seconds=dict(zip(crops, seconds, strict=True)))
    model = cost_model(record, per_item=max(0.0, float(per_crop)), items=len(crops), key="channel_voxels")
    if per_voxel > 0:  # else (timing noise) the rest of the stage's time per voxel, as `cost_model` has it
        model["per_voxel_seconds"] = float(per_voxel)
    return model


def probe_crops(segmentation: Path) -> dict[int, Crop]:
    """The largest crop of a segmentation store as a submission crop on a `PROBE_VOXEL_NM` grid over its box, with
    up to `PROBE_LABELS` of its labels: enough voxels for submit and validate to show their cost per voxel."""
    from cellseg.infer.store import PredictionStore

    store = PredictionStore.open(segmentation)
    name = max(store.completed(), key=lambda c: math.prod(store.grid(c).shape_vox))
    grid = store.grid(name)
    probe = Geometry(voxel_size_nm=(PROBE_VOXEL_NM,) * 3,
                     translation_nm=tuple(t + (PROBE_VOXEL_NM - v) / 2 for t, v in  # type: ignore[arg-type]
                                          zip(grid.translation_nm, grid.voxel_size_nm, strict=True)),
                     shape_vox=tuple(round(n * v / PROBE_VOXEL_NM)  # type: ignore[arg-type]
                                     for n, v in zip(grid.shape_vox, grid.voxel_size_nm, strict=True)))
    crop_id = int(name.removeprefix("crop"))
    instance = [c for c in store.crop_channels(name) if is_scored_as_instance(c)]
    semantic = [c for c in store.crop_channels(name) if not is_scored_as_instance(c)]
    labels = [c for pair in itertools.zip_longest(instance, semantic) for c in pair if c][:PROBE_LABELS]
    return {crop_id: Crop(id=crop_id, dataset=store.crop_attrs(name).get("dataset", ""),
                          labels={label: probe for label in labels})}


def submit_stage(source: Path, manifest: Path, out: Path, smallest: int) -> dict[str, Any]:
    """The submission zip at the synthetic test crops' geometry, as `cellseg submit --manifest`; then the smallest
    crop alone (cost per array) and the probe (`probe_crops`: cost per voxel)."""
    from cellseg.eval.submit import write_submission

    crops, probe = load_manifest(manifest), probe_crops(source)
    record: dict[str, Any] = {}
    with timed(record):
        report = write_submission(source, crops, out)
    with timed(record, "smallest_crop_seconds"):
        write_submission(source, {smallest: crops[smallest]}, out.with_name(f"{out.stem}_{smallest}.zip"))
    with timed(record, "probe_seconds"):
        write_submission(source, probe, out.with_name(f"{out.stem}_probe.zip"))
    return probed(record, crops, smallest, probe, arrays=len(report.written), missing=len(report.missing),
                  bytes=out.stat().st_size)


def validate_stage(submission: Path, source: Path, manifest: Path, smallest: int) -> dict[str, Any]:
    """`cellseg validate-submission` with data checks; then the smallest crop alone (cost per array) and the
    probe submission `submit_stage` wrote (cost per voxel)."""
    from cellseg.eval.validate import validate_submission

    crops, probe = load_manifest(manifest), probe_crops(source)
    record: dict[str, Any] = {}
    with timed(record):
        issues = validate_submission(submission, crops, read_data=True)
    with timed(record, "smallest_crop_seconds"):
        validate_submission(submission, {smallest: crops[smallest]}, read_data=True)
    with timed(record, "probe_seconds"):
        validate_submission(submission.with_name(f"{submission.stem}_probe.zip"), probe, read_data=True)
    counts = {level: sum(i.severity == level for i in issues) for level in ("error", "warning", "info")}
    return probed(record, crops, smallest, probe, issues=counts,
                  errors=[str(i) for i in issues if i.severity == "error"][:10])


def probed(record: dict[str, Any], crops: Mapping[int, Crop], smallest: int, probe: Mapping[int, Crop],
           **extra: Any) -> dict[str, Any]:
    """Submit/validate cost model: per array from the smallest crop, per voxel from the probe (less its arrays)."""
    per_array = record["smallest_crop_seconds"] / len(crops[smallest].labels)
    probe_voxels = submitted_voxels(probe)
    record.update(extra, submitted_voxels=submitted_voxels(crops), probe_voxels=probe_voxels)
    return {**cost_model(record, per_item=per_array, items=num_arrays(crops), key="submitted_voxels"),
            "per_voxel_seconds": max(0.0, record["probe_seconds"] - per_array * num_arrays(probe)) / probe_voxels}


# ------------------------------------------------------------------------------------------- the projection


def project_predict(measured: Mapping[str, Any], real: Mapping[int, Crop], policy: str) -> dict[str, Any]:
    """One model's `predict_run` over the real test crops: load + compile (the warm-up predict) + tiles × the
    steady-state seconds per tile + channel-voxels written × the steady-state write cost."""
    volumes = real_volumes(real, policy)
    crops = [(v["shape_vox"], scored_count(measured["channels"], real[k])) for k, v in volumes.items()]
    voxels = sum(v["voxels"] for v in volumes.values())
    channel_voxels = sum(math.prod(shape) * k for shape, k in crops)
    overlap = LOW_OVERLAP if policy == "max8_ov25" else measured["overlap"]
    gpu_bytes = measured.get("gpu_total_bytes", H200_BYTES if measured["device"] == "cuda" else None)
    tiles = count_model_tiles(crops, measured["patch_shape_vox"], overlap, measured["device"], gpu_bytes)
    steady = measured["steady"]
    seconds = (measured["load_seconds"] + measured.get("warmup_seconds", 0.0) + tiles * steady["seconds_per_tile"]
               + channel_voxels * steady["write_seconds_per_channel_voxel"])
    return {"voxels": voxels, "channel_voxels": channel_voxels, "tiles": tiles, "seconds": seconds,
            "seconds_at_synthetic_rate": tiles * measured["compute_seconds"] / measured["tiles"],
            "bytes": measured["bytes"] * channel_voxels / max(1, measured.get("channel_voxels", measured["voxels"]))}


def project_fused(measured: Mapping[str, Any], real: Mapping[int, Crop], policy: str) -> dict[str, Any] | None:
    """`predict_ensemble` over the real test crops: its load and warm-up + every member's tiles × its steady-state
    seconds per tile + the ensemble's channel-voxels written once × the measured write cost. None while a member
    has no steady-state rate (`--steady`)."""
    members = measured["members"]
    if any("steady" not in m for m in members.values()):
        return None
    union = list(dict.fromkeys(c for m in members.values() for c in m["channels"]))
    volumes = real_volumes(real, policy)
    crops = [(v["shape_vox"], scored_count(union, real[k])) for k, v in volumes.items()]
    channel_voxels = sum(math.prod(shape) * k for shape, k in crops)
    overlap = LOW_OVERLAP if policy == "max8_ov25" else measured["overlap"]
    gpu_bytes = measured.get("gpu_total_bytes", H200_BYTES if measured["device"] == "cuda" else None)
    rows = {}
    for name, m in members.items():
        tiles = count_model_tiles(crops, m["patch_shape_vox"], overlap, measured["device"], gpu_bytes)
        rows[name] = {"tiles": tiles, "seconds": tiles * m["steady"]["seconds_per_tile"]}
    write = channel_voxels * measured["write_seconds_per_channel_voxel"]
    seconds = measured["load_seconds"] + measured.get("warmup_seconds", 0.0) + sum(r["seconds"] for r in rows.values()) + write
    return {"channel_voxels": channel_voxels, "members": rows, "write_seconds": write, "seconds": seconds,
            "bytes": measured["bytes"] * channel_voxels / max(1, measured["channel_voxels"])}


def probe_channels(real: Mapping[int, Crop], channels: Sequence[str]) -> int:
    """Channels for the steady-state probe: the most any crop holding ≥ `BIG_CROP_SHARE` of the max8 voxels is
    scored on (the 1000³ crops dominate the predict time)."""
    volumes = real_volumes(real, "max8")
    total = sum(v["voxels"] for v in volumes.values())
    return max(scored_count(channels, real[k]) for k, v in volumes.items() if v["voxels"] >= BIG_CROP_SHARE * total)


def project_stage(measured: Mapping[str, Any], units: int, items: int, key: str) -> dict[str, Any]:
    """A stage's cost model (`cost_model`) applied to the real test set's `items` and `units` voxels."""
    out = {key: units, "items": items,
           "seconds": measured["per_item_seconds"] * items + measured["per_voxel_seconds"] * units}
    if "bytes" in measured:
        out["bytes"] = measured["bytes"] * units / measured[key]
    return out


def project(stages: Mapping[str, Any], real: Mapping[int, Crop], rates: Mapping[str, Any] | None = None
            ) -> dict[str, Any]:
    """Minutes per stage and in total on the real test crops, for every policy. `rates` (a
    `bench/ensemble_steady.py` report) replaces the ensemble's and post-processing's cost per channel-voxel,
    and submit's and validate's per submitted voxel, with those measured on a large crop; their costs per crop
    or array stay this run's."""
    out = {}
    submitted, arrays = submitted_voxels(real), num_arrays(real)
    channels = next((m["channels"] for m in [*stages.get("predict", {}).values(),
                                             *stages.get("predict_ensemble", {}).get("members", {}).values()]
                     if m.get("status", "ok") == "ok"), None)
    for policy, description in POLICIES.items():
        volumes = real_volumes(real, policy)
        voxels = sum(v["voxels"] for v in volumes.values())
        channel_voxels = sum(v["voxels"] * scored_count(channels, real[k]) for k, v in volumes.items()) if channels else 0
        rows: dict[str, Any] = {"predict": {name: project_predict(m, real, policy)
                                            for name, m in stages.get("predict", {}).items() if m.get("status") == "ok"}}
        fused = stages.get("predict_ensemble", {})
        if fused.get("status") == "ok" and (row := project_fused(fused, real, policy)):
            rows["predict_ensemble"] = row
        for stage, key, units, items in (("ensemble", "channel_voxels", channel_voxels, len(real)),
                                         ("postprocess", "channel_voxels", channel_voxels, len(real)),
                                         ("submit", "submitted_voxels", submitted, arrays),
                                         ("validate", "submitted_voxels", submitted, arrays)):
            if stages.get(stage, {}).get("status") == "ok":
                measured = dict(stages[stage])
                if rates and f"{stage}_seconds_per_{key[:-1]}" in rates:  # e.g. submit_seconds_per_submitted_voxel
                    measured["per_voxel_seconds"] = rates[f"{stage}_seconds_per_{key[:-1]}"]
                rows[stage] = project_stage(measured, units, items, key)
        predict_s = sum(r["seconds"] for r in rows["predict"].values()) + rows.get("predict_ensemble", {}).get("seconds", 0)
        total_s = predict_s + sum(rows[s]["seconds"] for s in DOWNSTREAM if s in rows)
        needed = [s for s in DOWNSTREAM if not (s == "ensemble" and "predict_ensemble" in rows)]
        out[policy] = {"description": description, "model_voxels": voxels, "channel_voxels": channel_voxels,
                       "submitted_voxels": submitted,
                       "crops": {str(k): v for k, v in real_volumes(real, policy).items()}, "stages": rows,
                       "predict_minutes": predict_s / 60, "total_minutes": total_s / 60, "goal_minutes": GOAL_MINUTES,
                       "complete": bool(rows["predict"] or "predict_ensemble" in rows) and all(s in rows for s in needed),
                       "meets_goal": total_s / 60 <= GOAL_MINUTES}
    return out


# ------------------------------------------------------------------------------------------- the report


def fmt_vox(n: float) -> str:
    """Voxels with a unit prefix: 1.2 G, 35 M, 800 k."""
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f}"


def fmt_bytes(n: float | None) -> str:
    """Bytes in decimal units (GB, TB)."""
    if n is None:
        return "-"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_vs(vs: Sequence[float]) -> str:
    """`1.74×2×2`."""
    return "×".join(f"{v:g}" for v in vs)


def layout_table(report: Mapping[str, Any]) -> list[str]:
    """The synthetic test crops next to the real ones, with model-resolution voxels."""
    syn = report["synthetic"]
    lines = ["| synthetic crop | real crop | dataset | real voxel nm | synthetic voxel nm | real shape | synthetic "
             "shape | labels (real / synthetic) | synthetic vox at 8 nm | real vox at 8 nm | real vox at max(8 nm, "
             "crop) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in syn["crops"]:
        lines.append(f"| {c['synthetic_id']} | {c['real_id']} | {c['dataset']} | {fmt_vs(c['real_voxel_size_nm'])} | "
                     f"{fmt_vs(c['voxel_size_nm'])} | {fmt_vs(c['real_shape_vox'])} | {fmt_vs(c['shape_vox'])} | "
                     f"{c['real_classes']} / {len(CLASS_SETS[c['classes']])} | {fmt_vox(c['model_voxels'])} | "
                     f"{fmt_vox(c['real_model_voxels']['8nm'])} | {fmt_vox(c['real_model_voxels']['max8'])} |")
    lines.append(f"| **all {len(syn['crops'])}** | | | | | | | | **{fmt_vox(syn['model_voxels'])}** | "
                 f"**{fmt_vox(syn['real_model_voxels']['8nm'])}** | **{fmt_vox(syn['real_model_voxels']['max8'])}** |")
    return lines


def measured_row(label: str, r: Mapping[str, Any], key: str = "voxels") -> str:
    """One stage: status, seconds, voxels (`key`), Mvox/s and output size; or its status and error."""
    if r.get("status") != "ok":
        return f"| {label} | {r.get('status', 'not run')} {r.get('error', '')[:100]} | | | | |"
    rate = f"{r['mvox_per_s']:.3g}" if "mvox_per_s" in r else ""
    voxels = fmt_vox(r[key]) if key in r else ""
    return f"| {label} | ok | {r['seconds']:.1f} | {voxels} | {rate} | {fmt_bytes(r.get('bytes'))} |"


def warm_note(r: Mapping[str, Any]) -> str:
    """How warm the compile cache was for a predict-ensemble warm-up."""
    if "previous_job_seconds" not in r:
        return ""
    return f" with the compile cache of a previous job (that job: {r['previous_job_seconds']:.1f} s, cold)"


def measured_table(report: Mapping[str, Any]) -> list[str]:
    """Seconds, rate and output size of every stage measured so far."""
    st = report["stages"]
    lines = ["| stage | status | seconds | voxels | Mvox/s | output |", "|---|---|---|---|---|---|",
             measured_row(f"synthetic data ({report['args']['workers']} workers; EM voxels)", st["generate"],
                          "em_voxels")]
    lines += [measured_row(f"build run {name}", r) for name, r in st.get("build_runs", {}).items()]
    for name, r in st.get("predict", {}).items():
        detail = ""
        if r.get("status") == "ok":
            probe = r["steady"]
            detail = (f" (TTA {r['tta']}; load {r['load_seconds']:.1f} s, warm-up incl. compile "
                      f"{r.get('warmup_seconds', 0.0):.1f} s, compute {r['compute_seconds']:.1f} s, {r['tiles']} tiles, "
                      f"{r['tiles_per_s']:.3g} tiles/s; steady state {1 / probe['seconds_per_tile']:.3g} tiles/s with "
                      f"{probe['channels']} channels, batch {probe['batch_size']}"
                      f"{' × TTA fold ' + str(probe['tta_fold']) if probe.get('tta_fold', 1) > 1 else ''}"
                      f"{', compiled' if probe['compiled'] else ''})")
        lines.append(measured_row(f"predict {name}{detail}", r))
    if "predict_ensemble" in st:
        r = st["predict_ensemble"]
        detail = (f" ({len(r['members'])} members, TTA {r['tta']}; load {r['load_seconds']:.1f} s, warm-up incl. "
                  f"compile {r.get('warmup_seconds', 0.0):.1f} s{warm_note(r)}, compute {r['compute_seconds']:.1f} s, {r['tiles']} "
                  f"tiles; write probe {r['write_seconds']:.2f} s)") if r.get("status") == "ok" else ""
        lines.append(measured_row(f"predict-ensemble{detail}", r))
    for stage in DOWNSTREAM:
        if stage not in st and "predict_ensemble" in st:
            continue
        r = st.get(stage, {})
        key = "voxels" if stage in ("ensemble", "postprocess") else "submitted_voxels"
        where = f" ({r['device']})" if "device" in r else ""
        lines.append(measured_row(stage + where + ("" if key == "voxels" else " (submitted voxels)"), r, key))
    return lines


def projection_table(report: Mapping[str, Any]) -> list[str]:
    """Projected minutes (and output sizes) per stage on the real test crops, for both policies."""
    proj = report["projection"]
    lines = ["| stage | " + " | ".join(f"minutes ({p}) | output ({p})" for p in POLICIES) + " |",
             "|---|" + "---|---|" * len(POLICIES)]

    def row(label: str, get: Callable[[Mapping[str, Any]], Mapping[str, Any] | None]) -> None:
        cells = []
        for p in POLICIES:
            r = get(proj[p]["stages"])
            cells.append(f"{r['seconds'] / 60:,.1f} | {fmt_bytes(r.get('bytes'))}" if r else "- | -")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    for name in report["stages"].get("predict", {}):
        row(f"predict {name}", lambda s, n=name: s["predict"].get(n))
    fused = report["stages"].get("predict_ensemble", {})
    for name in fused.get("members", {}):
        row(f"predict-ensemble: {name} tiles", lambda s, n=name: (s.get("predict_ensemble") or {}).get("members", {}).get(n))
    if fused:
        row("predict-ensemble: ensemble written once", lambda s: {"seconds": s["predict_ensemble"]["write_seconds"]}
            if "predict_ensemble" in s else None)
    label = "predict-ensemble, load + compile + all members + write" if fused else "predict, all models"
    lines.append(f"| **{label}** | " + " | ".join(f"**{proj[p]['predict_minutes']:,.1f}** | " for p in POLICIES) + " |")
    for stage in DOWNSTREAM:
        if fused and stage == "ensemble":
            continue
        row(stage, lambda s, st=stage: s.get(st))
    cells = []
    for p in POLICIES:
        total = proj[p]["total_minutes"]
        verdict = "" if proj[p]["complete"] else ", incomplete: stages missing"
        cells.append(f"**{total:,.1f}** ({total / GOAL_MINUTES:.2g}× the {GOAL_MINUTES:g}-minute goal{verdict}) | ")
    lines.append("| **total** | " + " | ".join(cells) + " |")
    return lines


def markdown(report: Mapping[str, Any]) -> str:
    """OUT.md: environment, the three tables and the assumptions."""
    env, syn = report["environment"], report["synthetic"]
    lines = [f"# Test-set ensemble: {len(report['stages'].get('predict', {}))} models × TTA {TTA}, synthetic test "
             f"set at 1/{report['args']['scale']:g} of the real crop shapes",
             "",
             f"{env['device']}, torch {env['torch']}, cellseg {env['cellseg']} ({env['git_commit'][:10]}), "
             f"{env['date']}; cuDNN autotuning on while predicting (as `cellseg predict`).",
             "",
             f"Model-resolution voxels: the synthetic test set has **{fmt_vox(syn['model_voxels'])}** at 8 nm; the "
             f"real one **{fmt_vox(syn['real_model_voxels']['8nm'])}** at 8 nm and "
             f"**{fmt_vox(syn['real_model_voxels']['max8'])}** at max(8 nm, the crop's voxel size).",
             "", "## Synthetic test crops (mirroring the 2026 test manifest)", "", *layout_table(report), "",
             "## Measured", "", *measured_table(report), "",
             "## Projected to the real 16 test crops", "", *projection_table(report), "",
             "Policies: " + "; ".join(f"**{p}**: {d}" for p, d in POLICIES.items()) + ".", "",
             *[f"- {note}" for note in report["notes"]]]
    if report["stages"].get("predict_ensemble"):
        lines.append("- Predict-ensemble (`cellseg predict-ensemble`, no member stores, no `cellseg ensemble`): its "
                     "model loads and warm-up (every member compiled on the smallest crop) + each member's tiles × "
                     "that member's engine seconds per tile (`--steady`: bench/forward_probe.py, TTA 8 folded, "
                     "overlap 0.25, one model per process on the GPU) + the ensemble's channel-voxels written "
                     "once × the write probe's cost (the largest synthetic crop's ensemble values repeated to "
                     f"{STEADY_BOX[0]}³). Members' tiles are counted as `cellseg predict` cuts each crop; on an "
                     "H200 the fused run cuts the 1000³ crops into the same single column.")
    rates = report.get("rates")
    if rates:
        ensembled = f"ensemble {rates['ensemble_seconds']:.1f} s, " if "ensemble_seconds" in rates else ""
        lines.append(f"- Ensemble and post-processing are projected with the costs per channel-voxel of "
                     f"`bench/ensemble_steady.py` ({rates['members']} member(s) × {len(rates['channels'])} channels × "
                     f"{rates['shape_vox'][0]}³: {ensembled}post-processing ({rates['device']}) "
                     f"{rates['postprocess_seconds']:.1f} s, {rates['date']}); their costs per crop are this run's.")
        if "submit_seconds_per_submitted_voxel" in rates:
            lines.append(f"- Submit and validate are projected with the costs per submitted voxel of the same run: its "
                         f"segmentation submitted on a {rates['submit_voxel_size_nm']:g} nm grid "
                         f"({rates['submitted_arrays']} arrays, {rates['submitted_voxels'] / 1e9:.2f} G voxels: "
                         f"submit {rates['submit_seconds']:.1f} s, validate with data checks "
                         f"{rates['validate_seconds']:.1f} s); their costs per array are this run's.")
    return "\n".join(lines) + "\n"


NOTES = (
    "Random weights: throughput does not depend on the weight values, but post-processing time, output sizes "
    "and compression times do (random models give near-constant probabilities: they compress well and give "
    "few objects).",
    "Predict, per model: model load + the warm-up predict of the smallest crop (torch.compile and cuDNN "
    "autotuning) + tiles × seconds per tile in the steady state (one large box: 256³ for 3D models, 32 × 512² "
    "for 2D, TTA 8 folded as `cellseg predict` does, the run's batch, the channels of the largest crops) + channel-voxels × the measured store "
    "write cost. Tiles are counted per column as `predict_run` cuts each real crop for its scored channels, "
    "context included. The JSON's `seconds_at_synthetic_rate` prices the same tiles at the rate measured on the "
    "synthetic crops (mostly context and part-filled batches).",
    "Other stages: a cost per item that does not grow with voxels plus a cost per voxel. Ensemble: per crop from "
    "the smallest crop ensembled alone, the rest of its time per channel-voxel (model-resolution voxels × the "
    "crop's scored channels). Post-processing: both fitted to the seconds it records per crop (per channel-voxel). Submission and validation: per array from the smallest crop "
    "alone, per submitted voxel (each label's crop grid) from a probe, the largest crop resubmitted on a "
    f"{PROBE_VOXEL_NM:g} nm grid with up to {PROBE_LABELS} of its labels, instance and semantic alternating.",
    "Every stage is assumed to keep its measured rates at any crop size (streaming block by block: a 32 nm crop "
    "of 1000³ voxels is 4000³ = 64 G voxels × 58 channels at 8 nm).",
    "Synthetic voxel sizes: each dataset's EM s0 is its finest real crop's voxel size; coarser crops sit at "
    "s0 × 1, 2 or 4 (the generator's steps), so real 8× steps (e.g. 4 → 32 nm) are 4× in the synthetic set.",
    "Not included: synthetic data, building the runs, and the extra timings of the cost models (smallest crop "
    "alone, probes).",
)


# ------------------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (see `--help`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[-1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    parser.add_argument("--scale", type=float, default=None,
                        help=f"real crop shape / synthetic crop shape (default {DEFAULT_SCALE:g}; --quick {QUICK_SCALE:g})")
    parser.add_argument("--workers", type=int, default=1, help="processes generating the synthetic data")
    parser.add_argument("--models", help="comma-separated architectures (default: every configs/experiments/*.yaml)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--work", type=Path, help="folder for data, runs and stores (default: temporary, deleted)")
    parser.add_argument("--seed", type=int, default=0, help="synthetic data seed")
    parser.add_argument("--predict-only", action="store_true",
                        help="stop after predict (keep --work; a later --downstream-from run ensembles the stores)")
    parser.add_argument("--downstream-from", type=Path, nargs="+", metavar="JSON",
                        help="no data or predict: take the predict records of these --predict-only reports (same "
                             "--seed and --scale, one per GPU: the models split among them), ensemble all their "
                             "stores and run the stages after it in --work")
    parser.add_argument("--rates", type=Path, metavar="JSON",
                        help="a bench/ensemble_steady.py report: project the ensemble and post-processing with its "
                             "costs per channel-voxel (measured on a large crop)")
    parser.add_argument("--reproject", type=Path, metavar="JSON",
                        help="run nothing: recompute the projection of this report (e.g. with --rates) into --out")
    parser.add_argument("--steady", type=Path, nargs="+", metavar="JSON",
                        help="bench/forward_probe.py reports whose engine seconds per tile (measured at the "
                             "projection's overlap 0.25) replace the models' steady-state probes (--reproject) or "
                             "price the members of --fused")
    parser.add_argument("--fused", action="store_true",
                        help="predict the ensemble in one pass (`cellseg predict-ensemble`) instead of a store per "
                             "model + `cellseg ensemble`; members are projected with the --steady rates")
    parser.add_argument("--warm-compile-cache", action="store_true",
                        help="with --fused on a GPU: a `cellseg predict-ensemble` of the smallest crop in a process "
                             "of its own first (a validation job: it fills the compile cache), so the warm-up "
                             "measures a test-set job that loads its compiled members; without it the cache is cold")
    parser.add_argument("--quick", action="store_true",
                        help=f"CPU smoke run: scale {QUICK_SCALE:g}, {' and '.join(QUICK_MODELS)} from configs/smoke")
    args = parser.parse_args(argv)
    if args.quick:
        args.device = "cpu"
        args.models = args.models or ",".join(QUICK_MODELS)
    args.scale = args.scale or (QUICK_SCALE if args.quick else DEFAULT_SCALE)
    return args


def environment(device: str) -> dict[str, Any]:
    """Where and with what the benchmark ran."""
    import torch

    from cellseg.runtime.checkpoint import git_commit

    return {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "cuda": torch.version.cuda, "cellseg": cellseg.__version__,
            "git_commit": git_commit(REPO), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "cudnn_benchmark": "on in predict_run (as `cellseg predict`)",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def make_data(args: argparse.Namespace, root: Path, real: Mapping[int, Crop]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Generate the synthetic root; returns the stage record and the layout description."""
    from cellseg.synth import generate

    crops = mirror_crops(real, args.scale)
    summary = generate(root, preset=mirror_preset(crops), seed=args.seed, workers=args.workers)
    print(summary.format(), flush=True)
    record = {"status": "ok", "seconds": summary.seconds, "em_voxels": summary.em_voxels,
              "bytes": summary.bytes_on_disk, "datasets": [list(d) for d in summary.datasets]}
    rows = []
    for crop_id, c in sorted(match_crops(root, crops).items()):
        extent = [n * v for n, v in zip(c.spec.shape_vox, c.voxel_size_nm, strict=True)]
        real_extent = real[c.real_id].geometry.extent_nm
        rows.append({"synthetic_id": crop_id, "real_id": c.real_id, "dataset": c.dataset,
                     "real_voxel_size_nm": list(c.real_voxel_size_nm), "voxel_size_nm": list(c.voxel_size_nm),
                     "real_shape_vox": list(c.real_shape_vox), "shape_vox": list(c.spec.shape_vox),
                     "scale": c.spec.scale, "real_classes": c.real_classes, "classes": c.spec.classes,
                     "model_voxels": math.prod(grid_shape(extent, model_voxel_size(c.voxel_size_nm, "8nm"))),
                     "real_model_voxels": {p: math.prod(grid_shape(real_extent, model_voxel_size(c.real_voxel_size_nm, p)))
                                           for p in POLICIES}})
    synthetic = {"root": str(root), "scale": args.scale, "crops": rows,
                 "model_voxels": sum(r["model_voxels"] for r in rows),
                 "real_model_voxels": {p: sum(r["real_model_voxels"][p] for r in rows) for p in POLICIES}}
    return record, synthetic


def run_models(args: argparse.Namespace, names: Sequence[str], work: Path, device: str, warm_crop: str,
               stages: dict[str, Any], save: Callable[[], None], real: Mapping[int, Crop]) -> None:
    """Build every run and predict the test crops with it, saving the report after each; failures are recorded."""
    builds, predicts = stages.setdefault("build_runs", {}), stages.setdefault("predict", {})
    import torch

    for name in names:
        print(f"==> {name}", flush=True)
        torch._dynamo.reset()  # architectures sharing code must not turn each other's shapes dynamic
        run_dir = work / "runs" / name
        builds[name], predicts[name] = {}, {"status": "skipped (no run)"}
        with timed(builds[name]):
            ok = attempt(builds[name], lambda n=name, r=run_dir: build_run(n, root=work / "data", run_dir=r,
                                                                          device=device, quick=args.quick))
        if ok:
            warmup = (warm_crop, work / "warmup" / f"{name}.zarr") if device == "cuda" else None
            attempt(predicts[name], lambda n=name, r=run_dir, w=warmup: predict_model(
                r, work / "predictions" / f"{n}.zarr", device=device, warmup=w, patch_vox=builds[n]["patch_shape_vox"],
                probe_channels=probe_channels(real, builds[n]["channel_names"]), quick=args.quick))
        r = predicts[name]
        if r.get("status") == "ok":
            print(f"    {r['seconds']:.1f} s ({r['load_seconds']:.1f} s load), {fmt_vox(r['voxels'])} voxels, "
                  f"{r['mvox_per_s']:.3g} Mvox/s, {r['tiles_per_s']:.3g} tiles/s", flush=True)
        save()


def run_downstream(work: Path, device: str, crop_id: int, stages: dict[str, Any], save: Callable[[], None]) -> None:
    """Ensemble → post-process → submit → validate, saving the report after each; a stage runs only when the
    one before it succeeded. `crop_id`: the smallest test crop, timed alone for each stage's cost per crop."""
    manifest = work / "data" / "test_crop_manifest.csv"
    members = [Path(r.get("store", work / "predictions" / f"{n}.zarr")) for n, r in stages.get("predict", {}).items()
               if r.get("status") == "ok"]
    seg, zip_path = work / "segmentation.zarr", work / "submission.zip"
    fused = stages.get("predict_ensemble", {}).get("status") == "ok"  # the ensemble is already written
    probs = work / ("fused.zarr" if fused else "ensemble.zarr")
    steps = {"ensemble": lambda: ensemble_stage(members, probs, f"crop{crop_id}"),
             "postprocess": lambda: postprocess_stage(probs, seg, "auto" if device == "cuda" else "cpu"),
             "submit": lambda: submit_stage(seg, manifest, zip_path, crop_id),
             "validate": lambda: validate_stage(zip_path, seg, manifest, crop_id)}
    ok = bool(members) or fused
    for stage in DOWNSTREAM:
        if fused and stage == "ensemble":
            continue
        stages[stage] = {"status": "skipped"}
        if ok:
            print(f"==> {stage}", flush=True)
            ok = attempt(stages[stage], steps[stage])
            if ok:
                print(f"    {stages[stage]['seconds']:.1f} s", flush=True)
        save()


def combine_predictions(paths: Sequence[Path], report: dict[str, Any], work: Path) -> int:
    """Fill `report` from `--predict-only` reports (one per GPU, each a share of the models, the same synthetic
    data): their data and build records, every predict record pointing at its store; `work` gets the first
    one's data (the manifest). Returns the smallest synthetic crop's id."""
    parts = [json.loads(p.read_text()) for p in paths]
    first = parts[0]
    if any(p["synthetic"]["crops"] != first["synthetic"]["crops"] for p in parts[1:]):
        raise SystemExit("--downstream-from: the reports were made on different synthetic data (--seed/--scale)")
    stages = report["stages"]
    stages["generate"], report["synthetic"] = first["stages"]["generate"], first["synthetic"]
    for part in parts:
        part_work = Path(part["args"]["work"])
        for name, record in part["stages"]["predict"].items():
            stages.setdefault("predict", {})[name] = {**record, "store": str(part_work / "predictions" / f"{name}.zarr")}
        stages.setdefault("build_runs", {}).update(part["stages"].get("build_runs", {}))
    work.mkdir(parents=True, exist_ok=True)
    shutil.copytree(Path(first["args"]["work"]) / "data", work / "data", dirs_exist_ok=True)
    report["combined_from"] = [str(p) for p in paths]
    return min(report["synthetic"]["crops"], key=lambda c: c["model_voxels"])["synthetic_id"]


def write_report(report: Mapping[str, Any], out: Path) -> None:
    """OUT.json and OUT.md, each written to a temporary sibling and renamed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".json", json.dumps(report, indent=1, default=str)), (".md", markdown(report))):
        path = out.with_name(out.name + suffix)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    """Generate, build, predict, ensemble, post-process, submit, validate, project; the report is rewritten
    after every stage (a run stopped by a time limit keeps what it measured)."""
    import torch

    args = parse_args(argv)
    rates = json.loads(args.rates.read_text()) if args.rates else None
    if args.reproject:
        report = json.loads(args.reproject.read_text())
        for name, rate in steady_rates(args.steady or []).items():
            if name in report["stages"].get("predict", {}):
                report["stages"]["predict"][name]["steady"].update(rate)
            if name in report["stages"].get("predict_ensemble", {}).get("members", {}):
                report["stages"]["predict_ensemble"]["members"][name]["steady"] = rate
        report["projection"] = project(report["stages"], Catalog.official().test("2026"), rates)
        report["rates"] = rates
        write_report(report, args.out)
        print(markdown(report))
        return 0
    device = "cuda" if (torch.cuda.is_available() if args.device == "auto" else args.device == "cuda") else "cpu"
    configs = SMOKE if args.quick else EXPERIMENTS
    names = args.models.split(",") if args.models else sorted(p.stem for p in configs.glob("*.yaml"))
    unknown = [n for n in names if not (configs / f"{n}.yaml").is_file()]
    if unknown:
        raise SystemExit(f"--models: no {configs.relative_to(REPO)}/<name>.yaml for {unknown}")
    if args.predict_only and not args.work:
        raise SystemExit("--predict-only needs --work (the stores must outlive the run)")
    if args.work and args.work.exists() and any(args.work.iterdir()):
        raise SystemExit(f"--work {args.work}: not empty (runs and stores are written fresh)")
    work = args.work or Path(tempfile.mkdtemp(prefix="cellseg-test-set-"))
    os.environ[INDUCTOR_ENV] = str(work / "inductor")  # a compile cache of this run's own: cold at the start
    real = Catalog.official().test("2026")
    stages: dict[str, Any] = {}
    report = {"benchmark": "test_set", "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "environment": environment(device), "stages": stages, "notes": list(NOTES)}

    report["rates"] = rates

    def save() -> None:
        report["projection"] = project(stages, real, rates)
        write_report(report, args.out)

    try:
        if args.downstream_from:
            smallest = combine_predictions(args.downstream_from, report, work)
        else:
            stages["generate"], report["synthetic"] = make_data(args, work / "data", real)
            save()
            smallest = min(report["synthetic"]["crops"], key=lambda c: c["model_voxels"])["synthetic_id"]
            if args.fused:
                builds = stages.setdefault("build_runs", {})
                for name in names:
                    builds[name] = {}
                    with timed(builds[name]):
                        attempt(builds[name], lambda n=name: build_run(n, root=work / "data", run_dir=work / "runs" / n,
                                                                      device=device, quick=args.quick))
                save()
                print("==> predict-ensemble", flush=True)
                ok = {n: b for n, b in builds.items() if b.get("status") == "ok"}
                stages["predict_ensemble"] = {}
                attempt(stages["predict_ensemble"], lambda: fused_stage(
                    ok, work, device=device, warm_crop=str(smallest), steady=steady_rates(args.steady or []),
                    previous_job=args.warm_compile_cache))
                save()
            else:
                run_models(args, names, work, device, str(smallest), stages, save, real)
        if not args.predict_only:
            run_downstream(work, device, smallest, stages, save)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(markdown(report))
    print(f"wrote {args.out}.json and {args.out}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
