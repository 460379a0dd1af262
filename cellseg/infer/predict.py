"""`cellseg predict`: per-class probabilities of a trained run over crops, into a `PredictionStore`.

Stages, one file each: `load_run` (`cellseg.infer.run`: the run directory alone rebuilds the model) →
`select_targets` (`cellseg.infer.selection`: which crops, and the box of each) → `plan_crop`
(`cellseg.infer.crop_plan`: columns, or blocks) → `predict_slabs` (`cellseg.infer.engine`, shared with validation
during training: the model over one box, streamed out in z-slabs as the sliding window completes them) →
`write_columns` (`cellseg.infer.columns`: the store, a chunk of planes at a time, resumably).

A crop is cut in y and x only when its planes do not fit memory (`cellseg.infer.tiling.auto_column_vox`: one
column for a 1000³ crop with 26 channels on an H200), and each column streams through the window in z: the
GPU holds one tile depth of sums, the host one chunk of finished planes, and the store gets a chunk of planes
at a time. No crop has to fit in memory, the test set's 25–32 µm crops work, and no tile runs twice.

Under torchrun every rank predicts its share of the crops (largest first, to the least loaded rank) and
writes them into the same store; rank 0 creates the store first. Crops already complete in the store are
skipped, and a crop a killed run left partly written resumes after the last planes it wrote (the store
renames a crop into place only when it is complete).

Shapes: `K` output channels, `dz` planes, `Y, X` a column's grid.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cellseg import runtime
from cellseg.classes import is_instance
from cellseg.config.inference import InferConfig
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore, quantise
from cellseg.infer.columns import commit_crop, write_columns
from cellseg.infer.crop_plan import (
    box_grid,
    check_store_disk,
    pending_crops,
    plan_crop,
    predict_crops,
    scored_channels,
    shard_crops,
)
from cellseg.infer.engine import Window, predict_slabs, predict_volume, require_em
from cellseg.infer.run import (
    LoadedRun,
    job_gvox,
    load_run,
    run_provenance,
    run_transforms,
    run_window,
    slice_axes,
)
from cellseg.infer.selection import CropTarget, select_targets
from cellseg.infer.tiling import context_margin, count_tiles

log = logging.getLogger(__name__)

# Provenance entries that must agree for a re-run to add crops to an existing store.
RESUME_KEYS = ("run_dir", "checkpoint", "checkpoint_step", "weights", "tta_transforms", "overlap", "blend",
               "axes_2d", "dtype", "voxel_size_nm", "channels")


def open_store(out: str | Path, run: LoadedRun, provenance: dict[str, Any], *, overwrite: bool) -> PredictionStore:
    """Create the store, replace it (`overwrite`), or reopen it to add crops when it was written the same way.

    Raises:
        ValueError: the existing store holds other channels or came from another run/settings (named).
    """
    channels = run.channels
    instance = [c for c in channels if c in run.cfg.data.classes and is_instance(c)]
    out = Path(out)
    if out.exists() and not overwrite:
        store = PredictionStore.create(out, kind="probabilities", channels=channels, instance_channels=instance,
                                       resume=True)
        differ = {k: (store.provenance.get(k), provenance[k]) for k in RESUME_KEYS
                  if store.provenance.get(k) != provenance[k]}
        if differ:
            lines = "; ".join(f"{k}: store {a!r}, now {b!r}" for k, (a, b) in differ.items())
            raise ValueError(f"{out}: written by another run or with other settings ({lines}); "
                             "use --overwrite to replace it or choose another --out")
        return store
    return PredictionStore.create(out, kind="probabilities", channels=channels, instance_channels=instance,
                                  provenance=provenance, overwrite=overwrite)


def predict_run(run_dir: str | Path, crops: str, out: str | Path, opts: InferConfig | None = None
                ) -> list[dict[str, Any]]:
    """Predict `crops` ("val", "test" or ids) of a run into the store `out`; returns one summary per crop
    this rank wrote (crops already in the store are skipped). Works the same under torchrun."""

    opts = opts or InferConfig()
    d = runtime.init_distributed(opts.device)
    try:
        run = load_run(run_dir, opts.checkpoint, device=d.device, data_root=opts.data_root, backend=opts.backend)
        precision = runtime.resolve_precision("auto", d.device)  # bf16 on CUDA, fp32 on CPU
        runtime.configure_backends(tf32=True, cudnn_benchmark=True)  # every tile has the patch's shape
        axes, tfms = slice_axes(run, opts.axes_2d), run_transforms(run, opts.tta)
        tta_hint(len(tfms), d.device)
        targets = select_targets(crops, run.cfg, run.run_dir, data_root=opts.data_root)
        provenance = run_provenance(run, opts, tfms, axes, precision)
        todo = pending_crops(lambda: open_store(out, run, provenance, overwrite=opts.overwrite), targets, out, d,
                             check=lambda crops: check_store_disk(out, crops, run.channels, run.cfg.data.voxel_size_nm,
                                                                  opts))
        store = PredictionStore.open(out)
        mine = shard_crops(todo, d.rank, d.world_size)
        gvox = job_gvox(run, mine, overlap=opts.overlap, transforms=len(tfms), axes=axes)
        window = run_window(run, opts, precision=precision, transforms=tfms, gvox=gvox)
        return predict_crops(mine, lambda target, progress: _predict_one(
            run, window, target, store, opts, axes=axes, rank=d.rank, progress=progress),
            desc="predict", opts=opts, d=d)
    finally:
        runtime.shutdown_distributed()


def tta_hint(transforms: int, device: torch.device) -> None:
    """On the CPU, say that test-time augmentation multiplies the work (each tile is predicted `transforms`
    times) and how to turn it off; the default is kept (it is what scores best)."""
    if device.type == "cpu" and transforms > 1:
        log.info("predicting on the CPU with %dx test-time augmentation (every tile %d times, averaged): --tta 1 "
                 "predicts each tile once, about %dx faster", transforms, transforms, transforms)


def _predict_one(run: LoadedRun, window: Window, target: CropTarget, store: PredictionStore, opts: InferConfig, *,
                 axes: Sequence[str], rank: int, progress: bool) -> dict[str, Any]:
    """Predict one crop into the store, block by block (`cellseg.infer.tiling`): one column or a few, each
    streamed along z and written a chunk of planes at a time (a 2D model over z, y and x: cubic blocks, each
    written whole). A partial crop left by a killed run with the same settings resumes where it stopped."""
    started = time.perf_counter()
    em = target.em()
    grid = box_grid(target.start_nm, target.stop_nm, em, run.cfg.data.voxel_size_nm)
    patch = window.patch_vox
    require_em(em, grid, patch, axes=axes, what=f"{target.name} ({target.dataset})")  # real EM, or a clear error
    channels = scored_channels(run.channels, target.labels) if opts.channels == "scored" else run.channels
    keep = [run.channels.index(c) for c in channels]
    plan = plan_crop(grid.shape_vox, len(channels), patch, axes, run.device, opts.block_vox)
    writer = store.crop_writer(target.name, grid, key=f"{'column' if plan.streamed else 'block'}{plan.edge}",
                               overwrite=opts.overwrite, channels=channels)

    def slabs_of(block: Grid, start: int, on_tiles: Callable[[int], None]) -> Iterator[tuple[int, np.ndarray]]:
        outputs = len(run.channels)
        if plan.streamed:
            return predict_slabs(run.model, em, block, window, num_outputs=outputs, axis=axes[0],  # type: ignore[return-value]
                                 keep=keep, start=start, on_tiles=on_tiles)
        # a block is predicted whole, across every slicing axis, and written at once (it never resumes partly)
        return iter([(0, predict_volume(run.model, em, block, window, num_outputs=outputs, slice_axes=axes, keep=keep,
                                       dtype=torch.float16, on_tiles=on_tiles))])

    def tiles_of(shape: Sequence[int], start: int) -> int:
        return count_tiles(shape, patch, window.overlap, axes, start_plane=start if plan.streamed else 0,
                           batch_size=window.batch_size)

    try:
        tiles = write_columns(writer, plan, slabs_of, tiles_of=tiles_of, progress=progress,
                              encode=quantise if opts.uint8 else None)
    except ValueError:  # refused (NaN probabilities): nothing of the crop is kept; a kill keeps it to resume
        writer.discard()
        raise
    return commit_crop(target, writer, plan, tiles=tiles, tta=len(window.transforms), started=started, rank=rank,
                       attrs={"context_vox": list(context_margin(patch, axes)), "checkpoint_step": run.step,
                              "tta": len(window.transforms)},
                       summary={"batch": window.batch_size, "tta_fold": window.tta_fold})
