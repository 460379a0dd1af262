"""Per-class score bars, for either metric era, from evaluation JSON or a training run's validation.

Accepted inputs (`load_scores`):
- `cellseg evaluate --json` output (`cellseg.eval.report.to_json`: `metric`, `label_scores`, overall scores);
- the official evaluators' `results.json` (no `metric` key: the era is read off the keys, `accuracy`/
  `dice_score` for 2025, `f1`/`tp` for 2026);
- a validation record of a run (`{"metric", "class_scores", "label_scores", ...}`, the `val` entry of a
  `metrics.jsonl` line), a `metrics.jsonl` file or a run directory (the last validation, or `step=`).

A class's score is what the overall score averages: `combined_score` for instance-scored classes, `iou`
for semantic ones, in both eras. Scores of different eras are not comparable; every panel names its era.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from cellseg.eval.eras import ERA_TITLES
from cellseg.eval.rules import is_scored_as_instance
from cellseg.viz.figure import new_figure, read_json_object
from cellseg.viz.palette import KIND_COLORS

BAR_PX = 15  # height per class row
PANEL_WIDTH_PX = 380
LABEL_WIDTH_PX = 110  # class names left of the first panel
MARGIN_PX = 120  # titles, axis labels and the legend


@dataclass(frozen=True, kw_only=True)
class ScoreSet:
    """Per-class scores of one evaluation.

    Attributes:
        era: "2025" or "2026".
        source: where they came from (file name, run and step), for titles.
        scores: class → score in [0, 1]; NaN where the evaluation gives none (null).
        overall, overall_instance, overall_semantic: the evaluation's summary scores (NaN if absent).
    """

    era: str
    source: str
    scores: dict[str, float]
    overall: float = math.nan
    overall_instance: float = math.nan
    overall_semantic: float = math.nan

    def kind(self, name: str) -> str:
        """"instance" or "semantic": how the class is scored."""
        return "instance" if is_scored_as_instance(name) else "semantic"


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def _infer_era(label_scores: Mapping[str, Mapping[str, Any]], source: str) -> str:
    keys = {k for scores in label_scores.values() for k in scores}
    if keys & {"accuracy", "dice_score", "hausdorff_distance"}:
        return "2025"
    if keys & {"f1", "tp"}:
        return "2026"
    raise ValueError(f"{source}: cannot tell the metric era (no 'metric' key, label scores have {sorted(keys)})")


def scores_from_document(doc: Mapping[str, Any], *, source: str = "scores") -> ScoreSet:
    """A `ScoreSet` from an evaluation document or a validation record (formats in the module docstring).

    Raises:
        ValueError: no per-class scores, or an unknown era.
    """
    labels = doc.get("label_scores")
    if not isinstance(labels, Mapping) and not isinstance(doc.get("class_scores"), Mapping):
        raise ValueError(f"{source}: no 'label_scores' or 'class_scores' (is this evaluation JSON?)")
    era = str(doc["metric"]) if "metric" in doc else _infer_era(labels or {}, source)
    if era not in ERA_TITLES:
        raise ValueError(f"{source}: metric era {era!r} is not one of {sorted(ERA_TITLES)}")
    if isinstance(doc.get("class_scores"), Mapping):
        scores = {k: _number(v) for k, v in doc["class_scores"].items()}
    else:
        assert isinstance(labels, Mapping)
        scores = {k: _number(v.get("combined_score" if is_scored_as_instance(k) else "iou"))
                  for k, v in labels.items()}
    if not scores:
        raise ValueError(f"{source}: the evaluation holds no class scores")
    return ScoreSet(era=era, source=source, scores=scores, overall=_number(doc.get("overall_score")),
                    overall_instance=_number(doc.get("overall_instance_score")),
                    overall_semantic=_number(doc.get("overall_semantic_score")))


def _validation_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    records = []
    with path.open() as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {line_no}: not JSON ({err.msg})") from None
            if isinstance(entry.get("val"), dict) and entry["val"]:
                records.append((int(entry["step"]), entry["val"]))
    return records


def load_scores(source: str | os.PathLike[str] | Mapping[str, Any], *, step: int | None = None) -> ScoreSet:
    """Scores from a JSON file, a `metrics.jsonl`, a run directory, or an already-parsed document.

    Args:
        step: for runs, the validation at this step (default: the last one).

    Raises:
        FileNotFoundError: no such file, or a run directory without `metrics.jsonl`.
        ValueError: unreadable JSON, no validation record (at `step`), no class scores.
    """
    if isinstance(source, Mapping):
        return scores_from_document(source)
    path = Path(source)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix == ".jsonl":
        records = _validation_records(path)
        if not records:
            raise ValueError(f"{path}: no validation records")
        chosen = [r for r in records if step is None or r[0] == step]
        if not chosen:
            raise ValueError(f"{path}: no validation at step {step}; steps: {[s for s, _ in records]}")
        at, record = chosen[-1]
        run = path.parent.name if path.name == "metrics.jsonl" else path.stem
        return scores_from_document(record, source=f"{run} step {at}")
    return scores_from_document(read_json_object(path), source=path.name)


def class_order(sets: Sequence[ScoreSet]) -> list[str]:
    """Classes of the first set by descending score (missing scores last), then any others by name."""
    first = sets[0].scores
    order = sorted(first, key=lambda k: (math.isnan(first[k]), -first[k] if not math.isnan(first[k]) else 0, k))
    extra = sorted({k for s in sets[1:] for k in s.scores} - set(first))
    return order + extra


def _fmt(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.3f}"


def scores_figure(sets: ScoreSet | Sequence[ScoreSet]) -> Figure:
    """Horizontal bars of per-class scores, one panel per evaluation, classes in one shared order
    (sorted by the first evaluation), bars coloured by scoring kind (instance / semantic)."""
    sets = [sets] if isinstance(sets, ScoreSet) else list(sets)
    if not sets:
        raise ValueError("scores_figure: no evaluations to draw")
    order = class_order(sets)
    fig = new_figure(LABEL_WIDTH_PX + PANEL_WIDTH_PX * len(sets), BAR_PX * len(order) + MARGIN_PX)
    axes = fig.subplots(1, len(sets), sharey=True, squeeze=False)[0]
    positions = range(len(order))
    for ax, s in zip(axes, sets, strict=True):
        values = [s.scores.get(k, math.nan) for k in order]
        colours = [KIND_COLORS[s.kind(k)] for k in order]
        ax.barh(positions, [0.0 if math.isnan(v) else v for v in values], color=colours, height=0.8)
        for y, v in zip(positions, values, strict=True):
            ax.text(min(v, 1.0) + 0.01 if not math.isnan(v) else 0.01, y, _fmt(v), va="center", fontsize=6)
        ax.set_xlim(0, 1.15)  # room for the value labels
        ax.set_xlabel("score (instance: combined, semantic: IoU)", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(f"{s.source}\n{ERA_TITLES[s.era]}\noverall {_fmt(s.overall)} · instance "
                     f"{_fmt(s.overall_instance)} · semantic {_fmt(s.overall_semantic)}", fontsize=8)
    axes[0].set_yticks(list(positions), order)
    axes[0].invert_yaxis()  # best class on top
    handles = [Patch(facecolor=c, label=f"{k} class") for k, c in KIND_COLORS.items()]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=7, frameon=False)
    return fig
