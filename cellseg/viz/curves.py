"""Training curves from runs' `metrics.jsonl`: loss, validation scores, learning rate, throughput, MFU.

Record format (`cellseg.train.run_log.RunLog`): one JSON object per line, `{"step", "time", "train": {...}}`
(loss, grad_norm, lr, samples_per_s, mvox_per_s, data_wait_frac, micro_batch; on GPUs also tflops_per_gpu, mfu,
gpu_mem_gb) or `{"step", "time", "val": {...}}` (metric era, overall scores, class_scores, ...).
A resumed run logs again the steps after its last checkpoint; the later record of a step wins.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from cellseg.eval.eras import ERA_TITLES
from cellseg.viz.figure import new_figure
from cellseg.viz.palette import CLASS_COLORS

PANEL_PX = (380, 260)  # width, height of one curve panel
RUN_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
FEW_POINTS = 30  # series shorter than this get point markers (a single validation is otherwise invisible)
LOG_SCALE_RATIO = 20.0  # a loss spanning more than this factor is drawn on a log axis
TRAIN_PANELS = (  # (key in the train record, title, scale applied to the value)
    ("loss", "training loss", 1.0),
    ("lr", "learning rate", 1.0),
    ("samples_per_s", "throughput (samples/s)", 1.0),
    ("mfu", "MFU (% of bf16 peak)", 100.0),
    ("grad_norm", "gradient norm (before clipping)", 1.0),
)


@dataclass(frozen=True, kw_only=True)
class RunCurves:
    """The records of one run, by step.

    Attributes:
        name: the run's label in legends (its directory name).
        train: step → train record (later records of a step replace earlier ones).
        val: step → validation record.
    """

    name: str
    train: dict[int, dict[str, Any]]
    val: dict[int, dict[str, Any]]

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of a numeric train key, steps ascending; absent values skipped."""
        pairs = [(s, r[key]) for s, r in sorted(self.train.items()) if isinstance(r.get(key), int | float)]
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs], dtype=np.float64)

    def val_series(self, key: str, *, per_class: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of a validation score (`overall_score`, ... or a class with `per_class`)."""
        pairs = []
        for step, record in sorted(self.val.items()):
            value = record.get("class_scores", {}).get(key) if per_class else record.get(key)
            pairs.append((step, math.nan if value is None else float(value)))
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs], dtype=np.float64)

    @property
    def era(self) -> str | None:
        """The metric era of the validation records (None without validation)."""
        eras = {str(r.get("metric")) for r in self.val.values()}
        return eras.pop() if len(eras) == 1 else ("mixed" if eras else None)


def load_run(path: str | os.PathLike[str], *, name: str | None = None) -> RunCurves:
    """Read a run directory's `metrics.jsonl` (or the file itself).

    Raises:
        FileNotFoundError: no `metrics.jsonl`.
        ValueError: a line that is not a JSON record with a step (its line number is named).
    """
    path = Path(path)
    file = path / "metrics.jsonl" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no metrics.jsonl (is {path} a run directory?)")
    train: dict[int, dict[str, Any]] = {}
    val: dict[int, dict[str, Any]] = {}
    with file.open() as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                step = int(entry["step"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                raise ValueError(f"{file}, line {line_no}: not a metrics record with a 'step'") from None
            if isinstance(entry.get("train"), dict):
                train[step] = entry["train"]
            if isinstance(entry.get("val"), dict) and entry["val"]:
                val[step] = entry["val"]
    if not train and not val:
        raise ValueError(f"{file}: no train or validation records")
    return RunCurves(name=name or (file.parent.name if file.name == "metrics.jsonl" else file.stem),
                     train=train, val=val)


def _train_panel(ax: Axes, runs: Sequence[RunCurves], key: str, title: str, scale: float) -> None:
    lows, highs = [], []
    for run, colour in zip(runs, RUN_COLORS * 8, strict=False):
        steps, values = run.series(key)
        if steps.size:
            ax.plot(steps, values * scale, color=colour, label=run.name, linewidth=1.2,
                    marker="." if steps.size < FEW_POINTS else None)
            positive = values[values > 0]
            if positive.size:
                lows.append(positive.min())
                highs.append(positive.max())
    if key in ("loss", "lr") and lows and max(highs) / min(lows) > LOG_SCALE_RATIO:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=8)


def _val_panel(ax: Axes, runs: Sequence[RunCurves], classes: Sequence[str] | None) -> None:
    single = len(runs) == 1
    for run, colour in zip(runs, RUN_COLORS * 8, strict=False):
        if single:  # per-class scores as thin lines in the class colours, under the overall scores
            names = classes if classes is not None else sorted({k for r in run.val.values()
                                                               for k in r.get("class_scores", {})})
            for name in names:
                steps, values = run.val_series(name, per_class=True)
                ax.plot(steps, values, color=CLASS_COLORS.get(name, "#999999"), linewidth=0.8,
                        marker="." if steps.size < FEW_POINTS else None, alpha=0.9 if classes else 0.35,
                        label=name if classes else None)
        steps, values = run.val_series("overall_score")
        ax.plot(steps, values, color="black" if single else colour, linewidth=2.0, marker="o", markersize=3,
                label="overall" if single else run.name)
        if single:
            for key, style in (("overall_instance_score", "--"), ("overall_semantic_score", ":")):
                steps, values = run.val_series(key)
                ax.plot(steps, values, color="black", linestyle=style, linewidth=1.2,
                        label=key.removeprefix("overall_").removesuffix("_score"))
    eras = {r.era for r in runs if r.era}
    era = ERA_TITLES.get(eras.pop(), "mixed metric eras") if len(eras) == 1 else "mixed metric eras"
    ax.set_title(f"validation ({era})", fontsize=8)
    ax.set_ylim(-0.02, 1.02)


def curves_figure(runs: RunCurves | Sequence[RunCurves], *, classes: Sequence[str] | None = None) -> Figure:
    """A grid of curves over steps: validation scores, loss, learning rate, samples/s, MFU, gradient norm;
    a panel appears only when some run logged its values. Several runs overlay in distinct colours.

    Args:
        runs: one run or several (`load_run`).
        classes: validation classes to draw with a legend (single run); default all classes, unlabelled.
    """
    runs = [runs] if isinstance(runs, RunCurves) else list(runs)
    if not runs:
        raise ValueError("curves_figure: no runs")
    panels: list[tuple[str, Any]] = []
    if any(r.val for r in runs):
        panels.append(("val", None))
    panels += [("train", spec) for spec in TRAIN_PANELS if any(r.series(spec[0])[0].size for r in runs)]
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = new_figure(cols * PANEL_PX[0], rows * PANEL_PX[1] + 50)
    axes = fig.subplots(rows, cols, squeeze=False, sharex="all").ravel()  # one step axis for every panel
    for ax, (kind, spec) in zip(axes, panels, strict=False):
        if kind == "val":
            _val_panel(ax, runs, classes)
        else:
            _train_panel(ax, runs, *spec)
        ax.set_xlabel("step", fontsize=7)
        ax.tick_params(labelsize=7, labelbottom=True)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0] and (kind == "val" or len(runs) > 1):
            ax.legend(fontsize=6, frameon=False, ncols=2 if len(ax.get_legend_handles_labels()[0]) > 6 else 1)
    for ax in axes[len(panels):]:
        ax.axis("off")
    fig.suptitle(" vs ".join(r.name for r in runs), fontsize=9)
    return fig
