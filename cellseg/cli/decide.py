"""`cellseg decide [CONFIG.yaml] RUN_A RUN_B ... --out DECIDE_DIR [key=value ...]`: every decision of the measured
pipeline, made on the runs' tuning crops, into DECIDE_DIR/decisions.json."""

from __future__ import annotations

import argparse
import textwrap

from cellseg.cli._args import metric_choices, predict_jobs
from cellseg.cli._eras import LazyChoices
from cellseg.cli._recipe import PRECEDENCE, add_command, option, print_config, resolve, show_progress

ORDER = 53  # after predict (50), predict-ensemble (51), ensemble (52); before postprocess (55)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `decide` sub-command."""
    parser = add_command(
        subparsers, "decide", items="RUN_DIR", items_key="runs", many=True,
        items_help="`cellseg train` run directories (≥ 2, predicting the same classes)",
        help="make every decision of the measured pipeline on tuning crops → decisions.json",
        description=textwrap.dedent("""\
            Decide, class by class and on the runs' tuning crops only, what the measured pipeline is made of:
              1. the best single model   2. the uniform mean of every run   3. per-class fitted weights
              4. + TTA (8 transforms)    5. + post-processing (thresholds, seeds, sizes, watershed and hierarchy
              options tuned per class), each stage kept for a class only where it scores strictly higher than
              the stage before on the tuning crops, in decision mode (crops without the class do not reward
              predicting nothing; crops the era skips count at their worst). Stage 5 is chosen in each era of
              --metric on its own (the eras score objects differently).
            Writes DECIDE_DIR/decisions.json (docs/decisions.md): the members (run, architecture, checkpoint and its
            sha256, voxel size, classes), per class the weights, TTA on or off and the decoding per era, with the
            tuning score of each choice and of what it replaced, the tuning crops and eras. Apply it with
              cellseg predict-ensemble --decisions DECIDE_DIR/decisions.json --crops test --out ens.zarr
              cellseg postprocess ens.zarr --decisions DECIDE_DIR/decisions.json --out seg.zarr
              cellseg submit seg.zarr --out submission.zip
            Stores and scores go to DECIDE_DIR/stores and are reused when the command runs again with the same
            settings (a killed job resumes); --overwrite starts over. No crop without truth takes part: the
            test crops are never predicted here.

            """) + textwrap.fill(PRECEDENCE.replace("configs/infer/, configs/ensemble/, configs/postprocess/",
                                                    "configs/decide/"), width=104),
        epilog="examples:\n"
               "  cellseg decide runs/unet_3d runs/resnet_3d runs/unet_2d --out decide\n"
               "  cellseg decide configs/decide/default.yaml runs/* --out decide decide.tune_metric=2025",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    option(parser, "--out", key="out", metavar="DECIDE_DIR", help="working directory; decisions.json is written there")
    option(parser, "--data-root", key="data_root", metavar="ROOT",
           help="data root with the tuning crops (default: the runs' data.root)")
    option(parser, "--tune-crops", key="decide.tune_crops", metavar="val|IDS",
           help="crops every decision is made on: 'val' (default: the runs' tuning crops) or training crop ids")
    option(parser, "--metric", key="decide.metric", choices=LazyChoices(metric_choices), metavar="ERA",
           help="eras with a stage-5 choice of their own: all (default) or one era: %(choices)s")
    option(parser, "--tune-metric", key="decide.tune_metric", choices=LazyChoices(), metavar="ERA",
           help="era of every other decision: %(choices)s")
    option(parser, "--checkpoint", key="decide.checkpoint", metavar="best|last|PATH",
           help="checkpoint of each run (default best)")
    option(parser, "--overlap", key="decide.overlap", type=float, help="sliding-window overlap (default 0.5)")
    option(parser, "--device", key="decide.device", choices=("auto", "cpu", "cuda"),
           help="prediction, fitting and post-processing device (default auto: CUDA when available)")
    option(parser, "--workers", key="decide.workers", type=int, metavar="N",
           help="scoring and tuning processes (default: the CPU cores, at most 32)")
    option(parser, "--predict-jobs", key="decide.predict_jobs", type=predict_jobs, metavar="N|auto",
           help="processes predicting the members at once (default auto)")
    option(parser, "--reuse", key="decide.reuse", nargs="+", metavar="STORE",
           help="`cellseg predict` stores of the runs to read instead of predicting again (each where it holds "
                "every tuning crop from the same checkpoint and settings)")
    option(parser, "--overwrite", key="overwrite", action="store_true",
           help="start over: delete the stores and decisions of an earlier run in DECIDE_DIR")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Make the decisions and print what was decided per class."""
    from cellseg.config.jobs import DecideJob

    job = resolve(DecideJob, args)
    if args.print_config:
        return print_config(job)
    from cellseg.decide.options import DecideOptions
    from cellseg.decide.render import summary
    from cellseg.decide.run import run_decide

    d = job.decide
    opts = DecideOptions(runs=tuple(job.runs), out=job.out, data_root=job.data_root, tune_crops=str(d.tune_crops),
                         metric=d.metric, tune_metric=d.tune_metric, checkpoint=d.checkpoint, overlap=d.overlap,
                         device=d.device, workers=d.workers, predict_jobs=d.predict_jobs, reuse=tuple(d.reuse),
                         overwrite=job.overwrite, progress=show_progress(args))
    decisions = run_decide(opts)
    print(summary(decisions))
    print(f"\nwrote {decisions.source}")
    return 0
