"""Planning the crops of a prediction: where each crop's grid lies, which channels it needs, how it is cut into
columns or blocks, which crops are still to do and which rank does them.

Shared by `cellseg predict` (`cellseg.infer.predict`) and `cellseg predict-ensemble` (`cellseg.infer.fused`):

- `box_grid` / `crop_grid`: a crop's box on the model's grid, snapped to the EM lattice;
- `scored_channels`: the channels a test crop is scored on;
- `plan_crop`: columns streamed along z (or cubic blocks, for a 2D model sliced across z, y and x);
- `pending_crops`, `shard_crops`, `predict_crops`: the crops not yet in the store, shared among the ranks
  (largest first, to the least loaded rank) and predicted under a progress bar.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cellseg import runtime
from cellseg.config.inference import InferConfig
from cellseg.data.arrays import MultiscaleImage
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import BOUNDARY_SUFFIX, PredictionStore
from cellseg.data.targets import CropSource
from cellseg.infer.selection import CropTarget
from cellseg.infer.tiling import DEFAULT_CHUNK, auto_block_vox, auto_column_vox, context_margin, plan_blocks

LATTICE_RTOL = 0.01  # a grid within 1% of an EM level's voxel size is snapped to that level's lattice

Block = tuple[tuple[int, int, int], tuple[int, int, int]]  # (offset, shape) in voxels (z, y, x) of the crop grid


# ----------------------------------------------------------------------------------------------- one crop


def box_grid(start_nm: Sequence[float], stop_nm: Sequence[float], em: MultiscaleImage,
             voxel_size_nm: Sequence[float]) -> Grid:
    """The box on a grid of `voxel_size_nm`, snapped to the EM lattice when an EM level has that voxel size."""
    vs = np.asarray(voxel_size_nm, dtype=np.float64)
    start, stop = np.asarray(start_nm, dtype=np.float64), np.asarray(stop_nm, dtype=np.float64)
    shape = np.maximum(1, np.round((stop - start) / vs)).astype(int)
    origin = start + vs / 2
    level = em.choose_level(vs)
    if np.allclose(level.voxel_size_nm, vs, rtol=LATTICE_RTOL):
        origin = np.asarray(level.translation_nm) + np.round((origin - level.translation_nm) / vs) * vs
    return Grid.of(translation_nm=origin, shape_vox=shape, voxel_size_nm=vs)


def crop_grid(crop: CropSource | CropTarget, voxel_size_nm: Sequence[float]) -> Grid:
    """The crop's annotated box (a test crop's box) on the model's grid (see `box_grid`)."""
    return box_grid(crop.start_nm, crop.stop_nm, crop.em(), voxel_size_nm)


def scored_channels(channels: Sequence[str], labels: Sequence[str]) -> tuple[str, ...]:
    """The channels a crop scored on `labels` needs: those labels and their boundary channels, in the model's
    order (all channels when the labels are not known, e.g. validation crops)."""
    if not labels:
        return tuple(channels)
    wanted = set(labels)
    return tuple(c for c in channels if c in wanted or c.removesuffix(BOUNDARY_SUFFIX) in wanted)


@dataclass(frozen=True)
class CropPlan:
    """How a crop is cut (`plan_crop`) and written (`cellseg.infer.columns.write_columns`)."""

    streamed: bool  # columns streamed along the slicing axis (3D, or 2D across z); else whole cubic blocks
    edge: int  # column edge in y, x (or block edge)
    blocks: list[Block]  # (offset, shape) of each column or block
    flush: int  # planes per write (the last write of a column may be shorter)

    @classmethod
    def columns(cls, shape_vox: Sequence[int], edge: int) -> CropPlan:
        """Columns of at most `edge`² voxels in y, x, each the crop's whole depth, streamed along z and written
        a store chunk of planes at a time."""
        return cls(True, edge, plan_blocks(shape_vox, (shape_vox[0], edge, edge)), min(edge, DEFAULT_CHUNK))


def plan_crop(shape_vox: Sequence[int], num_channels: int, patch: Sequence[int], axes: Sequence[str],
              device: torch.device, block_vox: int | None = None, gpu_bytes: int | None = None) -> CropPlan:
    """Columns (or blocks, for a 2D model over several axes) of a crop grid of `shape_vox` predicting
    `num_channels` channels; the largest memory allows unless `block_vox` is given (`cellseg.infer.tiling`;
    `gpu_bytes`: plan for a GPU of this memory instead of `device`'s)."""
    margin = context_margin(patch, axes)
    if len(axes) == 1:
        return CropPlan.columns(shape_vox, block_vox or auto_column_vox(num_channels, patch, margin, device,
                                                                        gpu_bytes))
    edge = block_vox or auto_block_vox(num_channels, margin, device)
    return CropPlan(False, edge, plan_blocks(shape_vox, edge), edge)


# ----------------------------------------------------------------------------------------------- the crops


VoxelSizes = Sequence[float] | Mapping[str, Sequence[float]]  # one for every crop, or per crop name


def crop_voxels(targets: Sequence[CropTarget], voxel_size_nm: VoxelSizes) -> dict[str, int]:
    """Voxels of each crop's box on the model's grid (`voxel_size_nm`, or one per crop name)."""
    return {t.name: int(np.prod(crop_grid(t, voxel_size_nm[t.name] if isinstance(voxel_size_nm, Mapping)
                                          else voxel_size_nm).shape_vox)) for t in targets}


def store_bytes(targets: Sequence[CropTarget], channels: Sequence[str], voxels: Mapping[str, int], *,
                scored: bool, uint8: bool) -> dict[str, int]:
    """Bytes (uncompressed) each crop's probabilities take in a prediction store: its voxels (`crop_voxels`) × its
    channels (`scored`: a test crop's scored classes and their boundaries) × 1 (uint8) or 2 (float16)."""
    return {t.name: voxels[t.name] * len(scored_channels(channels, t.labels) if scored else channels)
            * (1 if uint8 else 2) for t in targets}


def check_store_disk(out: str | Path, targets: Sequence[CropTarget], channels: Sequence[str],
                     voxel_size_nm: VoxelSizes, opts: InferConfig) -> None:
    """Refuse, before any tile is predicted, crops whose store would not fit the free disk where `out` goes
    (uncompressed: a prediction compresses little, and a full disk mid-crop costs the job).

    Raises:
        OSError: the size needed (the largest crops named), the space free and the options that would fit.
    """
    from cellseg.data.inspect import free_disk, human_bytes

    where, free = free_disk(out)
    voxels = crop_voxels(targets, voxel_size_nm)
    sizes = store_bytes(targets, channels, voxels, scored=opts.channels == "scored", uint8=opts.uint8)
    need = sum(sizes.values())
    if need <= free:
        return
    fits = [flag for flag, scored, uint8 in (("--uint8", opts.channels == "scored", True),
                                             ("--channels scored", True, opts.uint8),
                                             ("--channels scored --uint8", True, True))
            if (scored, uint8) != (opts.channels == "scored", opts.uint8)
            and sum(store_bytes(targets, channels, voxels, scored=scored, uint8=uint8).values()) <= free]
    largest = ", ".join(f"{n} {human_bytes(b)}" for n, b in sorted(sizes.items(), key=lambda x: -x[1])[:5])
    advice = (f"{' or '.join(fits)} would fit" if fits else "no setting of --uint8/--channels fits") + (
        "; or predict fewer crops (--crops IDS) or write to a larger disk (--out)")
    raise OSError(f"{out}: the {len(sizes)} crops need about {human_bytes(need)} of probabilities "
                  f"({'uint8' if opts.uint8 else 'float16'}, channels {opts.channels}; largest: {largest}), {where} "
                  f"has {human_bytes(free)} free: {advice}. Nothing was predicted")


def pending_crops(open_out: Callable[[], PredictionStore], targets: Sequence[CropTarget], out: str | Path,
                  d: runtime.Dist, check: Callable[[Sequence[CropTarget]], None] | None = None) -> list[CropTarget]:
    """The targets not yet complete in the output store, on every rank: rank 0 opens (or creates) it with
    `open_out` and says how many crops it skips. Also the barrier after which the store exists. `check` (e.g.
    `check_store_disk`) sees the crops to predict first: all of them before a new store is created, the missing
    ones of an existing store."""
    todo: list[CropTarget] | None = None
    if d.is_main:
        existing = Path(out).exists()
        if check is not None and not existing:
            check(targets)
        done = set(open_out().completed())
        todo = [t for t in targets if t.name not in done]
        if check is not None and existing:
            check(todo)
        if len(todo) < len(targets):
            print(f"{out}: {len(targets) - len(todo)} of {len(targets)} crops already complete, skipped"
                  + ("" if todo else " (nothing to do; --overwrite to redo them)"))
    return runtime.broadcast_object(todo, d) or []  # type: ignore[return-value]


def shard_crops(targets: Sequence[CropTarget], rank: int, world: int) -> list[CropTarget]:
    """Largest crops first, each to the least loaded rank (the same answer on every rank)."""
    load = [0.0] * world
    mine = []
    for t in sorted(targets, key=lambda t: (-t.volume_nm3, t.name)):
        r = min(range(world), key=lambda i: (load[i], i))
        load[r] += t.volume_nm3
        if r == rank:
            mine.append(t)
    return mine


def predict_crops(crops: Sequence[CropTarget], predict_one: Callable[[CropTarget, bool], dict[str, Any]], *,
                  desc: str, opts: InferConfig, d: runtime.Dist) -> list[dict[str, Any]]:
    """`predict_one(crop, show tile progress)` for this rank's crops under a crop progress bar (rank 0), printing
    each summary's line; then wait for every rank. Returns the summaries."""
    from tqdm import tqdm

    summaries = []
    with tqdm(total=len(crops), desc=f"{desc} (rank {d.rank})" if d.distributed else desc, unit="crop",
              disable=not (opts.progress and d.is_main)) as crop_bar:
        for target in crops:
            summaries.append(predict_one(target, not crop_bar.disable))
            crop_bar.write(summaries[-1]["line"])
            crop_bar.update(1)
    runtime.barrier(d)
    return summaries
