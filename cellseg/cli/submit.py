"""`cellseg submit`: write the official submission zip from our prediction stores."""

from __future__ import annotations

import argparse
import sys

from cellseg.cli._eras import LazyChoices, add_era_alias
from cellseg.config.fields import DEFAULT_ERA

ORDER = 61


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `submit` sub-command."""
    parser = subparsers.add_parser(
        "submit",
        help="write a submission zip at each test crop's geometry",
        description="Read PREDICTIONS (a zarr store laid out crop<N>/<label>: OME-NGFF multiscale groups or "
                    "single-scale arrays with voxel_size/translation attributes, any voxel size), bring every "
                    "(crop, label) of the manifest onto that crop's grid (nearest for instance ids and binary masks; "
                    "area/linear then > --threshold for float probabilities) and write the official submission zip: "
                    "single-scale arrays with voxel_size, translation and shape attributes, binary uint8 for "
                    "semantic labels, uint16/uint32/uint64 ids for instance labels (never wrapped). A manifest "
                    "label that PREDICTIONS lacks is written as an empty (all-zero) array, which never scores below "
                    "a missing one (2026: a missing semantic label counts every voxel of the crop as a false "
                    "negative); --allow-missing leaves it out instead. The zip is written under a temporary name "
                    "and renamed when complete.",
    )
    parser.add_argument("predictions", help="prediction zarr store (crop<N>/<label>)")
    parser.add_argument("--manifest", help="test_crop_manifest.csv (default: the packaged official one of --metric)")
    parser.add_argument("--metric", choices=LazyChoices(), metavar="ERA", default=DEFAULT_ERA,
                        help="the scoring era whose test manifest is used without --manifest: "
                             f"%(choices)s (default {DEFAULT_ERA}; each era names its manifest)")
    add_era_alias(parser)
    parser.add_argument("--out", required=True, help="submission zip to write")
    parser.add_argument("--labels", nargs="+", metavar="LABEL", help="only these labels")
    parser.add_argument("--threshold", type=float, default=0.5,
                        help="threshold for float probabilities, in [0, 1): a voxel is foreground when p > threshold "
                             "(default 0.5)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--allow-missing", action="store_true",
                        help="leave labels the predictions lack out of the zip (each scores as missing) instead of "
                             "writing empty arrays")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="threads writing (crop, label) arrays, at most N arrays in memory at a time (default: "
                             "CPU cores, at most 8); the zip is the same for any N")
    parser.set_defaults(func=run)


def _listing(names: list[str], limit: int = 20) -> str:
    return ", ".join(names[:limit]) + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def run(args: argparse.Namespace) -> int:
    """Write the submission and say which labels were written empty or left out."""
    from cellseg.eval.submit import check_threshold, load_manifest, write_submission

    check_threshold(args.threshold)
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    if args.manifest:
        crops = load_manifest(args.manifest)
    else:
        from cellseg.data.crops import Catalog
        from cellseg.eval.eras import get_era

        crops = Catalog.official().test(get_era(args.metric).test_manifest)
    if args.labels:
        from cellseg.classes import get_class

        for label in args.labels:
            get_class(label)  # unknown names: a clear error with suggestions
    try:
        report = write_submission(args.predictions, crops, args.out, overwrite=args.overwrite,
                                  threshold=args.threshold, labels=args.labels,
                                  progress=sys.stderr.isatty() and not args.quiet, workers=args.workers,
                                  allow_missing=args.allow_missing)
    except FileExistsError as err:  # the dispatcher reports ValueErrors as one line
        raise ValueError(str(err)) from None
    print(f"wrote {args.out}: {len(report.written)} arrays from the predictions")
    if report.empty:
        print(f"wrote {len(report.empty)} empty arrays for labels the prediction lacks: {_listing(report.empty)}")
    empty = set(report.empty)
    left_out = [name for name in report.missing if name not in empty]
    if left_out:
        print(f"left out {len(left_out)} labels the prediction lacks, each scored as missing (2026: every voxel of "
              f"its crop a false negative; see validate-submission): {_listing(left_out)}")
    return 0
