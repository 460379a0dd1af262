"""`cellseg predict-volume [CONFIG.yaml] RUN_DIR ... --dataset NAME --out OUT.zarr [key=value ...]`: one run or an
ensemble over a whole dataset (or a world ROI of it), block by block on the daisy scheduler."""

from __future__ import annotations

import argparse
from typing import Any

from cellseg.cli._recipe import (
    PRECEDENCE,
    add_command,
    option,
    print_config,
    resolve,
    show_progress,
    weights_flag,
)
from cellseg.cli.predict import add_backend_option

ORDER = 52


def _classes(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `predict-volume` sub-command."""
    parser = add_command(
        subparsers, "predict-volume", items="RUN_DIR", items_key="ensemble.members", many=True,
        items_help="`cellseg train` run directories or exported member packages (one, or several averaged as by "
                   "predict-ensemble), or one ensemble package of `cellseg export` (its decisions applied)",
        help="predict a whole dataset (or a world ROI) block by block into one multiscale store",
        description="Predict the EM of a whole dataset, or of the world ROI --roi-nm, with one run or an ensemble "
                    "(weights, TTA and sliding window as `cellseg predict-ensemble`; a routed CONFIG with "
                    "volume.scale_nm uses one band) at the members' voxel size, block by block: each block is "
                    "read with the context its tiles need, predicted on a tile lattice shared by all blocks (the "
                    "result does not depend on --block-vox), and written as whole chunks. daisy schedules the "
                    "blocks over workers: one per visible GPU by default (--workers, volume.workers_per_gpu), "
                    "each its own process (`python -m cellseg.volume.worker`, started through volume.launch, "
                    "e.g. srun, on a cluster: docs/hpc.md). Writes OUT.zarr: probabilities/<class>/ as OME-NGFF "
                    "multiscale uint8 (s0 round(255 p), s1.. 2x means) and, with --instances, labels/<class>/ "
                    "(0/1 masks, uint64 ids unique over the volume, objects merged across block faces). Checks "
                    "members, EM level, ROI, output store and free disk before any compute. Finished blocks are "
                    "recorded: --resume skips them after a kill. A failing block is retried "
                    "(volume.max_retries), then listed with its ROI; the others complete and the command exits "
                    "1. OUT.zarr/summary.json holds the counts, failures and rate.\n\n" + PRECEDENCE,
        epilog="examples:\n"
               "  cellseg predict-volume runs/unet_3d --dataset jrc_hela-2 --out hela2.zarr\n"
               "  cellseg predict-volume configs/infer/volume.yaml runs/unet_3d runs/unet_2d --dataset jrc_hela-2 "
               "--out hela2.zarr --roi-nm 0:4096,0:8192,0:8192 --instances\n"
               "  cellseg predict-volume configs/ensemble/routed.yaml volume.scale_nm=8 --dataset jrc_hela-2 "
               "--out hela2.zarr --resume",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    option(parser, "--dataset", key="dataset", metavar="NAME", help="the dataset to predict, e.g. jrc_hela-2")
    option(parser, "--out", key="out", metavar="OUT.zarr", help="the volume store to write")
    option(parser, "--data-root", "--root", key="infer.data_root", metavar="DIR",
           help="data root holding the dataset (default: the first run's data.root)")
    option(parser, "--roi-nm", key="volume.roi_nm", metavar="z0:z1,y0:y1,x0:x1",
           help="world region in nm (default: the whole EM volume at the members' voxel size)")
    option(parser, "--block-vox", key="volume.block_vox", type=int, metavar="N",
           help="edge of a write block in voxels, a multiple of the 64-voxel chunk (default 256)")
    option(parser, "--block-z-vox", key="volume.block_z_vox", type=int, metavar="N",
           help="depth of a write block in z (default: --block-vox; 0: the ROI's whole depth, column blocks that "
                "predict no tile twice along z)")
    option(parser, "--workers", key="volume.workers", type=int, metavar="N",
           help="prediction workers (default: one per visible GPU; 1 on CPU)")
    option(parser, "--device", key="infer.device", choices=("auto", "cpu", "cuda"),
           help="where prediction workers run (default: CUDA if present)")
    option(parser, "--tta", key="infer.tta", type=int, metavar="N", help="test-time transforms per tile: 1 or 8")
    option(parser, "--classes", key="volume.classes", type=_classes, metavar="A,B,...",
           help="classes to predict (default: all of the members'); their boundary channels come along")
    option(parser, "--instances", key="volume.instances", nargs="?", const="default", metavar="PARAMS.json",
           help="also decode masks and instance ids, with the post-processing defaults or a parameter file "
                "(`cellseg postprocess --tune`); put it after the run directories")
    option(parser, "--resume", key="volume.resume", action="store_true",
           help="continue OUT.zarr written with the same settings, skipping finished blocks")
    option(parser, "--weights", key="ensemble.weights", type=weights_flag, metavar="uniform|w1,w2,...|FILE.json",
           help="ensemble weights (as predict-ensemble; default uniform)")
    option(parser, "--decisions", key="ensemble.decisions", metavar="DECISIONS.json",
           help="per-class members, weights and TTA from `cellseg decide` (instead of --weights and --tta; the "
                "RUN_DIR arguments may be left out); --instances decodes with its own parameter file")
    option(parser, "--checkpoint", key="infer.checkpoint", metavar="best|last|PATH",
           help="which checkpoint of each run (default best)")
    option(parser, "--overlap", key="infer.overlap", type=float, help="fraction of a tile shared with its neighbour")
    add_backend_option(parser)
    option(parser, "--batch-size", key="infer.batch_size", type=int, metavar="N",
           help="tiles per sliding-window batch (default: each run's training micro-batch)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the ROI, the blocks and workers, the output's size against the free disk and "
                             "each member's EM read and GPU time at the recorded rates, then stop: nothing is "
                             "predicted or written")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Predict the volume; prints where the store and its summary are, and the failed blocks (exit 1) if any."""
    from cellseg.config.jobs import PredictVolumeJob
    from cellseg.volume.driver import predict_volume

    job = resolve(PredictVolumeJob, args)
    if args.print_config:
        return print_config(job)
    decided = _decided(job) if job.ensemble.decisions else None
    if args.dry_run:
        from cellseg.volume.dry_run import dry_run

        print(dry_run(job, decided))
        return 0
    result = predict_volume(job, progress=show_progress(args, job.infer.progress), decided=decided)
    print(f"{job.out}: {result.tasks.get('predict', {}).get('completed', 0)} blocks predicted, "
          f"{result.predict_mvox_s:.2f} Mvox/s, {result.wall_s:.1f} s; summary in {job.out}/summary.json")
    for f in result.failed:
        print(f"  failed: {f['task']} block {f['block_id']} at {f['offset_vox']} vox, ROI {f['roi_nm']} nm")
    for where, message in result.errors.items():
        print(f"  error ({where}): {message}")
    return 0 if result.ok else 1


def _decided(job: Any) -> Any:
    """The job's decisions file as the volume driver takes it, checked against its runs before any block."""
    from cellseg.decide.apply import applied, check_inference
    from cellseg.decide.document import Decisions
    from cellseg.volume.driver import Decided

    decisions = Decisions.load(job.ensemble.decisions)
    run_dirs = decisions.check_runs(job.ensemble.members, checkpoint=job.infer.checkpoint)
    check_inference(decisions, job.infer)
    return Decided(run_dirs=tuple(str(r) for r in run_dirs), weights=decisions.weights,
                   tta_classes=frozenset(decisions.tta_classes()), tta=decisions.tta_transforms(),
                   provenance=applied(decisions))
