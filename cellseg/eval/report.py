"""Rendering an `Evaluation`: a JSON document with the official key names, and a readable table.

Both always name the era: JSON `"metric": "2025" | "2026"` plus `"metric_title"`, and the table's
first line "2025 challenge-era metric" / "2026 metric (official code at 6b9ad68)" (`ScoringEra.title`); the columns shown are
the era's (`ScoringEra.class_columns`, `crop_columns`). Non-finite numbers (an infinite
Hausdorff distance, the NaN overall score of the 2025 era when a kind of class is absent) are written as
`null`, as the official evaluators write them.

A (crop, label) whose per-crop score the era's combining leaves out (`ScoringEra.skipped`: a 2026 instance crop
over the object-count cutoff) is never shown as a score: its per-crop row says "skipped" and why, a class row
says how many of its crops were skipped (a class whose every crop was skipped reads 1.0 officially while no crop
was scored), and the summary counts and lists them in every era (0 in an era that skips none). The JSON lists
them under `"skipped"` (not an official key). `cellseg evaluate --json` also records what it scored under
`"inputs"` (submission, truth, metric; not an official key), so that the same command run again may replace it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from cellseg.eval.eras import get_era
from cellseg.eval.rules import is_scored_as_instance, nan_to_none
from cellseg.eval.score import Evaluation

SHORT = {"combined_score": "combined", "normalized_hausdorff_distance": "norm_hd", "hausdorff_distance": "hd_nm",
         "dice_score": "dice", "hausdorff_norm_sum": "hd_sum", "n_hausdorff": "n_hd", "accuracy": "acc"}


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return nan_to_none(value)


def to_json(ev: Evaluation) -> dict[str, Any]:
    """The JSON document of an evaluation (official key names; see the module docstring)."""
    total = sum(len(labels) for labels in ev.crop_scores.values())
    scored = sum(not s["is_missing"] for labels in ev.crop_scores.values() for s in labels.values())
    return _clean({
        "metric": ev.metric,
        "metric_title": get_era(ev.metric).title,
        "overall_score": ev.overall_score,
        "overall_instance_score": ev.overall_instance_score,
        "overall_semantic_score": ev.overall_semantic_score,
        "label_scores": ev.label_scores,
        "crop_scores": ev.crop_scores,
        "missing": ev.missing,
        "total_evals": total,
        "num_evals_scored": scored,
        "skipped": [list(pair) for pair in get_era(ev.metric).skipped(ev.crop_scores)],
        "notes": ev.notes,
        "array_notes": ev.array_notes,
        "official_evaluator_would_fail": ev.official_failures,
    })


def write_json(ev: Evaluation, path: str | os.PathLike[str], *, inputs: Mapping[str, str] | None = None) -> None:
    """Write `to_json(ev)` atomically (temporary file, then rename); `inputs` (what was scored: submission, truth,
    metric) is recorded under "inputs" so that the same evaluation run again may replace the file."""
    tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
    doc = to_json(ev) | ({"inputs": dict(inputs)} if inputs else {})
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def _fmt(value: Any) -> str:
    value = nan_to_none(value)
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1e5 else f"{value:.3g}"
    return str(value)


def _rows(keys: tuple[str, ...], items: list[tuple[str, dict[str, Any]]], indent: str = "") -> list[str]:
    lines = []
    for name, scores in items:
        cells = "  ".join(f"{SHORT.get(k, k)}={_fmt(scores.get(k))}" for k in keys)
        lines.append(f"{indent}{name:<14} {cells}")
    return lines


def _skip_reason(scores: dict[str, Any]) -> str:
    """Why a per-crop score was left out, with the object counts when the era recorded them."""
    reason = str(scores.get("status", "skipped"))
    if "num_pred_objects" in scores:
        reason += f": {scores['num_pred_objects']} predicted objects for {scores.get('num_truth_objects', '?')} true"
    return reason


def _class_note(skipped: int, total: int) -> str:
    if not skipped:
        return ""
    if skipped == total:
        return f"  [all {total} crops skipped: no crop was scored, this is not a score]"
    return f"  [{skipped} of {total} crops skipped]"


def _crop_rows(ev: Evaluation, label: str, keys: tuple[str, ...]) -> list[str]:
    era, lines = get_era(ev.metric), []
    for crop, labels in sorted(ev.crop_scores.items()):
        if label not in labels:
            continue
        scores = labels[label]
        if era.is_skipped(scores):  # never printed as numbers: they count for nothing
            lines.append(f"    {crop + ' (skipped)':<14} not scored ({_skip_reason(scores)})")
        else:
            lines += _rows(keys, [(crop + (" (missing)" if scores["is_missing"] else ""), scores)], indent="    ")
    return lines


def format_table(ev: Evaluation, *, per_crop: bool = False) -> str:
    """Readable summary: era, overall scores, one line per class (and per crop with `per_crop`), the skipped
    (crop, label) pairs (module docstring)."""
    era = get_era(ev.metric)
    skipped = era.skipped(ev.crop_scores)
    lines = [f"cellseg evaluate: {era.title}",
             f"overall {_fmt(ev.overall_score)}   instance {_fmt(ev.overall_instance_score)}   "
             f"semantic {_fmt(ev.overall_semantic_score)}   skipped {len(skipped)} of "
             f"{sum(len(labels) for labels in ev.crop_scores.values())} (crop, label) pairs"]
    for kind in ("instance", "semantic"):
        labels = [k for k in sorted(ev.label_scores) if is_scored_as_instance(k) == (kind == "instance")]
        if not labels:
            continue
        lines += ["", f"{kind} classes ({era.title})"]
        for label in labels:
            total = sum(label in s for s in ev.crop_scores.values())
            note = _class_note(sum(lab == label for _, lab in skipped), total)
            lines += [row + note for row in _rows(era.class_columns[kind], [(label, ev.label_scores[label])])]
            if per_crop:
                lines += _crop_rows(ev, label, era.crop_columns[kind])
    lines += _skipped_lines(ev, skipped)
    lines += _problem_lines(ev)
    return "\n".join(lines)


MAX_LISTED = 20  # skipped pairs and notes listed on the console; the JSON has them all


def _skipped_lines(ev: Evaluation, skipped: list[tuple[str, str]]) -> list[str]:
    """The skipped pairs, counted and listed (at most `MAX_LISTED`)."""
    if not skipped:
        return []
    lines = ["", f"skipped {len(skipped)} (crop, label) pairs: the {get_era(ev.metric).title} leaves them out of "
                 "its scores (they count for nothing; cellseg's decisions count them as their worst case)"]
    lines += [f"  {crop}/{label}: {_skip_reason(ev.crop_scores[crop][label])}" for crop, label in skipped[:MAX_LISTED]]
    if len(skipped) > MAX_LISTED:
        lines.append(f"  ... and {len(skipped) - MAX_LISTED} more (see --json)")
    return lines


def _problem_lines(ev: Evaluation) -> list[str]:
    lines = []
    missing = ev.missing
    if missing["crops"]:
        lines.append(f"missing crops (scored 0): {', '.join(missing['crops'])}")
    for crop, labels in sorted(missing["labels"].items()):
        lines.append(f"{crop}: missing labels: {', '.join(labels)}")
    for crop, labels in sorted(missing["unreadable"].items()):
        lines += [f"{crop}/{label}: {reason}" for label, reason in sorted(labels.items())]
    for crop, labels in sorted(missing["not_in_truth"].items()):
        lines.append(f"{crop}: ignored (not in the truth): {', '.join(labels)}")
    lines += ev.notes
    array_notes = [f"{crop}/{label}: {note}" for crop, labels in sorted(ev.array_notes.items())
                   for label, notes in sorted(labels.items()) for note in notes if not note.startswith("scored as")]
    lines += array_notes[:20] + ([f"... and {len(array_notes) - 20} more notes (see the JSON)"]
                                 if len(array_notes) > 20 else [])
    if ev.official_failures:
        lines.append(f"the official {get_era(ev.metric).title} evaluator would have failed here:")
        lines += [f"  {f}" for f in ev.official_failures[:20]]
        if len(ev.official_failures) > 20:
            lines.append(f"  ... and {len(ev.official_failures) - 20} more (see the JSON)")
    return ["", *lines] if lines else []
