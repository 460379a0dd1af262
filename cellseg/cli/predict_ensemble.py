"""`cellseg predict-ensemble [CONFIG.yaml] RUN_A RUN_B ... --crops test --out ENS.zarr [key=value ...]`: several
runs predicted in one pass, straight into their weighted mean (no store per member); with `ensemble.routes` in
CONFIG, each crop by the runs of its voxel-size band."""

from __future__ import annotations

import argparse

from cellseg.cli._recipe import (
    PRECEDENCE,
    add_command,
    option,
    print_config,
    resolve,
    show_progress,
    weights_flag,
)
from cellseg.cli.predict import add_predict_options

ORDER = 51


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `predict-ensemble` sub-command."""
    parser = add_command(
        subparsers, "predict-ensemble", items="RUN_DIR", items_key="ensemble.members", many=True,
        items_help="`cellseg train` run directories (≥ 2, in the order of the weights), or one ensemble package of "
                   "`cellseg export` (its decisions applied)",
        help="predict with several runs at once into their weighted mean (no member stores)",
        description="`cellseg predict` of every run followed by `cellseg ensemble`, in one pass: each crop column "
                    "streams through every member's sliding window in lockstep along z on the GPU, and the "
                    "weighted mean of the planes all members have finished is written; nothing per member is "
                    "stored. The result equals the two-step path when both cut the crop into the same columns. "
                    "Members must predict at one voxel size (otherwise use predict + ensemble, which resamples); "
                    "2D members slice across z. Weights: uniform, one per run, or the weights.json that "
                    "`cellseg ensemble --weights auto` fitted on validation predictions of the same runs (same "
                    "order). Crops already in ENS.zarr are skipped, a partly written one resumes, and under "
                    "`torchrun --nproc-per-node N` the crops are shared among the GPUs.\n\n"
                    "Routed: a CONFIG with `ensemble.routes` (voxel-size bands, each with its runs and weights, "
                    "e.g. configs/ensemble/routed.yaml) predicts each crop once, with the runs of the band of its "
                    "scale (the largest voxel edge of its finest annotation), at their voxel size, all crops into "
                    "one store; a band may have one run. No RUN_DIR arguments then.\n\n"
                    "Decided: --decisions DECIDE_DIR/decisions.json (written by `cellseg decide` on the runs' tuning "
                    "crops) predicts every class as decided there: its weights (the best single model, the uniform "
                    "mean or fitted weights) and TTA on or off; the classes with TTA and those without are "
                    "predicted in one pass each (OUT.zarr.parts/ until OUT.zarr is complete) by the members that "
                    "carry weight for them. The RUN_DIR arguments may be left out (the file names them); each "
                    "member's checkpoint, classes and voxel size are checked against the file before anything is "
                    "predicted. Then `cellseg postprocess OUT.zarr --decisions ...`.\n\n" + PRECEDENCE,
        epilog="example:\n"
               "  cellseg ensemble val/*.zarr --out ens_val.zarr --weights auto\n"
               "  cellseg predict-ensemble runs/unet_3d runs/unet_2d --crops test --out ens_test.zarr "
               "--weights ens_val.zarr/weights.json --overlap 0.25\n"
               "  cellseg predict-ensemble configs/ensemble/eight.yaml crops=test out=ens_test.zarr\n"
               "  cellseg predict-ensemble configs/ensemble/routed.yaml --crops test --out ens_test.zarr\n"
               "  cellseg predict-ensemble --decisions decide/decisions.json --crops test --out ens_test.zarr",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    option(parser, "--out", key="out", metavar="ENS.zarr", help="ensemble probability store to write")
    option(parser, "--weights", key="ensemble.weights", type=weights_flag, metavar="uniform|w1,w2,...|FILE.json",
           help="'uniform' (default), one weight per run (normalised), or a weights.json written by `cellseg "
                "ensemble` (e.g. --weights auto on validation predictions)")
    option(parser, "--decisions", key="ensemble.decisions", metavar="DECISIONS.json",
           help="per-class weights and TTA from `cellseg decide` (instead of --weights and --tta)")
    option(parser, "--allow-partial", key="ensemble.allow_partial", action="store_true",
           help="runs may have different classes: each class averages the runs that have it")
    add_predict_options(parser, axes_2d=False)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Predict the ensemble (routed by voxel size when the config has `ensemble.routes`); one summary line per
    crop is printed."""
    from cellseg.config.jobs import PredictEnsembleJob
    from cellseg.config.schema import replace

    job = resolve(PredictEnsembleJob, args)
    if args.print_config:
        return print_config(job)
    opts = replace(job.infer, progress=show_progress(args, job.infer.progress))
    if args.dry_run:
        from cellseg.infer.dry_run import dry_run

        if job.ensemble.routes:
            raise ValueError("--dry-run plans one voxel size: for a routed ensemble (ensemble.routes), dry-run "
                             "each band's runs with their crops")
        if job.ensemble.decisions:
            from cellseg.decide.document import Decisions

            members = [m.run_dir for m in Decisions.load(job.ensemble.decisions).members]
        else:
            members = list(job.ensemble.members)
        print(dry_run(members, str(job.crops), job.out, opts))
        return 0
    if job.ensemble.decisions:
        from cellseg.decide.apply import predict_decided
        from cellseg.decide.document import Decisions

        decisions = Decisions.load(job.ensemble.decisions)
        decisions.check_runs(job.ensemble.members, checkpoint=opts.checkpoint)  # before any model is loaded
        store = predict_decided(decisions, str(job.crops), job.out, opts)
        print(f"wrote {store.path}: {len(store.completed())} crops, as decided in {decisions.source}")
        return 0
    if job.ensemble.routes:
        from cellseg.infer.routing import predict_routed

        predict_routed(job.ensemble.routes, str(job.crops), job.out, allow_partial=job.ensemble.allow_partial,
                       opts=opts)
        return 0
    from cellseg.infer.fused import predict_ensemble

    predict_ensemble(list(job.ensemble.members), str(job.crops), job.out, weights=job.ensemble.library_weights(),
                     allow_partial=job.ensemble.allow_partial, opts=opts)
    return 0
