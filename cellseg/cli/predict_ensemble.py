"""`cellseg predict-ensemble RUN_A RUN_B ... --crops test --out ENS.zarr`: several runs predicted in one pass,
straight into their weighted mean (no store per member)."""

from __future__ import annotations

import argparse
import sys

from cellseg.cli.predict import add_predict_options, predict_options

ORDER = 51


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `predict-ensemble` sub-command."""
    parser = subparsers.add_parser(
        "predict-ensemble", help="predict with several runs at once into their weighted mean (no member stores)",
        description="`cellseg predict` of every run followed by `cellseg ensemble`, in one pass: each crop column "
                    "streams through every member's sliding window in lockstep along z on the GPU, and the "
                    "weighted mean of the planes all members have finished is written; nothing per member is "
                    "stored. The result equals the two-step path when both cut the crop into the same columns. "
                    "Members must predict at one voxel size (otherwise use predict + ensemble, which resamples); "
                    "2D members slice across z. Weights: uniform, one per run, or the weights.json that "
                    "`cellseg ensemble --weights auto` fitted on validation predictions of the same runs (same "
                    "order). Crops already in ENS.zarr are skipped, a partly written one resumes, and under "
                    "`torchrun --nproc-per-node N` the crops are shared among the GPUs.",
        epilog="example:\n"
               "  cellseg ensemble val/*.zarr --out ens_val.zarr --weights auto\n"
               "  cellseg predict-ensemble runs/unet_3d runs/unet_2d --crops test --out ens_test.zarr "
               "--weights ens_val.zarr/weights.json --overlap 0.25",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="`cellseg train` run directories (≥ 2), "
                        "in the order of the weights")
    parser.add_argument("--out", required=True, metavar="ENS.zarr", help="ensemble probability store to write")
    parser.add_argument("--weights", default="uniform", metavar="uniform|w1,w2,...|FILE.json",
                        help="'uniform' (default), one weight per run (normalised), or a weights.json written by "
                             "`cellseg ensemble` (e.g. --weights auto on validation predictions)")
    parser.add_argument("--allow-partial", action="store_true",
                        help="runs may have different classes: each class averages the runs that have it")
    add_predict_options(parser, axes_2d=False)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Predict the ensemble; one summary line per crop is printed."""
    from cellseg.infer.fused import predict_ensemble

    opts = predict_options(args, progress=sys.stderr.isatty() and not args.quiet)
    predict_ensemble(args.run_dirs, args.crops, args.out, weights=args.weights, allow_partial=args.allow_partial,
                     opts=opts)
    return 0
