"""Throughput and MFU charts from the benchmark JSON files in `bench/results/`.

Three formats are read (`load_bench`), each into one `BenchTable` of bars (category × series):
- train step (`bench/train_step.py`: `{"env", "rows": [{"name", "batch", "stock": {...}, "cellseg": {...}}]}`):
  one category per architecture, series "stock" and "cellseg"; ms/step, samples/s, Mvox/s, MFU;
- models (`bench/models.py`: `{"environment", "models": [{"name", "batch_size", "settings": {...}}]}`):
  one category per architecture, one series per setting (e.g. "bf16-cl"); the same metrics;
- loader (`bench/loader.py`: `{"gpu", "cpus", "runs": [...], "peer": [...]}`): one category per worker
  count, one series per library and option set; patches/s and resident memory (GB).
Several files of one format merge (e.g. the 2D and 3D train-step results).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from cellseg.viz.figure import new_figure, read_json_object

SERIES_COLORS = ("#bdbdbd", "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d")
METRIC_LABELS = {
    "step_ms": "ms per step (lower is better)",
    "samples_per_s": "samples/s",
    "mvox_per_s": "Mvoxel/s",
    "mfu": "MFU (% of bf16 peak)",
    "patches_per_s": "patches/s",
    "rss_GB": "resident memory (GB)",
}
PERCENT_METRICS = frozenset({"mfu"})  # stored as fractions, drawn as percentages
CATEGORY_PX = 90  # width per category
PANEL_HEIGHT_PX = 330


@dataclass(kw_only=True)
class BenchTable:
    """Bars of one benchmark: `values[metric][(category, series)]`, plus notes for failed cells."""

    kind: str
    title: str
    categories: list[str] = field(default_factory=list)
    series: list[str] = field(default_factory=list)
    values: dict[str, dict[tuple[str, str], float]] = field(default_factory=dict)
    notes: dict[tuple[str, str], str] = field(default_factory=dict)
    default_metrics: tuple[str, str] = ("step_ms", "mfu")

    def add(self, category: str, series: str, metrics: Mapping[str, Any]) -> None:
        """Record one bar's metrics (non-numeric entries are ignored)."""
        if category not in self.categories:
            self.categories.append(category)
        if series not in self.series:
            self.series.append(series)
        for key, value in metrics.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                self.values.setdefault(key, {})[(category, series)] = float(value)

    def merge(self, other: BenchTable) -> None:
        """Append another table of the same kind."""
        if other.kind != self.kind:
            raise ValueError(f"cannot draw {self.kind} and {other.kind} benchmark results in one chart")
        for (category, series) in {cs for v in other.values.values() for cs in v} | set(other.notes):
            self.add(category, series, {m: v[(category, series)] for m, v in other.values.items()
                                        if (category, series) in v})
        self.notes.update(other.notes)
        if other.title not in self.title:
            self.title += f"; {other.title}"


def _step_metrics(result: Mapping[str, Any], batch: int) -> dict[str, Any]:
    metrics = dict(result)
    if isinstance(result.get("step_ms"), int | float) and result["step_ms"] > 0:
        metrics["samples_per_s"] = batch * 1000.0 / result["step_ms"]
    return metrics


def _patch(shape: Sequence[int]) -> str:
    return "×".join(map(str, shape)) if shape else "?"


def _train_step(doc: Mapping[str, Any], source: str) -> BenchTable:
    env = doc.get("env", {})
    table = BenchTable(kind="train_step", title=f"training step, {env.get('gpu', '?')} ({env.get('date', '?')})")
    for row in doc["rows"]:
        category = f"{row['name']}\nb{row.get('batch', '?')} {_patch(row.get('patch', []))}"
        for series in ("stock", "cellseg"):
            if isinstance(row.get(series), Mapping):
                table.add(category, series, _step_metrics(row[series], int(row.get("batch", 0))))
    return table


def _models(doc: Mapping[str, Any], source: str) -> BenchTable:
    env = doc.get("environment", {})
    table = BenchTable(kind="models", title=f"models, {env.get('device', '?')} ({env.get('date', '?')})")
    for model in doc["models"]:
        category = f"{model['name']}\nb{model.get('batch_size', '?')} {_patch(model.get('patch_vox', []))}"
        for setting, result in model.get("settings", {}).items():
            table.add(category, setting, _step_metrics(result, int(model.get("batch_size", 0))))
            if result.get("status", "ok") != "ok":
                table.notes[(category, setting)] = str(result["status"])
    return table


def _loader_series(run: Mapping[str, Any], library: str) -> str:
    parts = [library, str(run.get("shape", ""))]
    parts += [flag for flag in ("augment", "boundaries") if run.get(flag)]
    return " ".join(p for p in parts if p)


def _loader(doc: Mapping[str, Any], source: str) -> BenchTable:
    table = BenchTable(kind="loader", title=f"loader, {doc.get('cpus', '?')} CPUs, {doc.get('gpu', '?')} "
                                            f"({doc.get('date', '?')})", default_metrics=("patches_per_s", "rss_GB"))
    rows = [(r, "cellseg") for r in doc.get("runs", [])] + [(r, r.get("library", "peer")) for r in doc.get("peer", [])]
    if not rows:
        raise ValueError(f"{source}: loader results without any runs")
    for run, library in sorted(rows, key=lambda rl: int(rl[0].get("workers", 0))):
        table.add(f"{run.get('workers', '?')} workers", _loader_series(run, library), run)
    return table


def table_from_document(doc: Mapping[str, Any], *, source: str = "benchmark") -> BenchTable:
    """Recognise a benchmark document's format and tabulate it.

    Raises:
        ValueError: a format this module does not know.
    """
    if isinstance(doc.get("rows"), list) and doc["rows"] and "stock" in doc["rows"][0]:
        return _train_step(doc, source)
    if isinstance(doc.get("models"), list):
        return _models(doc, source)
    if "runs" in doc:
        return _loader(doc, source)
    raise ValueError(f"{source}: not a train-step, models or loader benchmark result (keys: {sorted(doc)})")


def load_bench(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> BenchTable:
    """Read one or more benchmark JSON files of one format into one table.

    Raises:
        FileNotFoundError: a missing file.
        ValueError: unreadable JSON, an unknown format, or files of different formats.
    """
    paths = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not paths:
        raise ValueError("load_bench: no files")
    table = None
    for path in map(Path, paths):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        part = table_from_document(read_json_object(path), source=str(path))
        if table is None:
            table = part
        else:
            table.merge(part)
    assert table is not None
    return table


def _fmt(value: float) -> str:
    """Three significant digits without exponents: 1530, 142, 30.3, 0.528."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _bars(ax: Axes, table: BenchTable, metric: str) -> None:
    values = table.values.get(metric, {})
    scale = 100.0 if metric in PERCENT_METRICS else 1.0
    x = np.arange(len(table.categories))
    width = 0.8 / max(1, len(table.series))
    for i, (series, colour) in enumerate(zip(table.series, SERIES_COLORS * 4, strict=False)):
        offsets = x - 0.4 + width * (i + 0.5)
        heights = [values.get((c, series), math.nan) * scale for c in table.categories]
        ax.bar(offsets, [0.0 if math.isnan(h) else h for h in heights], width, color=colour, label=series,
               edgecolor="black", linewidth=0.3)
        for xo, h, c in zip(offsets, heights, table.categories, strict=True):
            note = table.notes.get((c, series))
            text = note if note else ("" if math.isnan(h) else _fmt(h))
            if text:
                ax.text(xo, 0.0 if math.isnan(h) else h, text, ha="center", va="bottom", fontsize=5.5, rotation=90)
    ax.set_xticks(x, table.categories, fontsize=6)
    ax.set_ylabel(METRIC_LABELS.get(metric, metric), fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.18)  # room for the value labels


def bench_figure(table: BenchTable, *, metrics: Sequence[str] | None = None) -> Figure:
    """Grouped bars, one panel per metric (default: ms/step and MFU, or patches/s and memory for loaders).

    Raises:
        ValueError: a requested metric that no bar has.
    """
    metrics = list(metrics or [m for m in table.default_metrics if m in table.values])
    unknown = [m for m in metrics if m not in table.values]
    if unknown or not metrics:
        raise ValueError(f"metric(s) {unknown or metrics} not in these results; available: {sorted(table.values)}")
    width = max(480, CATEGORY_PX * len(table.categories) + 120)
    fig = new_figure(width, PANEL_HEIGHT_PX * len(metrics) + 60)
    axes = fig.subplots(len(metrics), 1, squeeze=False)[:, 0]
    for ax, metric in zip(axes, metrics, strict=True):
        _bars(ax, table, metric)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", fontsize=7, frameon=False, ncols=min(4, len(labels)))
    fig.suptitle(table.title, fontsize=9)
    return fig
