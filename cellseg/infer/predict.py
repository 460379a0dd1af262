"""`cellseg predict`: per-class probabilities of a trained run over crops, into a `PredictionStore`.

Stages, one file each: `load_run` (the run directory alone rebuilds the model: `config.yaml`, `meta.json`,
`checkpoints/<best|last>.pt`, EMA weights when the run validated with them) → `select_targets`
(`cellseg.infer.selection`: which crops, and the box of each) → `predict_volume` (the engine shared with
validation during training) → the store.

`predict_slabs` (`cellseg.infer.engine`): the model over one box, streamed out in z-slabs as the
sliding window completes them.

A crop is cut in y and x only when its planes do not fit memory (`cellseg.infer.tiling.auto_column_vox`: one
column for a 1000³ crop with 26 channels on an H200), and each column streams through the window in z: the
GPU holds one tile depth of sums, the host one chunk of finished planes, and the store gets a chunk of planes
at a time. No crop has to fit in memory, the test set's 25–32 µm crops work, and no tile runs twice.

Under torchrun every rank predicts its share of the crops (largest first, to the least loaded rank) and
writes them into the same store; rank 0 creates the store first. Crops already complete in the store are
skipped, and a crop a killed run left partly written resumes after the last planes it wrote (the store
renames a crop into place only when it is complete).

Shapes: `K` output channels, `C` image channels (1), `B` tiles, `S` a tile's spatial axes, `ZYX` the crop's grid
(plus context while predicting).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import pickle
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import cellseg
from cellseg import runtime
from cellseg.classes import is_instance
from cellseg.config import load_run_config
from cellseg.config.inference import InferConfig
from cellseg.config.schema import RunConfig
from cellseg.data.arrays import MultiscaleImage
from cellseg.data.grid import Grid
from cellseg.data.targets import CropSource
from cellseg.infer import tta
from cellseg.infer.engine import Window, predict_slabs, predict_volume, tta_fold
from cellseg.infer.selection import CropTarget, select_targets
from cellseg.infer.store import BOUNDARY_SUFFIX, PredictionStore, quantise
from cellseg.infer.tiling import (
    DEFAULT_CHUNK,
    auto_block_vox,
    auto_column_vox,
    context_margin,
    count_tiles,
    plan_blocks,
    sub_grid,
)
from cellseg.models import build_model
from cellseg.runtime.checkpoint import load as load_checkpoint
from cellseg.runtime.compile import CompiledModel

log = logging.getLogger(__name__)
ISOTROPY_RTOL = 0.01  # voxel sizes within 1% count as equal (slicing a 2D model across z, y and x)
# Provenance entries that must agree for a re-run to add crops to an existing store.
RESUME_KEYS = ("run_dir", "checkpoint", "checkpoint_step", "weights", "tta_transforms", "overlap", "blend",
               "axes_2d", "dtype", "voxel_size_nm", "channels")


# ----------------------------------------------------------------------------------------------- the run


@dataclass
class LoadedRun:
    """A trained model rebuilt from its run directory, in eval mode on `device`."""

    run_dir: Path
    cfg: RunConfig
    meta: dict[str, Any]
    model: torch.nn.Module
    checkpoint: Path
    step: int
    weights: str  # "ema" or "model"
    device: torch.device

    @property
    def channels(self) -> tuple[str, ...]:
        """Output channels: the classes, then `<class>_boundary` channels (meta.json "channels")."""
        return tuple(self.meta["channels"])

    @property
    def spatial_dims(self) -> int:
        """2 or 3."""
        return 2 if self.cfg.data.is_2d else 3


def checkpoint_path(run_dir: Path, checkpoint: str) -> Path:
    """The checkpoint file of `checkpoint` ("best", "last" or a path); FileNotFoundError names those present."""
    if checkpoint not in ("best", "last"):
        path = Path(checkpoint)
        if not path.is_file():
            raise FileNotFoundError(f"--checkpoint {checkpoint}: no such checkpoint file")
        return path
    path = run_dir / "checkpoints" / f"{checkpoint}.pt"
    if not path.is_file():
        present = sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt")) if path.parent.is_dir() else []
        hint = " (the run never validated: use --checkpoint last)" if checkpoint == "best" and present else ""
        raise FileNotFoundError(f"{run_dir}: no checkpoint {path.name} in {path.parent} "
                                f"(present: {', '.join(present) or 'none'}){hint}")
    return path


def load_run(run_dir: str | Path, checkpoint: str = "best", *, device: torch.device | str = "cpu",
             data_root: str | None = None) -> LoadedRun:
    """Rebuild a run's model from `config.yaml` + `meta.json` + a checkpoint.

    Args:
        run_dir: a `cellseg train` run directory.
        checkpoint: "best", "last" or the path of a checkpoint file.
        device: where the model goes (channels-last on CUDA).
        data_root: replaces the run's `data.root`.

    Raises:
        FileNotFoundError: no config.yaml/meta.json, or no such checkpoint (the present ones are named).
        ValueError: meta.json disagrees with the config or the checkpoint with the architecture.
    """
    run_dir, device = Path(run_dir), torch.device(device)
    for name in ("config.yaml", "meta.json"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir / name}: missing (is {run_dir} a `cellseg train` run directory?)")
    cfg = load_run_config(run_dir / "config.yaml", [f"data.root={data_root}"] if data_root else [])
    meta = json.loads((run_dir / "meta.json").read_text())
    if len(meta.get("channels", ())) != cfg.data.num_target_channels:
        raise ValueError(f"{run_dir / 'meta.json'}: channels {meta.get('channels')} do not match the config's "
                         f"{cfg.data.num_target_channels} output channels")
    path = checkpoint_path(run_dir, checkpoint)
    try:
        ckpt = load_checkpoint(path)
    except (RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as err:  # truncated or not a torch file
        raise ValueError(f"{path}: not a readable checkpoint ({err})") from None
    if "model" not in ckpt or "step" not in ckpt:
        raise ValueError(f"{path}: not a cellseg checkpoint (no 'model' weights or 'step')")
    model = build_model(cfg.model.name, 1, cfg.data.num_target_channels, preset=cfg.model.preset, **cfg.model.params)
    # Validation during training used the EMA weights when the run kept them (`Setup.eval_model`): so do we.
    weights = "ema" if ckpt.get("ema") is not None else "model"
    state = ckpt["ema"] if weights == "ema" else ckpt["model"]
    own = model.state_dict()
    try:
        model.load_state_dict({k: v.to(own[k].dtype) if k in own else v for k, v in state.items()})
    except RuntimeError as err:
        raise ValueError(f"{path}: weights do not fit {cfg.model.name} ({cfg.model.preset}): {err}") from None
    fmt = runtime.memory_format(2 if cfg.data.is_2d else 3, device.type == "cuda")
    model = model.to(device=device, memory_format=fmt).eval()
    log.info("loaded %s (%s weights, step %d) from %s", cfg.model.name, weights, ckpt["step"], path)
    return LoadedRun(run_dir=run_dir, cfg=cfg, meta=meta, model=model, checkpoint=path, step=int(ckpt["step"]),
                     weights=weights, device=device)


# ----------------------------------------------------------------------------------------------- the engine


def box_grid(start_nm: Sequence[float], stop_nm: Sequence[float], em: MultiscaleImage,
             voxel_size_nm: Sequence[float]) -> Grid:
    """The box on a grid of `voxel_size_nm`, snapped to the EM lattice when an EM level has that voxel size."""
    vs = np.asarray(voxel_size_nm, dtype=np.float64)
    start, stop = np.asarray(start_nm, dtype=np.float64), np.asarray(stop_nm, dtype=np.float64)
    shape = np.maximum(1, np.round((stop - start) / vs)).astype(int)
    origin = start + vs / 2
    level = em.choose_level(vs)
    if np.allclose(level.voxel_size_nm, vs, rtol=0.01):
        origin = np.asarray(level.translation_nm) + np.round((origin - level.translation_nm) / vs) * vs
    return Grid(translation_nm=tuple(float(o) for o in origin), shape_vox=tuple(int(n) for n in shape),  # type: ignore[arg-type]
                voxel_size_nm=tuple(float(v) for v in vs))  # type: ignore[arg-type]


def crop_grid(crop: CropSource | CropTarget, voxel_size_nm: Sequence[float]) -> Grid:
    """The crop's annotated box (a test crop's box) on the model's grid (see `box_grid`)."""
    return box_grid(crop.start_nm, crop.stop_nm, crop.em(), voxel_size_nm)


# ----------------------------------------------------------------------------------------------- the command


def _slice_axes(run: LoadedRun, axes_2d: str) -> tuple[str, ...]:
    if run.spatial_dims == 3 or axes_2d == "z":
        return ("z",)
    vs = run.cfg.data.voxel_size_nm
    if max(vs) > min(vs) * (1 + ISOTROPY_RTOL):
        raise ValueError(f"--axes-2d zyx needs isotropic voxels; {run.run_dir} predicts at {list(vs)} nm")
    if set(run.cfg.data.slice_axes) != {"z", "y", "x"}:
        log.warning("%s trained on slices across %s only; predicting across z, y and x anyway", run.run_dir,
                    list(run.cfg.data.slice_axes))
    return ("z", "y", "x")


def run_transforms(run: LoadedRun, n: int) -> list[tta.Transform]:
    spec = run.meta.get("model", {})
    model_spec = getattr(run.model, "spec", None)
    flip = spec.get("tta_axes", model_spec.tta_axes if model_spec else ())
    swap = spec.get("tta_transpose_axes", model_spec.tta_transpose_axes if model_spec else ())
    return tta.transforms(run.spatial_dims, flip, n, transpose_axes=swap)


def run_provenance(run: LoadedRun, opts: InferConfig, tfms: Sequence[tta.Transform], axes: Sequence[str],
                precision: str) -> dict[str, Any]:
    return {"run_dir": str(run.run_dir.resolve()), "checkpoint": str(run.checkpoint.resolve()),
            "checkpoint_step": run.step, "weights": run.weights, "model": run.cfg.model.name,
            "preset": run.cfg.model.preset, "voxel_size_nm": list(run.cfg.data.voxel_size_nm),
            "patch_shape_vox": list(run.cfg.data.patch_shape_vox), "tta": len(tfms),
            "tta_transforms": [t.name for t in tfms], "overlap": opts.overlap, "blend": opts.blend,
            "axes_2d": "".join(axes) if run.spatial_dims == 2 else None, "precision": precision,
            "dtype": "uint8" if opts.uint8 else "float16", "channels": opts.channels, "compile": opts.compile,
            "cellseg_version": cellseg.__version__,
            "git_commit": run.meta.get("git_commit"), "data_root": opts.data_root or run.cfg.data.root,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


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


def pending_crops(open_out: Callable[[], PredictionStore], targets: Sequence[CropTarget], out: str | Path,
                  d: runtime.Dist) -> list[CropTarget]:
    """The targets not yet complete in the output store, on every rank: rank 0 opens (or creates) it with
    `open_out` and says how many crops it skips. Also the barrier after which the store exists."""
    todo: list[CropTarget] | None = None
    if d.is_main:
        done = set(open_out().completed())
        todo = [t for t in targets if t.name not in done]
        if len(todo) < len(targets):
            print(f"{out}: {len(targets) - len(todo)} of {len(targets)} crops already complete, skipped"
                  + ("" if todo else " (nothing to do; --overwrite to redo them)"))
    return runtime.broadcast_object(todo, d) or []  # type: ignore[return-value]


def run_settings(run: LoadedRun, opts: InferConfig, num_transforms: int
                 ) -> tuple[int, CompiledModel | None, int]:
    """(tiles per batch, the model under torch.compile or None, TTA passes per forward) of a run on its device."""
    batch = opts.batch_size or int(run.meta.get("batch_size") or run.cfg.val.batch_size)
    compiled = CompiledModel(run.model) if opts.compile == "on" or (
        opts.compile == "auto" and run.device.type == "cuda") else None
    fold = opts.tta_fold or tta_fold(batch, run.cfg.data.patch_shape_vox, num_transforms, run.device)
    return batch, compiled, fold


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


def predict_run(run_dir: str | Path, crops: str, out: str | Path, opts: InferConfig | None = None
                ) -> list[dict[str, Any]]:
    """Predict `crops` ("val", "test" or ids) of a run into the store `out`; returns one summary per crop
    this rank wrote (crops already in the store are skipped). Works the same under torchrun."""

    opts = opts or InferConfig()
    d = runtime.init_distributed(opts.device)
    try:
        run = load_run(run_dir, opts.checkpoint, device=d.device, data_root=opts.data_root)
        precision = runtime.resolve_precision("auto", d.device)  # bf16 on CUDA, fp32 on CPU
        runtime.configure_backends(tf32=True, cudnn_benchmark=True)  # every tile has the patch's shape
        axes, tfms = _slice_axes(run, opts.axes_2d), run_transforms(run, opts.tta)
        targets = select_targets(crops, run.cfg, run.run_dir, data_root=opts.data_root)
        provenance = run_provenance(run, opts, tfms, axes, precision)
        todo = pending_crops(lambda: open_store(out, run, provenance, overwrite=opts.overwrite), targets, out, d)
        store = PredictionStore.open(out)
        mine = shard_crops(todo, d.rank, d.world_size)
        patch = run.cfg.data.patch_shape_vox
        batch, compiled, fold = run_settings(run, opts, len(tfms))
        return predict_crops(mine, lambda target, progress: _predict_one(
            run, target, store, opts, tfms=tfms, axes=axes, precision=precision, batch=batch, patch=patch,
            rank=d.rank, progress=progress, compiled=compiled, fold=fold), desc="predict", opts=opts, d=d)
    finally:
        runtime.shutdown_distributed()


def _predict_one(run: LoadedRun, target: CropTarget, store: PredictionStore, opts: InferConfig, *,
                 tfms: Sequence[tta.Transform], axes: Sequence[str], precision: runtime.Precision, batch: int,
                 patch: Sequence[int], rank: int, progress: bool, compiled: CompiledModel | None, fold: int = 1
                 ) -> dict[str, Any]:
    """Predict one crop into the store, block by block (`cellseg.infer.tiling`): one column or a few, each
    streamed along z and written a chunk of planes at a time (a 2D model over z, y and x: cubic blocks, each
    written whole). A partial crop left by a killed run with the same settings resumes where it stopped."""
    from tqdm import tqdm

    cfg = run.cfg
    started = time.perf_counter()
    em = target.em()
    grid = box_grid(target.start_nm, target.stop_nm, em, cfg.data.voxel_size_nm)
    margin = context_margin(patch, axes)
    channels = scored_channels(run.channels, target.labels) if opts.channels == "scored" else run.channels
    keep = [run.channels.index(c) for c in channels]
    window = Window(patch_vox=tuple(patch), device=run.device, precision=precision, overlap=opts.overlap,  # type: ignore[arg-type]
                    batch_size=batch, blend=opts.blend, transforms=tuple(tfms), channels_last=True,
                    pad_value=cfg.data.em_pad_value, compiled=compiled, tta_fold=fold)
    plan = plan_crop(grid.shape_vox, len(channels), patch, axes, run.device, opts.block_vox)
    streamed, edge, blocks, flush = plan.streamed, plan.edge, plan.blocks, plan.flush
    writer = store.crop_writer(target.name, grid, key=f"{'column' if streamed else 'block'}{edge}",
                               overwrite=opts.overwrite, channels=channels)
    resume = resume_planes(writer.done)
    todo = [(o, n, resume.get(block_id(o), 0)) for o, n in blocks if resume.get(block_id(o), 0) < n[0]]
    if len(todo) < len(blocks) or any(z for *_, z in todo):
        log.info("%s: resuming, %d of %d blocks already written, %d partly", target.name,
                 len(blocks) - len(todo), len(blocks), sum(1 for *_, z in todo if z))
    num_tiles = sum(count_tiles(n, patch, opts.overlap, axes, start_plane=z if streamed else 0, batch_size=batch)
                    for _, n, z in todo)
    with tqdm(total=num_tiles, desc=target.name, unit="tile", leave=False, disable=not progress) as bar:
        for offset, shape, z_done in todo:
            block = sub_grid(grid, offset, shape)
            if streamed:
                slabs = predict_slabs(run.model, em, block, window, num_outputs=len(run.channels), axis=axes[0],
                                      keep=keep, start=z_done, on_tiles=bar.update)
            else:
                slabs = iter([(0, predict_volume(run.model, em, block, patch_vox=patch, num_outputs=len(run.channels),
                                                 device=run.device, precision=precision, overlap=opts.overlap,
                                                 batch_size=batch, blend=opts.blend, transforms=tfms, slice_axes=axes,
                                                 channels_last=True, pad_value=cfg.data.em_pad_value,
                                                 on_tiles=bar.update, dtype=torch.float16, keep=keep,
                                                 compiled=compiled, tta_fold=fold))])
            for z0, planes in chunked_slabs(slabs, shape[0], flush, z_done):
                writer.write_all({c: quantise(planes[k]) if opts.uint8 else planes[k] for k, c in enumerate(channels)},
                                 (offset[0] + z0, offset[1], offset[2]))
                writer.mark_done(f"{block_id(offset)}:{z0 + planes.shape[1]}")
    seconds = time.perf_counter() - started
    mvox = math.prod(grid.shape_vox) / 1e6
    attrs = {"dataset": target.dataset, "split": target.split, "em_url": target.em_url,
             "context_vox": list(margin), "block_vox": edge, "streamed": streamed, "num_channels": len(channels),
             "blocks": len(blocks), "tiles": num_tiles,
             "checkpoint_step": run.step, "tta": len(tfms), "seconds": round(seconds, 3),
             "mvox_per_s": round(mvox / seconds, 4), "rank": rank,
             "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    writer.commit(attrs)
    shape_text = "×".join(str(n) for n in grid.shape_vox)
    kind = f"column(s) of ≤ {edge}² in y, x" if streamed else f"block(s) of ≤ {edge}³"
    line = (f"{target.name} ({target.dataset}, {target.split}): {shape_text} vox at "
            f"{'×'.join(f'{v:g}' for v in grid.voxel_size_nm)} nm, {len(blocks)} {kind}, "
            f"{num_tiles} tiles × {len(tfms)} TTA, {seconds:.1f} s, {mvox / seconds:.3g} Mvox/s")
    return {"crop": target.name, "shape_vox": list(grid.shape_vox), "seconds": seconds, "tiles": num_tiles, "batch": batch,
            "tta_fold": fold,
            "mvox_per_s": mvox / seconds, "blocks": len(blocks), "block_vox": edge, "line": line}


@dataclass(frozen=True)
class CropPlan:
    """How `_predict_one` cuts a crop (`plan_crop`)."""

    streamed: bool  # columns streamed along the slicing axis (3D, or 2D across z); else whole cubic blocks
    edge: int  # column edge in y, x (or block edge)
    blocks: list[tuple[tuple[int, int, int], tuple[int, int, int]]]  # (offset, shape) of each column or block
    flush: int  # planes per write (the last write of a column may be shorter)


def plan_crop(shape_vox: Sequence[int], num_channels: int, patch: Sequence[int], axes: Sequence[str],
              device: torch.device, block_vox: int | None = None, gpu_bytes: int | None = None) -> CropPlan:
    """Columns (or blocks, for a 2D model over several axes) of a crop grid of `shape_vox` predicting
    `num_channels` channels; the largest memory allows unless `block_vox` is given (`cellseg.infer.tiling`;
    `gpu_bytes`: plan for a GPU of this memory instead of `device`'s)."""
    margin = context_margin(patch, axes)
    if len(axes) == 1:
        edge = block_vox or auto_column_vox(num_channels, patch, margin, device, gpu_bytes)
        return CropPlan(True, edge, plan_blocks(shape_vox, (shape_vox[0], edge, edge)), min(edge, DEFAULT_CHUNK))
    edge = block_vox or auto_block_vox(num_channels, margin, device)
    return CropPlan(False, edge, plan_blocks(shape_vox, edge), edge)


def chunked_slabs(slabs: Iterator[tuple[int, np.ndarray]], depth: int, flush: int, start: int
             ) -> Iterator[tuple[int, np.ndarray]]:
    """Regroup slabs (offset, (K, dz, Y, X)) along z into pieces ending on multiples of `flush` (or at `depth`),
    so that every write but the last covers whole store chunks and marks a point to resume from."""
    pending: list[np.ndarray] = []
    begin = end = start
    for z0, slab in slabs:
        if z0 != end:
            raise AssertionError(f"slab at plane {z0}, expected {end}")  # predict_slabs yields planes in order
        pending.append(slab)
        end += slab.shape[1]
        cut = end if end == depth else end - end % flush
        if cut > begin:
            joined = np.concatenate(pending, axis=1) if len(pending) > 1 else pending[0]
            yield begin, joined[:, :cut - begin]
            pending, begin = ([joined[:, cut - begin:]] if end > cut else []), cut


def resume_planes(done: Iterable[str]) -> dict[str, int]:
    """Block id → planes already written (the units `_predict_one` marks: "<block id>:<planes>")."""
    planes: dict[str, int] = {}
    for unit in done:
        block, _, z = unit.rpartition(":")
        if block and z.isdigit():
            planes[block] = max(planes.get(block, 0), int(z))
    return planes


def scored_channels(channels: Sequence[str], labels: Sequence[str]) -> tuple[str, ...]:
    """The channels a crop scored on `labels` needs: those labels and their boundary channels, in the model's
    order (all channels when the labels are not known, e.g. validation crops)."""
    if not labels:
        return tuple(channels)
    wanted = set(labels)
    return tuple(c for c in channels if c in wanted or c.removesuffix(BOUNDARY_SUFFIX) in wanted)


def block_id(offset: Sequence[int]) -> str:
    return "_".join(str(o) for o in offset)
