"""`cellseg truth ROOT --out TRUTH`: the evaluator-layout ground truth of a data root's held-out crops."""

from __future__ import annotations

import argparse
import sys

from cellseg.cli._args import class_volume

ORDER = 59  # before evaluate (60), which reads what it writes

DESCRIPTION = """\
Write the ground truth of crops of the data ROOT in the layout `cellseg evaluate SUBMISSION TRUTH` reads
(TRUTH/crop<N>/<label>: single-scale arrays with voxel_size, translation and shape attributes, the layout of
a synthetic root's ground_truth.zarr), so that a submission of your own held-out crops can be scored:
  --crops val (default)   the validation crops of ROOT/datasplit.csv (or --datasplit, e.g. a run's)
  --crops test            the test crops of ROOT/test_crop_manifest.csv (a `cellseg import --test-box` box),
                          labelled by --label CLASS=VOLUME (the crop's shape, or the EM's shape at s0)
  --crops 12,15           these training or test crops
Each class listed for a crop is read as cellseg's own scorers read it: object ids for the classes scored as
instances, a 0/1 mask for the others. A class the crop does not annotate is left out (as in the official
layout). A class annotated in only part of the crop (voxels at its "unknown" value) is refused, naming it, unless
--unannotated says what to do: "mask" writes <label>_mask beside it (1 where annotated), so that nothing outside
the annotation counts (cellseg evaluate masks with it and does not score it as a class; the official evaluator
would score it as a class too), "background" writes the unannotated voxels as background (a correct prediction
there then counts as a false positive). Then predict the same crops, `cellseg submit PRED --truth TRUTH` (or
--data-root ROOT for its test crops) and evaluate."""

EPILOG = """\
examples:
  cellseg truth data/sbem --out data/sbem/val_truth.zarr
  cellseg predict runs/sbem/unet_2d --crops val --out val.zarr && cellseg postprocess val.zarr --out seg.zarr
  cellseg submit seg.zarr --truth data/sbem/val_truth.zarr --out val.zip
  cellseg evaluate val.zip data/sbem/val_truth.zarr --metric 2026
  cellseg truth data/sbem --crops test --label mito=test_mito.tif --out test_truth.zarr"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `truth` sub-command."""
    parser = subparsers.add_parser("truth", help="write the evaluator-layout truth of a data root's held-out crops",
                                   description=DESCRIPTION, epilog=EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", metavar="ROOT", help="the data root (cellseg synth, fetch or import)")
    parser.add_argument("--out", required=True, metavar="TRUTH", help="the truth store to write (a zarr directory)")
    parser.add_argument("--crops", default="val", metavar="val|test|IDS",
                        help="val (default), test, or comma-separated crop ids")
    parser.add_argument("--classes", metavar="A,B", help="only these classes (default: every class listed)")
    parser.add_argument("--datasplit", metavar="CSV", help="the split naming the validation crops (default: "
                                                           "ROOT/datasplit.csv)")
    parser.add_argument("--label", dest="labels", action="append", type=class_volume, default=[], metavar="CLASS=VOLUME",
                        help="a test crop's labels: binary mask or instance ids (repeatable; formats of "
                             "`cellseg import`)")
    parser.add_argument("--axes", default="zyx", metavar="ORDER", help="the label volumes' axis order (default zyx)")
    parser.add_argument("--unannotated", choices=("refuse", "mask", "background"), default="refuse",
                        help="a class annotated in part of its crop: refuse (default, naming it), mask (write "
                             "<label>_mask: nothing outside the annotation counts) or background (a prediction "
                             "there counts as a false positive)")
    parser.add_argument("--overwrite", action="store_true", help="replace a truth store `cellseg truth` wrote")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the truth store and print what it holds."""
    from pathlib import Path

    from tqdm import tqdm

    from cellseg.classes import get_class
    from cellseg.eval.truth_store import build_truth, select_crops

    classes = [c.strip() for c in args.classes.split(",") if c.strip()] if args.classes else None
    for name in [*(classes or []), *(label for label, _ in args.labels)]:
        get_class(name)  # unknown names: a clear error with suggestions
    total = len(select_crops(Path(args.root), args.crops, args.datasplit)[0])  # the bar's length: crops
    with tqdm(total=total, desc="truth", unit="crop", disable=args.quiet or not sys.stderr.isatty(),
              leave=False) as bar:
        report = build_truth(args.root, args.out, crops=args.crops, classes=classes, volumes=dict(args.labels),
                             datasplit=args.datasplit, axes=args.axes, overwrite=args.overwrite, progress=bar.update,
                             unannotated=args.unannotated)
    print(report.format())
    return 0
