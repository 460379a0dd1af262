"""The report's PNGs, drawn with `cellseg.viz`:

- `overall.png`: overall, instance and semantic score of every stage, one panel per era;
- `classes_<era>.png`: per-class score bars, one panel per stage (`viz.scores_figure`);
- `overlay_<crop>_<stage>.png`: EM | truth | prediction | errors for the classes in view, before
  post-processing (stage 4 thresholded, objects = connected components) and after (stage 5's
  instances), for the first `--slices` scored crops (`viz.prediction_figure`).

Existing PNGs of the report are replaced.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from cellseg.decide.options import Layout, StageResult
from cellseg.eval.eras import ERA_TITLES
from cellseg.report.results import Report
from cellseg.viz import load_prediction_slice, prediction_figure, save_png, scores_figure
from cellseg.viz.figure import new_figure
from cellseg.viz.palette import KIND_COLORS
from cellseg.viz.scores import ScoreSet

PANEL_WIDTH_PX = 520
ROW_PX = 46  # height per stage in the overall chart
MARGIN_PX = 130  # titles, axis label and legend
OVERALL_COLOR = "#4d4d4d"
BAR_HEIGHT = 0.26  # three bars per stage fill 0.78 of a row


def score_set(stage: StageResult, era: str) -> ScoreSet:
    """A stage's scores in one era, as `viz.scores_figure` draws them."""
    s = stage.scores[era]
    return ScoreSet(era=era, source=stage.title, scores=dict(s.classes), overall=s.overall,
                    overall_instance=s.instance, overall_semantic=s.semantic)


def overall_figure(stages: Sequence[StageResult], eras: Sequence[str]) -> Figure:
    """Grouped horizontal bars: overall / instance / semantic score per stage, one panel per era."""
    fig = new_figure(PANEL_WIDTH_PX * len(eras), ROW_PX * len(stages) + MARGIN_PX)
    axes = fig.subplots(1, len(eras), sharey=True, squeeze=False)[0]
    positions = np.arange(len(stages))
    parts = (("overall", OVERALL_COLOR), ("instance", KIND_COLORS["instance"]),
             ("semantic", KIND_COLORS["semantic"]))
    for ax, era in zip(axes, eras, strict=True):
        for k, (part, colour) in enumerate(parts):
            values = [getattr(s.scores[era], part) for s in stages]
            ys = positions + (k - 1) * BAR_HEIGHT
            ax.barh(ys, [0.0 if math.isnan(v) else v for v in values], height=BAR_HEIGHT, color=colour, label=part)
            for y, v in zip(ys, values, strict=True):
                ax.text((0.0 if math.isnan(v) else v) + 0.01, y, "n/a" if math.isnan(v) else f"{v:.3f}",
                        va="center", fontsize=6)
        ax.set_xlim(0, 1.15)  # room for the value labels
        ax.set_title(ERA_TITLES[era], fontsize=9)
        ax.set_xlabel("score", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(list(positions), [s.title for s in stages])
    axes[0].invert_yaxis()  # stage 1 on top
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(parts), fontsize=7, frameon=False)
    fig.suptitle("Ablation: overall score and its instance / semantic parts", fontsize=10)
    return fig


def write_figures(report: Report, root: Path, *, progress: bool = False) -> list[str]:
    """Draw every PNG of the report into `root`; returns their paths."""
    eras = report.options.eras
    paths = [save_png(overall_figure(report.stages, eras), root / "overall.png", overwrite=True)]
    for era in eras:
        fig = scores_figure([score_set(s, era) for s in report.stages])
        paths.append(save_png(fig, root / f"classes_{era}.png", overwrite=True))

    crops = [c for c in report.plan.scored if c in report.truth][:report.options.slices]
    era, layout = report.options.tuning_era, Layout(root)
    off = report.switches.get("postprocess", {}).get("off", [])  # stage 5 as switched in the tuning era
    segmented = {"tta": layout.segmentation("tta"),
                 "postprocessed": layout.postprocessed_in(era, tuning_era=era, off=off)}
    for crop in crops:
        for name, store in segmented.items():
            view = load_prediction_slice(store, crop, truth_root=report.data_root, progress=progress)
            paths.append(save_png(prediction_figure(view), root / f"overlay_{crop}_{name}.png", overwrite=True))
    logging.getLogger(__name__).info("wrote %d figures", len(paths))
    return [str(p) for p in paths]
