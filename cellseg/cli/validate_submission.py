"""`cellseg validate-submission`: list every problem the evaluators would meet, without scoring."""

from __future__ import annotations

import argparse

from cellseg.cli._eras import LazyChoices, add_era_alias
from cellseg.cli._manifest import add_manifest_args, test_crops
from cellseg.config.fields import DEFAULT_ERA

ORDER = 62


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `validate-submission` sub-command."""
    parser = subparsers.add_parser(
        "validate-submission",
        help="check a submission as the evaluators will read it",
        description="Read FILE (a submission .zip or zarr directory) the way the official evaluators do and list "
                    "every problem, without scoring: unsafe zip members, folder layout, missing crops and labels "
                    "with what each costs in both eras (2025: its share of the class's volume weight; 2026: the "
                    "crop's voxels as false negatives of a semantic class, every true object missed for an instance "
                    "class), including labels written as multiscale groups (never read), unknown labels, "
                    "dtype and attribute problems, where each array lands after resampling and snapping, the 2025 "
                    "copy-length bug, NaNs, the number of instances and the share of arrays that are all zeros (a "
                    "warning when almost nothing is predicted; an error when every array of a crop, or of the whole "
                    "submission, is all zeros, unless --allow-empty; a warning naming the classes all zeros in "
                    "every crop). Each issue names the era(s) it affects. The crops checked against are those of "
                    "--manifest, --truth or --data-root, else the manifest the submission records `cellseg submit` "
                    "wrote it for, else the packaged official one (printed first). "
                    "Exit status 1 when there is an error (a missing crop or label is one unless --allow-missing).",
    )
    parser.add_argument("file", help="submission .zip or zarr directory")
    add_manifest_args(parser, default="the manifest the submission records `cellseg submit` wrote it for, else "
                                      "the packaged official one of --metric")
    parser.add_argument("--metric", choices=LazyChoices(), metavar="ERA", default=DEFAULT_ERA,
                        help="the scoring era whose packaged test manifest is used when no other is found: "
                             f"%(choices)s (default {DEFAULT_ERA}; each era names its manifest)")
    add_era_alias(parser)
    parser.add_argument("--no-data", action="store_true", help="skip the checks that read array values")
    parser.add_argument("--all", action="store_true", help="also print info lines")
    parser.add_argument("--allow-missing", action="store_true",
                        help="report missing crops and labels (with their cost) as warnings, not errors")
    parser.add_argument("--allow-empty", action="store_true",
                        help="report a crop, or a submission, whose every array is all zeros as a warning, not an "
                             "error")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="threads reading arrays, at most N arrays in memory at a time (default: CPU cores, at "
                             "most 8); the issues are the same for any N")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the issues; exit 1 if any is an error."""
    from cellseg.eval.io import open_source
    from cellseg.eval.validate import EMPTY_SHARE, validate_submission

    crops, source = test_crops(args, submission=args.file)
    print(f"manifest: {source}")
    truth = open_source(args.truth) if args.truth else None
    issues = validate_submission(args.file, crops, read_data=not args.no_data, truth=truth,
                                 workers=args.workers, allow_missing=args.allow_missing,
                                 allow_empty=args.allow_empty)
    shown = [i for i in issues if args.all or i.severity != "info" or i.message.startswith(EMPTY_SHARE)]
    for issue in shown:
        print(issue)
    errors = sum(i.severity == "error" for i in issues)
    warnings = sum(i.severity == "warning" for i in issues)
    print(f"{args.file}: {errors} error(s), {warnings} warning(s) for {len(crops)} crops")
    return 1 if errors else 0
