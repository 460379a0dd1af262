"""`cellseg import EM --voxel-size Z,Y,X --out ROOT`: a user's EM (and labels) as a CellMap-layout data root."""

from __future__ import annotations

import argparse

from cellseg.cli._args import class_volume

ORDER = 31  # right after fetch: the other way to get data

DESCRIPTION = """\
Turn your own FIB-SEM/SBEM volume (and, optionally, label volumes) into a data root in the CellMap layout,
so that train, predict, evaluate and report run on it unchanged:
  ROOT/<name>/<name>.zarr/recon-1/em/fibsem-uint8/s0, s1, ...     EM pyramid (uint8, OME-NGFF)
  ROOT/<name>/<name>.zarr/recon-1/labels/groundtruth/crop<N>/<class>/s0, ...
  ROOT/manifest.csv, train_crop_manifest.csv[, test_crop_manifest.csv], datasplit.csv, import.json
  ROOT/data.yaml, ROOT/train_<model>.yaml                          ready-to-train configs

Inputs (EM and labels alike): a folder of 2D TIFFs (natural order: s2 before s10), a multi-page or 3D
TIFF, a .npy, FILE.h5:/dataset (needs `pip install cellseg[hdf5]`) or a zarr array (DIR.zarr or
DIR.zarr:path/in/group). --axes gives the input's axis order; --voxel-size is always z,y,x in nm.

EM that is not uint8 is windowed explicitly: the --percentiles (or the --window values) map onto 1..255,
clipped outside; 0 is kept for "no data", which training ignores. The window is printed and recorded
in import.json. The pyramid halves the fine axes until the voxels are isotropic (5x5x40 nm: 10x10x40,
20x20x40, 40x40x40), then every axis.

Labels: per-class volumes (--label CLASS=VOLUME, binary masks or instance ids) and/or one integer volume
with a mapping (--labels VOLUME --class-map 1=mito,2=er or a YAML/JSON file); class names are CellMap
names (`cellseg info --classes`). Labels have the EM's shape, or their own grid (--labels-voxel-size,
--labels-offset). The labelled box is cut along --split-axis into training crops, a gap of --gap-nm (at
least one training patch: no validation voxel lies within a patch of a training voxel) and validation
crops at one end; datasplit.csv records the split and the train_*.yaml configs use it.

ROOT is built under a temporary name and renamed when complete. An existing ROOT is replaced only with
--overwrite and only if `cellseg import` wrote it."""

EPILOG = """\
examples:
  cellseg import sbem_tiffs/ --voxel-size 40,5,5 --out data/sbem --label mito=mito.tif --label er=er.tif
  cellseg import vol.h5:/raw --voxel-size 8,8,8 --out data/fib --labels seg.h5:/labels --class-map 1=mito,2=nuc
  cellseg import vol.npy --axes xyz --voxel-size 30,4,4 --out data/v --labels seg.npy --class-map classes.yaml
  cellseg import stack.tif --voxel-size 40,5,5 --out data/s --label mito=m.tif --test-box 0:50,0:2048,0:2048
  cellseg train data/sbem/train_unet_2d.yaml         # then: cellseg predict runs/sbem/unet_2d --crops val ..."""


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in text.replace(" ", "").split(",") if t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `import` sub-command."""
    parser = subparsers.add_parser("import", help="bring your own EM (and labels) into the CellMap layout",
                                   description=DESCRIPTION, epilog=EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("em", metavar="EM", help="the EM volume (formats above)")
    parser.add_argument("--voxel-size", required=True, type=_floats, metavar="Z,Y,X", help="EM voxel size in nm")
    parser.add_argument("--out", required=True, metavar="ROOT", help="the data root to create")
    parser.add_argument("--name", help="dataset name (default: the EM file's name)")
    parser.add_argument("--axes", default="zyx", metavar="ORDER", help="the inputs' axis order, e.g. xyz (default zyx; TIFF stacks: "
                                                      "file, row, column)")
    labels = parser.add_argument_group("labels")
    labels.add_argument("--label", dest="labels", action="append", type=class_volume, default=[], metavar="CLASS=VOLUME",
                        help="a per-class volume: binary mask or instance ids (repeatable)")
    labels.add_argument("--labels", dest="label_volume", metavar="VOLUME", help="one integer label volume")
    labels.add_argument("--class-map", metavar="V=CLASS,...|FILE",
                        help="what --labels values mean: 1=mito,2=er or a YAML/JSON file {1: mito, 2: er}")
    labels.add_argument("--labels-voxel-size", type=_floats, metavar="Z,Y,X", help="default: the EM's")
    labels.add_argument("--labels-offset", type=_floats, default=None, metavar="Z,Y,X",
                        help="nm from the EM's lower corner to the labels' (default 0,0,0; given, even as 0,0,0, "
                             "labels of a shape other than the EM's are taken as a sub-region there)")
    split = parser.add_argument_group("split")
    split.add_argument("--split-axis", default="z", choices=("z", "y", "x"), help="default z")
    split.add_argument("--val-fraction", type=float, default=0.15, metavar="F", help="share of the labelled box (default 0.15)")
    split.add_argument("--val-side", default="end", choices=("start", "end"),
                       help="which end of the axis validates (default end)")
    split.add_argument("--gap-nm", type=float, metavar="NM", help="gap between training and validation crops (default: 256 "
                                                    "in-plane EM voxels, one 2D training patch)")
    split.add_argument("--crop-nm", type=float, metavar="NM", help="crop thickness along the split axis (default 256 in-plane "
                                                     "EM voxels)")
    split.add_argument("--test-box", metavar="Z0:Z1,Y0:Y1,X0:X1",
                       help="EM voxels outside the labels to predict as a test crop (`--crops test`)")
    conversion = parser.add_argument_group("uint8 conversion (EM that is not uint8)")
    conversion.add_argument("--percentiles", type=_floats, default=(0.1, 99.9), metavar="LOW,HIGH",
                            help="window from these percentiles of a sample (default 0.1,99.9)")
    conversion.add_argument("--window", type=_floats, metavar="MIN,MAX", help="an explicit window instead")
    parser.add_argument("--experiments", nargs="+", metavar="YAML",
                        help="experiment configs to write ROOT/train_*.yaml for (default: the checkout's "
                             "configs/experiments/imported_*.yaml)")
    parser.add_argument("--overwrite", action="store_true", help="replace a ROOT that `cellseg import` wrote")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check, import, print the summary."""
    from cellseg.ingest.importer import ImportOptions, import_volume
    from cellseg.ingest.labels import parse_class_map

    opts = ImportOptions(
        em=args.em, out=args.out, voxel_size_nm=args.voxel_size, name=args.name, axes=args.axes,
        labels=tuple(args.labels), label_volume=args.label_volume,
        class_map=parse_class_map(args.class_map) if args.class_map else None,
        labels_voxel_size_nm=args.labels_voxel_size, labels_offset_nm=args.labels_offset,
        split_axis=args.split_axis, val_fraction=args.val_fraction, val_side=args.val_side, gap_nm=args.gap_nm,
        crop_nm=args.crop_nm, test_box=args.test_box, percentiles=args.percentiles, window=args.window,
        experiments=tuple(args.experiments) if args.experiments else None, overwrite=args.overwrite,
    )
    print(import_volume(opts, progress=not args.quiet).format())
    return 0
