"""Figures: EM slices with class and object overlays, truth vs prediction, score bars, curves, benchmarks.

Every `*_figure` function returns a `matplotlib.figure.Figure`; `save_png` writes it atomically. Figures
are built without `pyplot` on the Agg canvas: importing this package selects no backend and changes no
global matplotlib state, and no display is needed. In a notebook, a figure left as a cell's value
shows itself as a PNG (no `%matplotlib inline` needed).

    load_crop_slice → crop_figure           EM | class colours | object colours (+ legend)
    load_group_slice → group_figure         a group class vs its atoms (`mito` vs `mito_mem`, ...)
    load_prediction_slice → prediction_figure   EM | truth | prediction | errors, one row per class
    load_scores → scores_figure             per-class score bars, either metric era
    load_run → curves_figure                loss, validation, lr, samples/s, MFU over steps
    load_bench → bench_figure               ms/step (or patches/s) and MFU per architecture

Example:
    >>> from cellseg import viz
    >>> fig = viz.crop_figure(viz.load_crop_slice("/tmp/synth", 1, classes=["mito", "er"], axis="z"))
    >>> viz.save_png(fig, "crop1.png")
"""

from cellseg.viz.bench import BenchTable, bench_figure, load_bench
from cellseg.viz.curves import RunCurves, curves_figure, load_run
from cellseg.viz.figure import figure_size_px, save_png
from cellseg.viz.palette import CLASS_COLORS, class_color, instance_colors
from cellseg.viz.panels import crop_figure, group_figure, prediction_figure
from cellseg.viz.scores import ScoreSet, load_scores, scores_figure
from cellseg.viz.slices import (
    CropSlice,
    PredictionSlice,
    load_crop_slice,
    load_group_slice,
    load_prediction_slice,
)
from cellseg.viz.sources import CropView, open_crop

__all__ = [
    "CLASS_COLORS",
    "BenchTable",
    "CropSlice",
    "CropView",
    "PredictionSlice",
    "RunCurves",
    "ScoreSet",
    "bench_figure",
    "class_color",
    "crop_figure",
    "curves_figure",
    "figure_size_px",
    "group_figure",
    "instance_colors",
    "load_bench",
    "load_crop_slice",
    "load_group_slice",
    "load_prediction_slice",
    "load_run",
    "load_scores",
    "open_crop",
    "prediction_figure",
    "save_png",
    "scores_figure",
]
