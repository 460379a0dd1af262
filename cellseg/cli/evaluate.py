"""`cellseg evaluate`: score a submission exactly as the official evaluator of one era does."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from cellseg.cli._eras import LazyChoices

if TYPE_CHECKING:
    from pathlib import Path

ORDER = 60


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `evaluate` sub-command."""
    parser = subparsers.add_parser(
        "evaluate",
        help="score a submission against ground truth (a leaderboard metric era: 2025, 2026, ...)",
        description="Score SUBMISSION (a zarr directory or a .zip holding one, in the official submission format) "
                    "against TRUTH (a zarr directory in the evaluator's ground-truth layout: crop<N>/<label> "
                    "arrays with voxel_size, translation and shape attributes, optional crop<N>/<label>_mask). "
                    "Every label array of TRUTH is scored (the masks a `cellseg truth` store lists mask their "
                    "class only). --metric 2025 reproduces the challenge-era evaluator (volume-weighted "
                    "accuracy/Hausdorff, Hungarian matching); --metric 2026 the official code at 6b9ad68 (pooled "
                    "IoU and F1, capped Hausdorff); --metric 2026-07 the leaderboard's rules since July 2026, "
                    "reconstructed from the descriptions of the official changes (unmatched instances score 0, "
                    "distances floored at 0.1). The 2025 and 2026 numbers equal the official ones, quirks included "
                    "(docs/scoring.md); where the official evaluator would crash, cellseg scores and says so. "
                    "(crop, label) pairs the era leaves out (2026: a crop over the object-count cutoff) are "
                    "counted and listed, never printed as scores.",
    )
    parser.add_argument("submission", help="submission zarr directory or .zip")
    parser.add_argument("truth", help="ground-truth zarr directory (crop<N>/<label> arrays)")
    parser.add_argument("--metric", required=True, choices=LazyChoices(), metavar="ERA",
                        help="scoring era: %(choices)s")
    parser.add_argument("--json", metavar="OUT",
                        help="write the full results (official key names) to this file. A file that `cellseg "
                             "evaluate` wrote for the same submission, truth and metric is replaced (running the "
                             "same command again refreshes it); any other existing file needs --overwrite")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --json file of any content")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="processes scoring (crop, label) pairs in parallel (default 1)")
    parser.add_argument("--memory-gb", type=float, default=None,
                        help="memory budget for scoring (default 80%% of the memory available); arrays whose "
                             "declared shape needs more are refused and scored as missing")
    parser.add_argument("--max-zip-gb", type=float, default=50.0,
                        help="refuse zips that decompress to more than this (default 50, as the official evaluator)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Evaluate, print the table (per crop with -v) and optionally write JSON."""
    from cellseg.eval.report import format_table, write_json
    from cellseg.eval.safezip import ZipLimits
    from cellseg.eval.score import evaluate

    _check_args(args)
    budget = int(args.memory_gb * 2**30) if args.memory_gb else None
    evaluation = evaluate(args.submission, args.truth, metric=args.metric, workers=args.workers,
                          memory_budget_bytes=budget, zip_limits=ZipLimits(max_total_bytes=int(args.max_zip_gb * 2**30)),
                          progress=sys.stderr.isatty() and not args.quiet)
    print(format_table(evaluation, per_crop=args.verbose > 0))
    decided = decided_era(args.submission)
    if decided is not None and decided["era"] != args.metric:
        print(f"\nnote: this submission was decoded as decided for the {decided['era']} metric ({decided.get('file')}); "
              f"it is scored here under {args.metric}")
    if args.json:
        write_json(evaluation, args.json, inputs=_inputs(args))
        print(f"\nwrote {args.json} ({evaluation.metric} metric)")
    return 0


def decided_era(submission: str) -> dict[str, str] | None:
    """The era a cellseg submission's segmentation was decoded for, as decided (`cellseg submit` records it with
    `DECIDED_ATTR`), with the decisions file; None for any other submission."""
    from cellseg.eval.io import open_source
    from cellseg.eval.submit import DECIDED_ATTR

    try:
        attrs = open_source(submission).read_json(".zattrs") or {}
    except ValueError:  # unreadable: the scoring reported it
        return None
    decided = attrs.get(DECIDED_ATTR) if isinstance(attrs, dict) else None
    return decided if isinstance(decided, dict) and isinstance(decided.get("era"), str) else None


def _check_args(args: argparse.Namespace) -> None:
    """Refuse out-of-range numbers and an existing --json file before any scoring."""
    from pathlib import Path

    if args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    if args.memory_gb is not None and not args.memory_gb > 0:
        raise ValueError(f"--memory-gb must be a positive number of GiB, got {args.memory_gb}")
    if not args.max_zip_gb > 0:
        raise ValueError(f"--max-zip-gb must be a positive number of GiB, got {args.max_zip_gb}")
    if args.json and Path(args.json).exists() and not args.overwrite and not _same_evaluation(Path(args.json), args):
        raise FileExistsError(f"--json {args.json} already exists and is not this evaluation's score file (of "
                              "the same submission, truth and metric); pass --overwrite to replace it")


def _inputs(args: argparse.Namespace) -> dict[str, str]:
    """What an evaluation scored, as its --json file records it (absolute paths)."""
    from pathlib import Path

    return {"submission": str(Path(args.submission).resolve()), "truth": str(Path(args.truth).resolve()),
            "metric": str(args.metric)}


def _same_evaluation(path: Path, args: argparse.Namespace) -> bool:
    """True when `path` is a score file `cellseg evaluate` wrote for the same submission, truth and metric."""
    import json

    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("inputs") == _inputs(args)
