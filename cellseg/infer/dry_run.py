"""`--dry-run` of `cellseg predict` and `cellseg predict-ensemble`: what a prediction would write and run, without
predicting or writing anything.

Per crop: its box on the model's grid (z × y × x voxels at the runs' voxel size), the channels the store keeps
for it (`--channels scored`: its scored classes and their boundaries) and their bytes (float16, or uint8 with
`--uint8`); the total against the free disk where `--out` goes (what `check_store_disk` refuses before the first
tile); the model input each run takes, in Gvoxels (tiles with their context × TTA transforms × tile voxels,
`job_gvox`); and the GPU time at the recorded rates of each architecture (`cellseg.infer.rates`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from cellseg.config.inference import InferConfig
from cellseg.data.grid import Grid, shape3
from cellseg.data.inspect import free_disk, human_bytes
from cellseg.infer import rates
from cellseg.infer.crop_plan import crop_grid, scored_channels, store_bytes
from cellseg.infer.run import LoadedRun, job_gvox, load_run, run_transforms, slice_axes
from cellseg.infer.selection import select_targets
from cellseg.infer.tiling import context_margin


def dry_run(run_dirs: Sequence[str | Path], crops: str, out: str | Path, opts: InferConfig) -> str:
    """The plan of predicting `crops` with `run_dirs` (one run, or an ensemble's members) into `out`, as text.
    The runs are loaded on the CPU (their checkpoints are checked); nothing is predicted or written."""
    runs = [load_run(r, opts.checkpoint, device="cpu", data_root=opts.data_root) for r in run_dirs]
    first = runs[0]
    targets = select_targets(crops, first.cfg, first.run_dir, data_root=opts.data_root)
    channels = list(dict.fromkeys(c for r in runs for c in r.channels))
    voxel_size = first.cfg.data.voxel_size_nm
    scored = opts.channels == "scored"
    grids = {t.name: crop_grid(t, voxel_size) for t in targets}  # each opens the crop's EM: once
    voxels = {name: int(np.prod(g.shape_vox)) for name, g in grids.items()}
    sizes = store_bytes(targets, channels, voxels, scored=scored, uint8=opts.uint8)
    vs = "×".join(f"{v:g}" for v in voxel_size)
    lines = [f"dry run: {len(targets)} crops of {crops!r} at {vs} nm into {out} ({'uint8' if opts.uint8 else 'float16'}, "
             f"channels {opts.channels}); nothing is predicted or written", "",
             f"{'crop':<10} {'dataset':<22} {'voxels (z×y×x)':>18} {'channels':>8} {'size':>10}"]
    for t in targets:
        shape = grids[t.name].shape_vox
        kept = scored_channels(channels, t.labels) if scored else channels
        lines.append(f"{t.name:<10} {t.dataset:<22} {'×'.join(map(str, shape)):>18} {len(kept):>8} "
                     f"{human_bytes(sizes[t.name]):>10}")
    (where, free), need = free_disk(out), sum(sizes.values())
    lines += ["", f"total: {sum(voxels.values()):,} voxels, {human_bytes(need)} of probabilities; {where}: {human_bytes(free)} free "
              f"({'fits' if need <= free else 'does NOT fit: predicting would be refused'})"]
    table, time = rates.packaged(), rates.GpuTime()
    for run in runs:
        tfms, axes = len(run_transforms(run, opts.tta)), slice_axes(run, opts.axes_2d)
        gvox = job_gvox(run, targets, overlap=opts.overlap, transforms=tfms, axes=axes)
        estimate = time.add(run.run_dir.name, _gpu_seconds(run, grids, axes, tta=tfms, overlap=opts.overlap))
        lines.append(f"model input of {run.run_dir.name} ({run.cfg.model.name}): {gvox:.2f} Gvoxels (TTA {tfms}, "
                     f"overlap {opts.overlap:g}); {estimate}")
    lines.append(time.missing() if time.unknown else
                 f"GPU time: ≈ {rates.duration(time.total_s)} on one {table['device']} at the rates of "
                 f"{table['source']} ({table['date']}, default presets, compiled; `--dry-run` estimates, the run "
                 "measures)")
    return "\n".join(lines)


def _gpu_seconds(run: LoadedRun, grids: Mapping[str, Grid], axes: Sequence[str], *, tta: int,
                 overlap: float) -> float | None:
    """Seconds of `run` over the crops' `grids` (the runs share their voxel size) at the recorded rate of its
    architecture (None: not recorded for its preset, TTA or overlap): each box with the context it reads, per
    slicing axis."""
    if run.cfg.model.preset != "default":
        return None
    patch = shape3(run.cfg.data.patch_shape_vox)
    margin = context_margin(patch, axes)
    shapes = []
    for grid in grids.values():
        box = grid.shape_vox
        shapes += [[n + 2 * m for n, m in zip(box, margin, strict=True)]] * (len(axes) if patch[0] == 1 else 1)
    return rates.gpu_seconds(run.cfg.model.name, shapes, tta=tta, overlap=overlap)
