"""Rendering a `Report`: `report.md` (header with the biases, the ablation table, single models, per-class
tables per era, timings), `report.json` (everything, with each evaluation's full document) and the table
printed on the console. Every table names its metric era; scores of the two eras are not comparable.
Non-finite scores (the 2025 era's NaN overall when a kind of class is absent) read "n/a" / null.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cellseg import __version__
from cellseg.eval.eras import ERA_TITLES
from cellseg.eval.rules import is_scored_as_instance, nan_to_none
from cellseg.report.results import Report, StageResult
from cellseg.report.scoring import PLAIN_RULE

FORMAT = "cellseg-ablation-report"
VERSION = 1


def fmt(value: float) -> str:
    """A score with 4 decimals, "n/a" for NaN."""
    return "n/a" if math.isnan(value) else f"{value:.4f}"


def _with_delta(value: float, previous: float | None) -> str:
    if previous is None or math.isnan(value) or math.isnan(previous):
        return fmt(value)
    return f"{fmt(value)} ({value - previous:+.4f})"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def ablation_table(report: Report) -> list[str]:
    """Rows = stages; per era: overall (change against the row above), instance part, semantic part."""
    eras = report.options.eras
    header = ["stage"] + [f"{e} {part}" for e in eras for part in ("overall", "instance", "semantic")]
    rows, previous = [], None
    for stage in report.stages:
        row = [stage.title]
        for era in eras:
            s = stage.scores[era]
            row += [_with_delta(s.overall, previous[era] if previous else None), fmt(s.instance), fmt(s.semantic)]
        rows.append(row)
        previous = {era: stage.scores[era].overall for era in eras}
    return _table(header, rows)


def singles_table(report: Report) -> list[str]:
    """One row per run (no TTA, threshold 0.5), each era's best overall score in bold."""
    eras = report.options.eras
    header = ["run (model)"] + [f"{e} {part}" for e in eras for part in ("overall", "instance", "semantic")]
    rows = []
    for s in report.singles:
        name = s.key.removeprefix("single_")
        row = [s.title]
        for e in eras:
            overall = fmt(s.scores[e].overall)
            row += [f"**{overall}**" if report.best_single.get(e) == name else overall,
                    fmt(s.scores[e].instance), fmt(s.scores[e].semantic)]
        rows.append(row)
    return _table(header, rows)


def _columns(report: Report) -> list[tuple[str, StageResult]]:
    return [(s.title.split(" (")[0], s) for s in report.singles] + [
        (short, stage) for short, stage in zip(("uniform", "weighted", "+ TTA", "+ post-proc."), report.stages[1:],
                                               strict=True)]


def class_table(report: Report, era: str) -> list[str]:
    """Rows = classes (instance first); columns = each single model, then stages 2-5."""
    columns = _columns(report)
    classes = sorted({c for _, s in columns for c in s.scores[era].classes},
                     key=lambda c: (not is_scored_as_instance(c), c))
    header = ["class", "scored as"] + [name for name, _ in columns]
    rows = [[c, "instance (combined)" if is_scored_as_instance(c) else "semantic (IoU)"]
            + [fmt(s.scores[era].classes.get(c, math.nan)) for _, s in columns] for c in classes]
    return _table(header, rows)


def header_lines(report: Report) -> list[str]:
    """What was compared, on which crops, how each stage is scored, and the biases."""
    opts, plan = report.options, report.plan
    classes = report.runs[0].classes
    instance = [c for c in classes if is_scored_as_instance(c)]
    semantic = [c for c in classes if not is_scored_as_instance(c)]
    scored = ", ".join(f"{c} ({len(report.truth.get(c, []))} labels)" for c in plan.scored)
    lines = [
        "# Ablation: what each inference stage adds",
        "",
        f"cellseg {__version__}, {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}. "
        f"Data root `{report.data_root}`.",
        "",
        "Runs: " + "; ".join(f"**{r.name}** ({r.model}, `{r.run_dir}`)" for r in report.runs) + ".",
        "",
        f"- **Scored crops** (`--crops {plan.scored_spec}`): {scored}.",
        f"- **Tuning crops** (ensemble weights, post-processing; `--tune-crops {plan.tuning_spec}`): "
        f"{', '.join(plan.tuning)}; tuned for the {ERA_TITLES[opts.tuning_era]}.",
        f"- **Classes** (the runs' classes only; overall scores average these): instance {', '.join(instance) or '-'}; "
        f"semantic {', '.join(semantic) or '-'}.",
        f"- **Metrics**: {'; '.join(ERA_TITLES[e] for e in opts.eras)}. Scores of different eras are not comparable.",
        f"- **Scoring**: stages 1-4 as the official evaluator reads a binary prediction ({PLAIN_RULE}), stage 5 "
        "with our post-processing's masks and ids; every stage is written as a submission at the truth's "
        "geometry and scored by `cellseg evaluate`'s code. Stage 4 reuses stage 3's weights (fitted without TTA).",
        "",
    ]
    lines += [f"> **Bias.** {note}" if i == 0 else f"> {note}" for i, note in enumerate(plan.notes)]
    return lines


def markdown(report: Report) -> str:
    """The whole report.md."""
    lines = [*header_lines(report), "", "## Ablation", "", *ablation_table(report)]
    lines += ["", "In parentheses: the change of the overall score against the row above.", "",
              "## Single models (no TTA, threshold 0.5; bold: the best in that era)", "",
              *singles_table(report)]
    for era in report.options.eras:
        lines += ["", f"## Per class, {ERA_TITLES[era]}", "", *class_table(report, era)]
    timing_rows = [[t["step"], f"{t['seconds']:.1f}", "resumed: earlier outputs reused" if t.get("resumed") else ""]
                   for t in report.timings]
    lines += ["", "## Timings", "", *_table(["step", "seconds", "note"], timing_rows)]
    if report.figures:
        lines += ["", "## Figures", ""] + [f"![{Path(f).stem}]({Path(f).name})" for f in report.figures]
    return "\n".join(lines) + "\n"


def console(report: Report) -> str:
    """The ablation table for the terminal, with the first bias note."""
    lines = [f"Ablation on {len(report.plan.scored)} crops ({', '.join(report.plan.scored)}); tuned on "
             f"{', '.join(report.plan.tuning)}", "", *ablation_table(report)]
    return "\n".join([*lines, "", report.plan.notes[0]])


def _clean(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return nan_to_none(value)


def _stage_json(stage: StageResult) -> dict[str, Any]:
    return {"key": stage.key, "title": stage.title, "store": stage.store,
            "scores": {era: {"metric_title": ERA_TITLES[era], "overall": s.overall, "instance": s.instance,
                             "semantic": s.semantic, "classes": dict(s.classes), "evaluation": dict(s.document)}
                       for era, s in stage.scores.items()}}


def to_json(report: Report) -> dict[str, Any]:
    """The report.json document (NaN and infinities as null)."""
    plan = report.plan
    return _clean({
        "format": FORMAT, "version": VERSION, "cellseg_version": __version__,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "options": dataclasses.asdict(report.options),
        "data_root": report.data_root,
        "runs": [{"name": r.name, "run_dir": r.run_dir, "model": r.model, "classes": list(r.classes)}
                 for r in report.runs],
        "crops": {"scored": list(plan.scored), "tuning": list(plan.tuning), "scored_spec": plan.scored_spec,
                  "tuning_spec": plan.tuning_spec, "truth_labels": report.truth},
        "tuning_metric": report.options.tuning_era,
        "bias": list(plan.notes),
        "scoring_rule": {"stages_1_to_4": PLAIN_RULE, "stage_5": "cellseg postprocess (tuned parameters)"},
        "best_single": report.best_single,
        "stages": [_stage_json(s) for s in report.stages],
        "singles": [_stage_json(s) for s in report.singles],
        "ensemble_weights": report.weights,
        "postprocess_params": report.params,
        "timings": report.timings,
        "figures": [Path(f).name for f in report.figures],
    })


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_reports(report: Report, root: Path) -> tuple[Path, Path]:
    """Write report.md and report.json into `root` (atomically); returns their paths."""
    md, js = root / "report.md", root / "report.json"
    _write(md, markdown(report))
    _write(js, json.dumps(to_json(report), indent=2, allow_nan=False) + "\n")
    return md, js
