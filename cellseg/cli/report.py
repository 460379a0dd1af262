"""`cellseg report --runs RUN_A RUN_B ... --out REPORT_DIR`: the ablation table of the inference stages."""

from __future__ import annotations

import argparse
import sys
import textwrap

from cellseg.cli._args import metric_choices, predict_jobs
from cellseg.cli._eras import LazyChoices
from cellseg.config.fields import DEFAULT_ERA

ORDER = 63  # after evaluate (60), submit (61), validate-submission (62)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` sub-command."""
    parser = subparsers.add_parser(
        "report",
        help="ablation table: single model → ensembles → TTA → post-processing, every metric era",
        description=textwrap.dedent("""\
            Measure what each inference stage adds, on crops with truth, in every metric era, overall and per
            class:
              1. best single model (each run alone, no TTA)   2. uniform ensemble   3. weighted ensemble
              (per-class weights fitted on the tuning crops)   4. + TTA (8 transforms, stage 3's weights; runs of
              weight 0 for every class are not predicted)
              5. + post-processing (parameters tuned on the tuning crops).
            Stages 1-4 are scored as the official evaluator reads a binary prediction (probability > 0.5,
            instance classes as 26-connected components), stage 5 with the post-processed masks and ids; each
            is written as a submission at the truth's geometry and scored with `cellseg evaluate`'s code.
            Stages 2-5 are switched off for each class they do not improve on the tuning crops (that class
            keeps the previous stage's prediction; stage 2's is the best single model's); the report
            names those classes. Stage 5's switch is made in each era scored, for that era's column and
            submission (stores/submissions/postprocess_<era>.zip where it differs).

            Writes REPORT_DIR/report.md (tables), report.json (everything) and PNGs (overall and per-class
            bars, slice overlays), and prints the ablation table. Intermediate stores go to REPORT_DIR/stores
            and are reused when the report is run again with the same settings (an interrupted report
            resumes); --overwrite starts over. Validation crops have a role (the runs' validation_roles.csv):
            by default every decision (best single model, weights, post-processing) is made on the *tuning*
            crops and `--crops val` scores the *report* crops, which no decision touches; every number comes
            with a crop-bootstrap interval. `--tune-crops same` tunes on the scored crops (optimistically
            biased; the report says so). The decisions are written to REPORT_DIR/decisions.json, what
            `predict-ensemble --decisions` and `postprocess --decisions` apply; `--decisions FILE` scores a
            file made before (by `cellseg decide` or another report) instead of deciding: the stages are
            what it says, predicted on the scored crops alone."""),
        epilog="examples:\n"
               "  cellseg report --runs runs/unet_3d runs/resnet_3d --out reports/val\n"
               "  cellseg report --runs runs/unet_3d runs/unet_2d --out reports/test --crops test --tune-crops val",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", nargs="+", required=True, metavar="RUN_DIR",
                        help="`cellseg train` run directories (at least 2, predicting the same classes)")
    parser.add_argument("--out", required=True, metavar="REPORT_DIR", help="report directory")
    parser.add_argument("--data-root", metavar="ROOT",
                        help="data root with the crops and their truth (default: the runs' data.root)")
    parser.add_argument("--crops", default="val", metavar="val|test|IDS",
                        help="crops to score: 'val' (default: the runs' report crops, the validation crops no "
                             "decision touches), 'test' (a synthetic root's test crops, truth in "
                             "ROOT/ground_truth.zarr) or ids, e.g. 12,34")
    parser.add_argument("--tune-crops", metavar="same|val|IDS",
                        help="training crops the best single model, the ensemble weights and the post-processing "
                             "are chosen on (default: the runs' tuning crops; 'same': the scored crops, biased)")
    parser.add_argument("--metric", default="all", choices=LazyChoices(metric_choices), metavar="ERA",
                        help="scoring eras: all (default: every registered era; both: the same) or one era: "
                             "%(choices)s")
    parser.add_argument("--tune-metric", choices=LazyChoices(), metavar="ERA",
                        help=f"era the weights and parameters are tuned for: %(choices)s (default {DEFAULT_ERA}, "
                             "or the one --metric era)")
    parser.add_argument("--checkpoint", default="best", metavar="best|last|PATH",
                        help="checkpoint of each run (default best)")
    parser.add_argument("--overlap", type=float, default=0.5, help="sliding-window overlap of predict (default 0.5)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="prediction, fitting and post-processing device (default: CUDA when available)")
    parser.add_argument("--slices", type=int, default=2, metavar="N",
                        help="scored crops drawn as slice overlays (default 2)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="processes scoring (crop, label) pairs and tuning the instance classes' post-processing in "
                             "parallel (default: the CPU cores this process may use, at most 32)")
    parser.add_argument("--predict-jobs", type=predict_jobs, default="auto", metavar="N|auto",
                        help="processes predicting the members (runs) at once, each into its own store (1: one "
                             "after the other in the report's process; default auto: on CUDA min(runs, 4 per GPU, GPU "
                             "memory GiB // 16 per GPU, with TTA // 32), spread over the GPUs; on CPU 1; a member "
                             "out of GPU memory is predicted again alone on a GPU)")
    parser.add_argument("--reuse", nargs="+", default=[], metavar="STORE",
                        help="prediction stores of the runs written by `cellseg predict` (no TTA or --tta 8, e.g. "
                             "those of a submission) to use instead of predicting again, each where it holds every "
                             "crop the report needs from the same checkpoint, overlap, channels and data root (the "
                             "log names what keeps a store out; the stores are never changed)")
    parser.add_argument("--decisions", metavar="DECISIONS.json",
                        help="score these decisions (`cellseg decide`) instead of making them: its runs must be --runs, "
                             "its tuning crops are named as such, nothing is predicted on them")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over: delete the stores and results of an earlier report in REPORT_DIR")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the report and print its ablation table."""
    from cellseg.report import ReportOptions, run_report
    from cellseg.report.render import console

    opts = ReportOptions(runs=tuple(args.runs), out=args.out, data_root=args.data_root, crops=args.crops,
                         tune_crops=args.tune_crops, metric=args.metric, tune_metric=args.tune_metric,
                         checkpoint=args.checkpoint, overlap=args.overlap, device=args.device, slices=args.slices,
                         workers=args.workers, predict_jobs=args.predict_jobs, reuse=tuple(args.reuse),
                         overwrite=args.overwrite, progress=sys.stderr.isatty() and not args.quiet,
                         decisions=args.decisions)
    report = run_report(opts)
    print(console(report))
    print(f"\nwrote {args.out}/report.md, report.json and {len(report.figures)} figures")
    return 0
