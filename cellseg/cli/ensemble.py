"""`cellseg ensemble [CONFIG.yaml] PRED_A.zarr PRED_B.zarr ... --out ENS.zarr [key=value ...]`: weighted mean of
probability predictions."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from cellseg.cli._eras import LazyChoices
from cellseg.cli._recipe import (
    PRECEDENCE,
    add_command,
    option,
    print_config,
    resolve,
    show_progress,
    weights_flag,
)
from cellseg.config.fields import DEFAULT_ERA

if TYPE_CHECKING:
    from cellseg.infer.ensemble import EnsembleResult

ORDER = 52


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `ensemble` sub-command."""
    parser = add_command(
        subparsers, "ensemble", items="PRED.zarr", items_key="ensemble.members", many=True,
        items_help="probability stores (at least 2, in order)",
        help="weighted mean of several probability predictions (uniform, given or fitted weights)",
        description="Average the per-class probabilities of several `cellseg predict` stores into one store. "
                    "Members may come from models at different voxel sizes: each crop is resampled to a common "
                    "grid (--grid). Only crops present in every member are written; the others are named in "
                    "the log. --weights auto fits per-class weights on validation crops against the challenge "
                    "metric (--metric), shrunk towards uniform (--shrink, more with fewer validation crops); "
                    "the weights are stored in the output's provenance and in ENS.zarr/weights.json, which "
                    "--weights accepts to apply the same weights to other predictions of the same members "
                    "(e.g. the test crops). The method is documented in cellseg/infer/ensemble_fit.py.\n\n"
                    + PRECEDENCE,
        epilog="examples:\n"
               "  cellseg ensemble unet3d_val.zarr unet2d_val.zarr --out ens_val.zarr --weights auto --truth data/\n"
               "  cellseg ensemble unet3d_test.zarr unet2d_test.zarr --out ens_test.zarr "
               "--weights ens_val.zarr/weights.json\n"
               "  cellseg ensemble configs/ensemble/eight.yaml preds/val/*.zarr out=preds/ens_val.zarr ensemble.weights=auto",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    option(parser, "--out", key="out", metavar="ENS.zarr", help="output probability store")
    option(parser, "--weights", key="ensemble.weights", type=weights_flag, metavar="auto|uniform|w1,w2,...|FILE.json",
           help="'uniform' (default), 'auto' (fit per class on validation crops), one weight per member "
                "(normalised), or a weights.json written by an earlier ensemble")
    option(parser, "--grid", key="ensemble.grid", choices=("finest", "first"),
           help="common grid per crop: the finest member's (default) or the first member's")
    option(parser, "--allow-partial", key="ensemble.allow_partial", action="store_true",
           help="members may have different classes: each class averages the members that have it")
    fit = parser.add_argument_group("fitting (--weights auto)")
    option(fit, "--truth", key="ensemble.fit.truth_root", metavar="DATA_ROOT",
           help="data root with the validation crops' labels (default: the members' provenance)")
    option(fit, "--crops", key="ensemble.fit.crops", metavar="val|IDS",
           help="crops to fit on: 'val' (default: the validation crops of every member's run) or comma-separated "
                "ids, e.g. 12,34")
    option(fit, "--metric", key="ensemble.fit.metric", choices=LazyChoices(), metavar="ERA",
           help=f"scoring era of the fit: %(choices)s (default {DEFAULT_ERA}, the leaderboard's, reconstructed)")
    option(fit, "--shrink", key="ensemble.fit.shrink", type=float, metavar="F",
           help="shrinkage towards uniform with ample validation data, in [0, 1] (default 0.5); fewer than 8 "
                "validation crops or 10^4 truth voxels of a class shrink it more")
    option(fit, "--instance-score", key="ensemble.fit.instance_score", choices=("iou", "metric"),
           help="fit instance classes on their foreground IoU (default) or on the official instance score of "
                "connected components (slower)")
    option(fit, "--device", key="ensemble.fit.device", choices=("auto", "cpu", "cuda"),
           help="where candidate ensembles are mixed and counted (default: CUDA when available)")
    option(parser, "--uint8", key="uint8", action="store_true",
           help="store uint8-quantised probabilities (default float16)")
    option(parser, "--overwrite", key="overwrite", action="store_true", help="replace ENS.zarr if it exists")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Ensemble, then print the channels, weights and (for auto) validation scores."""
    from cellseg.config.jobs import EnsembleJob

    job = resolve(EnsembleJob, args)
    if args.print_config:
        return print_config(job)
    from cellseg.infer.ensemble import ensemble

    if Path(job.out).exists() and not job.overwrite:  # before any work; main() reports ValueErrors in one line
        raise ValueError(f"{job.out} already exists; pass --overwrite to replace it")
    result = ensemble(job.ensemble, job.out, uint8=job.uint8, overwrite=job.overwrite, progress=show_progress(args))
    print(format_summary(result, list(job.ensemble.members)))
    return 0


def format_summary(result: EnsembleResult, members: list[str]) -> str:
    """A plain-text table: one row per channel, one weight column per member, and the fit's scores."""
    weights = result.weights
    fit = weights.report.get("classes", {})
    lines = [f"wrote {result.store.path}: {len(result.crops)} crops, {len(weights.per_channel)} channels, "
             f"weights: {weights.method}"]
    if result.skipped:
        lines.append(f"skipped (not in every member): {', '.join(result.skipped)}")
    lines += [f"  member {i + 1}: {m}" for i, m in enumerate(members)]
    if weights.method == "auto":
        lines.append(f"fit on {len(weights.report['validation_crops'])} validation crops, "
                     f"{weights.report['metric']} metric, shrink {weights.report['shrink']}")
    header = "channel".ljust(22) + "".join(f"w{i + 1}".rjust(8) for i in range(len(members)))
    lines.append(header + ("   scores: members | uniform | final (chosen)" if fit else ""))
    for channel, w in weights.per_channel.items():
        row = channel.ljust(22) + "".join(f"{v:8.3f}" for v in w)
        scores = fit.get(channel, {}).get("scores") or {}
        if scores:
            final = scores.get("final")
            row += ("   " + " ".join(f"{s:.3f}" for s in scores["members"]) + f" | {scores['uniform']:.3f} | "
                    + (f"{final:.3f} ({fit[channel].get('chosen', 'uniform')})" if final is not None else "-"))
        lines.append(row)
    return "\n".join(lines)
