"""`cellseg submit`: write the official submission zip from our prediction stores."""

from __future__ import annotations

import argparse
import sys

from cellseg.cli._eras import LazyChoices, add_era_alias
from cellseg.cli._manifest import add_manifest_args, test_crops
from cellseg.config.fields import DEFAULT_ERA

ORDER = 61
MIN_SHARE_TEXT = "10 %"  # cellseg.eval.submit.MIN_PREDICTED_SHARE, written out so that --help imports nothing


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
                    "negative); --allow-missing leaves it out instead. The manifest is --manifest (or the crops of "
                    "a --truth store), else the "
                    "test_crop_manifest.csv of the data root (--data-root, or the one PREDICTIONS records it was "
                    "predicted from), else the packaged official one. A submission of which fewer than "
                    f"{MIN_SHARE_TEXT} of the manifest's (crop, label) pairs come from PREDICTIONS is refused "
                    "(nothing is written): it would score almost nothing, as predictions of other crops than the "
                    "manifest's do; so is one whose every array, or every array of one crop, is all zeros after "
                    "thresholding (a failed model, a threshold above every probability, a crop predicted outside "
                    "its box); --allow-empty writes them with a warning. The zip records the manifest it was "
                    "written for, which validate-submission checks it against by default. The zip is written "
                    "under a temporary name and renamed when complete.",
    )
    parser.add_argument("predictions", help="prediction zarr store (crop<N>/<label>)")
    add_manifest_args(parser, default="the test manifest of the data root the predictions record, else the "
                                      "packaged official one of --metric")
    parser.add_argument("--metric", choices=LazyChoices(), metavar="ERA", default=None,
                        help="the scoring era the submission is for: its packaged official test manifest is used "
                             "when no other manifest is given, and a segmentation decoded as decided for another "
                             f"era (`postprocess --decisions --metric`) is refused: %(choices)s (default: the era "
                             f"the segmentation was decoded for, else {DEFAULT_ERA})")
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
    parser.add_argument("--allow-empty", action="store_true",
                        help=f"write the submission even when fewer than {MIN_SHARE_TEXT.replace('%', '%%')} of the "
                             "manifest's (crop, label) pairs come from the predictions, or when every array of a "
                             "crop or of the whole submission is all zeros (a warning names them)")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="threads writing (crop, label) arrays, at most N arrays in memory at a time (default: "
                             "CPU cores, at most 8); the zip is the same for any N")
    parser.set_defaults(func=run)


def _listing(names: list[str], limit: int = 20) -> str:
    return ", ".join(names[:limit]) + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def run(args: argparse.Namespace) -> int:
    """Write the submission and say which labels were written empty or left out."""
    from cellseg.eval.submit import (
        MIN_PREDICTED_SHARE,
        EmptySubmission,
        TooFewPredictions,
        check_threshold,
        recorded_data_root,
        write_submission,
    )

    check_threshold(args.threshold)
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    args.metric, decided = _decided_era(args.predictions, args.metric)
    crops, source = test_crops(args, recorded_root=recorded_data_root(args.predictions))
    print(f"manifest: {source}")
    if args.labels:
        from cellseg.classes import get_class

        for label in args.labels:
            get_class(label)  # unknown names: a clear error with suggestions
    try:
        report = write_submission(args.predictions, crops, args.out, overwrite=args.overwrite,
                                  threshold=args.threshold, labels=args.labels,
                                  progress=sys.stderr.isatty() and not args.quiet, workers=args.workers,
                                  allow_missing=args.allow_missing,
                                  min_share=0.0 if args.allow_empty else MIN_PREDICTED_SHARE,
                                  allow_empty=args.allow_empty, manifest_source=source, decided=decided)
    except EmptySubmission as err:
        raise ValueError(f"{err}. Nothing was written; check the threshold (--threshold {args.threshold}), the "
                         f"manifest ({source}) and the predictions; --allow-empty writes it anyway") from None
    except TooFewPredictions as err:
        raise ValueError(f"{err}. Check that the manifest ({source}) is the one of the crops you predicted (pass "
                         "--manifest or --data-root) and that the store holds them; --allow-empty writes it "
                         "anyway") from None
    except FileExistsError as err:  # the dispatcher reports ValueErrors as one line
        raise ValueError(str(err)) from None
    total = len(report.written) + len(report.missing)
    print(f"wrote {args.out}: {len(report.written)} arrays from the predictions ({report.predicted_share:.1%} of "
          f"{total} (crop, label) pairs)")
    if report.predicted_share < MIN_PREDICTED_SHARE:
        print(f"warning: only {len(report.written)} of {total} (crop, label) pairs come from the predictions "
              f"(--allow-empty): the submission is mostly empty arrays", file=sys.stderr)
    if report.zero:
        print(f"warning: {len(report.zero)} arrays from the predictions are all zeros: {_listing(report.zero)}",
              file=sys.stderr)
    if zero_classes := report.all_zero.classes:
        print(f"warning: {len(zero_classes)} classes are all zeros in every crop: {_listing(zero_classes)}",
              file=sys.stderr)
    if report.empty:
        print(f"wrote {len(report.empty)} empty arrays for labels the prediction lacks: {_listing(report.empty)}")
    empty = set(report.empty)
    left_out = [name for name in report.missing if name not in empty]
    if left_out:
        print(f"left out {len(left_out)} labels the prediction lacks, each scored as missing (2026: every voxel of "
              f"its crop a false negative; see validate-submission): {_listing(left_out)}")
    return 0


def _decided_era(predictions: str, metric: str | None) -> tuple[str, dict[str, str] | None]:
    """The era of the submission: `metric`, else the one the segmentation was decoded for as decided (its
    provenance's "decisions", `cellseg postprocess --decisions`), else `DEFAULT_ERA`; and that decision ({"era",
    "file"}) when there is one, which the zip records.

    Raises:
        ValueError: `metric` names another era than the one the segmentation was decided for.
    """
    from cellseg.data.prediction_store import PredictionStore

    try:
        decided = PredictionStore.open(predictions).provenance.get("decisions") or {}
    except (OSError, ValueError):  # not a store cellseg wrote: nothing was decided for it
        decided = {}
    era = decided.get("era")
    if era is None:
        return metric or DEFAULT_ERA, None
    if metric is not None and metric != era:
        raise ValueError(f"{predictions}: decoded as decided for the {era} metric ({decided.get('file')}), not for "
                         f"{metric}: run `cellseg postprocess --decisions ... --metric {metric}` for a {metric} "
                         "submission, or drop --metric")
    print(f"decoded as decided for the {era} metric ({decided.get('file')})")
    return era, {"era": str(era), "file": str(decided.get("file"))}
