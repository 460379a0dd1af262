"""`cellseg ensemble PRED_A.zarr PRED_B.zarr ... --out ENS.zarr`: weighted mean of probability predictions."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cellseg.infer.ensemble import EnsembleResult

ORDER = 52


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `ensemble` sub-command."""
    parser = subparsers.add_parser(
        "ensemble", help="weighted mean of several probability predictions (uniform, given or fitted weights)",
        description="Average the per-class probabilities of several `cellseg predict` stores into one store. "
                    "Members may come from models at different voxel sizes: each crop is resampled to a common "
                    "grid (--grid). Only crops present in every member are written; the others are named in "
                    "the log. --weights auto fits per-class weights on validation crops against the challenge "
                    "metric (--metric), shrunk towards uniform (--shrink, more with fewer validation crops); "
                    "the weights are stored in the output's provenance and in ENS.zarr/weights.json, which "
                    "--weights accepts to apply the same weights to other predictions of the same members "
                    "(e.g. the test crops). The method is documented in cellseg/infer/ensemble_fit.py.",
        epilog="examples:\n"
               "  cellseg ensemble unet3d_val.zarr unet2d_val.zarr --out ens_val.zarr --weights auto --truth data/\n"
               "  cellseg ensemble unet3d_test.zarr unet2d_test.zarr --out ens_test.zarr "
               "--weights ens_val.zarr/weights.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("members", nargs="+", metavar="PRED.zarr", help="probability stores (at least 2), in order")
    parser.add_argument("--out", required=True, metavar="ENS.zarr", help="output probability store")
    parser.add_argument("--weights", default="uniform", metavar="auto|uniform|w1,w2,...|FILE.json",
                        help="'uniform' (default), 'auto' (fit per class on validation crops), one weight per "
                             "member (normalised), or a weights.json written by an earlier ensemble")
    parser.add_argument("--grid", default="finest", choices=("finest", "first"),
                        help="common grid per crop: the finest member's (default) or the first member's")
    parser.add_argument("--allow-partial", action="store_true",
                        help="members may have different classes: each class averages the members that have it")
    fit = parser.add_argument_group("fitting (--weights auto)")
    fit.add_argument("--truth", metavar="DATA_ROOT",
                     help="data root with the validation crops' labels (default: the members' provenance)")
    fit.add_argument("--crops", default="val", metavar="val|IDS",
                     help="crops to fit on: 'val' (default: the validation crops of every member's run) or "
                          "comma-separated ids, e.g. 12,34")
    fit.add_argument("--metric", default="2026", choices=("2025", "2026"),
                     help="scoring era of the fit (default 2026, the current metric)")
    fit.add_argument("--shrink", type=float, default=0.5, metavar="F",
                     help="shrinkage towards uniform with ample validation data, in [0, 1] (default 0.5); "
                          "fewer than 8 validation crops or 10^4 truth voxels of a class shrink it more")
    fit.add_argument("--instance-score", default="iou", choices=("iou", "metric"),
                     help="fit instance classes on their foreground IoU (default) or on the official instance "
                          "score of connected components (slower)")
    fit.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                     help="where candidate ensembles are mixed and counted (default: CUDA when available)")
    parser.add_argument("--uint8", action="store_true", help="store uint8-quantised probabilities (default float16)")
    parser.add_argument("--overwrite", action="store_true", help="replace ENS.zarr if it exists")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Ensemble, then print the channels, weights and (for auto) validation scores."""
    from cellseg.infer.ensemble import ensemble
    from cellseg.infer.ensemble_fit import FitOptions
    from cellseg.infer.weights import parse_weights

    if Path(args.out).exists() and not args.overwrite:  # before any work; main() reports ValueErrors in one line
        raise ValueError(f"{args.out} already exists; pass --overwrite to replace it")
    fit = FitOptions(metric=args.metric, shrink=args.shrink, instance_score=args.instance_score, device=args.device)
    crops = None if args.crops == "val" else [c for c in args.crops.split(",") if c.strip()]
    result = ensemble(args.members, args.out, weights=parse_weights(args.weights), grid=args.grid,
                      allow_partial=args.allow_partial, truth_root=args.truth, val_crops=crops, fit=fit,
                      uint8=args.uint8, overwrite=args.overwrite,
                      progress=sys.stderr.isatty() and not getattr(args, "quiet", False))
    print(format_summary(result, [str(m) for m in args.members]))
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
    lines.append(header + ("   scores: members | uniform | final" if fit else ""))
    for channel, w in weights.per_channel.items():
        row = channel.ljust(22) + "".join(f"{v:8.3f}" for v in w)
        scores = fit.get(channel, {}).get("scores") or {}
        if scores:
            final = scores.get("final")
            row += ("   " + " ".join(f"{s:.3f}" for s in scores["members"]) + f" | {scores['uniform']:.3f} | "
                    + (f"{final:.3f}" if final is not None else "-"))
        lines.append(row)
    return "\n".join(lines)
