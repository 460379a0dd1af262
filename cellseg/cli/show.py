"""`cellseg show FIGURE ...`: render one figure of `cellseg.viz` to a PNG.

    cellseg show crop DATA_ROOT 234 --classes mito,er --z 100 [--voxel-size 8] [--out x.png]
    cellseg show group DATA_ROOT 234 mito
    cellseg show prediction PRED.zarr 234 --truth DATA_ROOT [--classes mito,er]
    cellseg show scores EVAL.json [EVAL2.json ...]
    cellseg show curves RUN_DIR [RUN_DIR ...]
    cellseg show bench bench/results/train_step_h200.json [...]

Without `--out`, the PNG goes to the current directory under a name made from the inputs; an existing
file is replaced only with `--overwrite`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ORDER = 90
MIDDLE = object()  # `--z` given without a value (not a string: argparse would pass a string const to `type`)
log = logging.getLogger(__name__)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="PNG to write (default: a name made from the inputs, in the "
                                                 "current directory)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")


def _slice_options(parser: argparse.ArgumentParser, *, voxel_size: bool = True) -> None:
    where = parser.add_mutually_exclusive_group()
    for axis in ("z", "y", "x"):
        where.add_argument(f"--{axis}", type=int, nargs="?", const=MIDDLE, metavar="INDEX",
                           help=f"slice across {axis} at INDEX (voxels of the figure grid; without INDEX: the "
                                "middle slice)" + ("; default: the middle z slice" if axis == "z" else ""))
    if voxel_size:
        parser.add_argument("--voxel-size", metavar="NM",
                            help="figure grid voxel size in nm: one number or z,y,x (default: the crop's finest "
                                 "annotation); EM and labels are read from whichever level fits")
    parser.add_argument("--panel-px", type=int, default=None, metavar="PX",
                        help="longer side of each image panel in pixels")
    parser.add_argument("--seed", type=int, default=0, help="object colour seed (default 0)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `show` sub-command and its figures."""
    parser = subparsers.add_parser(
        "show", help="render a figure (slices with overlays, predictions, scores, curves, benchmarks) to PNG",
        description="Render one figure to a PNG (no display needed). Slices are drawn in physical units with "
                    "a scale bar; every class has a fixed colour (cellseg.viz.palette), objects get seeded "
                    "colours per id.",
    )
    figures = parser.add_subparsers(dest="figure", metavar="FIGURE", required=True)

    crop = figures.add_parser("crop", help="EM slice of a crop with class colours and object colours",
                              description="EM | classes | objects of one slice of a crop (training crop, or "
                                          "test crop with ground truth in DATA_ROOT/ground_truth.zarr).",
                              epilog="example: cellseg show crop /data 234 --classes mito,er --z 100 --voxel-size 8")
    crop.add_argument("root", metavar="DATA_ROOT", help="data root with manifests (cellseg synth / fetch)")
    crop.add_argument("crop", metavar="CROP", help="crop number (234 or crop234)")
    crop.add_argument("--classes", help="comma-separated classes (default: every class the crop annotates)")
    crop.add_argument("--no-instances", action="store_true", help="leave out the object panel")
    crop.add_argument("--outlines", action="store_true", help="draw class borders on the class panel")
    _slice_options(crop)
    _common(crop)
    crop.set_defaults(func=run, make=_crop)

    group = figures.add_parser("group", help="a group class against its atoms (mito vs mito_mem, mito_lum, ...)",
                               description="The group's mask, each annotated atom, and all atoms with the group's "
                                           "outline, on one slice of a crop.",
                               epilog="example: cellseg show group /data 234 mito --z")
    group.add_argument("root", metavar="DATA_ROOT", help="data root with manifests")
    group.add_argument("crop", metavar="CROP", help="crop number (234 or crop234)")
    group.add_argument("group", metavar="GROUP", help="a group class, e.g. mito, er, nuc, ves")
    _slice_options(group)
    _common(group)
    group.set_defaults(func=run, make=_group)

    pred = figures.add_parser("prediction", help="truth vs prediction: EM | truth | prediction | errors per class",
                              description="One row per class on one slice of a prediction or segmentation "
                                          "store's crop, on the store's grid: EM | truth | prediction | errors "
                                          "(false positives red, false negatives blue, unannotated grey). "
                                          "Without --truth only the prediction is drawn.",
                              epilog="example: cellseg show prediction pred.zarr 234 --truth /data --classes mito,er")
    pred.add_argument("store", metavar="SEG_OR_PRED", help="prediction/segmentation store (.zarr)")
    pred.add_argument("crop", metavar="CROP", help="crop number or name in the store")
    pred.add_argument("--truth", metavar="DATA_ROOT", help="data root holding the crop's EM and ground truth")
    pred.add_argument("--classes", help="comma-separated classes (default: those predicted in view, at most 8)")
    pred.add_argument("--threshold", type=float, default=0.5,
                      help="probability counted as foreground in the error panel (default 0.5)")
    _slice_options(pred, voxel_size=False)
    _common(pred)
    pred.set_defaults(func=run, make=_prediction)

    scores = figures.add_parser("scores", help="per-class score bars from evaluation JSON or a run's validation",
                                description="Per-class scores (instance: combined score, semantic: IoU), sorted, "
                                            "coloured by scoring kind, one panel per input; each panel names its "
                                            "metric era. Inputs: `cellseg evaluate --json` output, an official "
                                            "results.json, a metrics.jsonl or a run directory (last validation).",
                                epilog="example: cellseg show scores eval_2025.json eval_2026.json")
    scores.add_argument("inputs", nargs="+", metavar="EVAL", help="evaluation JSON, metrics.jsonl or run directory")
    scores.add_argument("--step", type=int, help="for runs: the validation at this step (default: the last)")
    _common(scores)
    scores.set_defaults(func=run, make=_scores)

    curves = figures.add_parser("curves", help="training curves of one or more runs",
                                description="Validation scores, loss, learning rate, samples/s, MFU and gradient "
                                            "norm over steps, from each run's metrics.jsonl.",
                                epilog="example: cellseg show curves runs/unet_3d runs/swin_3d")
    curves.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directory (or its metrics.jsonl)")
    curves.add_argument("--classes", help="comma-separated validation classes to label (single run)")
    _common(curves)
    curves.set_defaults(func=run, make=_curves)

    bench = figures.add_parser("bench", help="throughput / MFU bars from benchmark JSON",
                               description="Bars per architecture (train-step and model benchmarks: ms/step and "
                                           "MFU) or per worker count (loader benchmarks: patches/s and memory). "
                                           "Several files of one kind are merged.",
                               epilog="example: cellseg show bench bench/results/train_step_h200.json")
    bench.add_argument("inputs", nargs="+", metavar="JSON", help="benchmark result files")
    bench.add_argument("--metrics", help="comma-separated metrics, e.g. samples_per_s,mfu (default: ms/step and "
                                         "MFU; patches/s and memory for loaders)")
    _common(bench)
    bench.set_defaults(func=run, make=_bench)


def _split(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def _where(args: argparse.Namespace) -> tuple[str, int | None]:
    """(axis, index or None for the middle) from --z/--y/--x."""
    for axis in ("z", "y", "x"):
        value = getattr(args, axis)
        if value is MIDDLE:
            return axis, None
        if value is not None:
            if value < 0:
                raise ValueError(f"--{axis} {value}: slice indices start at 0")
            return axis, value
    return "z", None


def _panel(args: argparse.Namespace) -> dict[str, Any]:
    return {"panel_px": args.panel_px} if args.panel_px else {}


def _crop(args: argparse.Namespace) -> tuple[Any, str]:
    from cellseg import viz

    axis, index = _where(args)
    classes = _split(args.classes)
    s = viz.load_crop_slice(args.root, args.crop, classes=classes, axis=axis, index=index,
                            voxel_size_nm=args.voxel_size)
    fig = viz.crop_figure(s, instances=not args.no_instances, outlines=args.outlines, seed=args.seed, **_panel(args))
    named = f"_{'-'.join(s.classes)}" if classes and len(s.classes) <= 3 else ""
    return fig, f"{s.crop}_{s.plane.axis}{s.plane.index}{named}.png"


def _group(args: argparse.Namespace) -> tuple[Any, str]:
    from cellseg import viz

    axis, index = _where(args)
    s = viz.load_group_slice(args.root, args.crop, args.group, axis=axis, index=index, voxel_size_nm=args.voxel_size)
    return viz.group_figure(s, **_panel(args)), f"{s.crop}_{s.classes[0]}_atoms_{s.plane.axis}{s.plane.index}.png"


def _prediction(args: argparse.Namespace) -> tuple[Any, str]:
    from cellseg import viz

    axis, index = _where(args)
    p = viz.load_prediction_slice(args.store, args.crop, truth_root=args.truth, classes=_split(args.classes),
                                  axis=axis, index=index, threshold=args.threshold,
                                  progress=sys.stderr.isatty() and not args.quiet)
    stem = Path(args.store.rstrip("/")).name.removesuffix(".zarr")
    return viz.prediction_figure(p, seed=args.seed, **_panel(args)), f"{stem}_{p.crop}_{axis}{p.plane.index}.png"


def _stems(paths: list[str]) -> str:
    stems = [Path(p.rstrip("/")).stem for p in paths]
    return "_vs_".join(stems[:3]) + (f"_and_{len(stems) - 3}_more" if len(stems) > 3 else "")


def _scores(args: argparse.Namespace) -> tuple[Any, str]:
    from cellseg import viz

    sets = [viz.load_scores(path, step=args.step) for path in args.inputs]
    return viz.scores_figure(sets), f"scores_{_stems(args.inputs)}.png"


def _curves(args: argparse.Namespace) -> tuple[Any, str]:
    from cellseg import viz

    runs = [viz.load_run(path) for path in args.runs]
    return viz.curves_figure(runs, classes=_split(args.classes)), f"curves_{_stems([r.name for r in runs])}.png"


def _bench(args: argparse.Namespace) -> tuple[Any, str]:
    from cellseg import viz

    table = viz.load_bench(args.inputs)
    return viz.bench_figure(table, metrics=_split(args.metrics)), f"bench_{_stems(args.inputs)}.png"


def run(args: argparse.Namespace) -> int:
    """Build the figure, write the PNG, print where it went."""
    from cellseg.viz import figure_size_px, save_png

    if args.out is not None and args.out.exists() and not args.overwrite:
        raise ValueError(f"{args.out} exists; pass --overwrite to replace it")
    make: Callable[[argparse.Namespace], tuple[Any, str]] = args.make
    fig, default_name = make(args)
    out = args.out or Path(default_name)
    if out.exists() and not args.overwrite:
        raise ValueError(f"{out} exists; pass --overwrite to replace it (or choose --out)")
    save_png(fig, out, overwrite=args.overwrite)
    width, height = figure_size_px(fig)
    print(f"wrote {out} ({width}×{height} px)")
    return 0
