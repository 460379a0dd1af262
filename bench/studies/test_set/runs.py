"""Building what the stages run on: the synthetic root mirroring the real test crops, and one run directory per
architecture with random weights, written by the trainer's own code."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.studies.test_set.layout import (
    EXPERIMENTS,
    POLICIES,
    QUICK_PATCH_3D,
    SMOKE,
    grid_shape,
    match_crops,
    model_voxel_size,
)
from bench.studies.test_set.records import restored_backends
from cellseg.data.crops import Crop
from cellseg.synth.presets import mirror_crops, mirror_preset


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


def build_run(arch: str, *, root: Path, run_dir: Path, device: str, quick: bool) -> dict[str, Any]:
    """A run directory with random weights, written by the trainer's `build_setup` and checkpoint code
    (`configs/experiments/<arch>.yaml`; `--quick`: `configs/smoke/<arch>.yaml`)."""
    from cellseg.config import load_run_config
    from cellseg.train.run_checkpoints import rng_state
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
