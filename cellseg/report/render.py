"""Rendering a `Report`: `report.md` (header with the crops used for what and the biases, the ablation table,
single models, per-class tables per era, timings), `report.json` (everything, with each evaluation's full
document) and the table printed on the console. Every table names its metric era; scores of the two eras are
not comparable. Every overall number carries its 95 % crop-bootstrap interval in brackets, every change its
paired interval ("within noise" when it holds 0), and every era the number of crops it skipped
(`cellseg.decide.bootstrap`, `cellseg.decide.ranking`). Non-finite scores (the 2025 era's NaN overall when
a kind of class is absent) read "n/a" / null.
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
from cellseg.decide.bootstrap import DRAWS, SEED, Interval, within_noise
from cellseg.decide.options import StageResult
from cellseg.decide.ranking import decision_overall, skipped_count
from cellseg.decide.scoring import PLAIN_RULE, EraScores
from cellseg.eval.eras import ERA_TITLES
from cellseg.eval.rules import is_scored_as_instance, nan_to_none
from cellseg.report.results import Report

FORMAT = "cellseg-ablation-report"
VERSION = 1


def fmt(value: float) -> str:
    """A score with 4 decimals, "n/a" for NaN."""
    return "n/a" if math.isnan(value) else f"{value:.4f}"


def _ci(value: float, iv: Interval | None) -> str:
    """A score and its interval: `0.7123 [0.650, 0.780]`."""
    if iv is None or math.isnan(value) or math.isnan(iv.low):
        return fmt(value)
    return f"{fmt(value)} [{iv.low:.3f}, {iv.high:.3f}]"


def _change(value: float, previous: float | None, iv: Interval | None) -> str:
    """A change against the row above, its paired interval, and "within noise" when that holds 0."""
    if previous is None or math.isnan(value) or math.isnan(previous):
        return "-"
    text = f"{value - previous:+.4f}"
    if iv is None or math.isnan(iv.low):
        return text
    return f"{text} [{iv.low:+.3f}, {iv.high:+.3f}]" + (" within noise" if within_noise(iv) else "")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _uncertainty(report: Report, era: str, kind: str) -> dict[str, Any] | None:
    return report.uncertainty.get(era, {}).get(kind)


def _intervals(report: Report, era: str, kind: str, i: int) -> dict[str, Interval]:
    u = _uncertainty(report, era, kind)
    return u["stages"][i] if u else {}


def ablation_table(report: Report) -> list[str]:
    """Rows = stages; per era: overall [interval], change against the row above [paired interval], instance and
    semantic parts [intervals], crops skipped."""
    eras = report.options.eras
    header = ["stage"] + [f"{e} {part}" for e in eras for part in ("overall [95% CI]", "change [95% CI]", "instance",
                                                                   "semantic", "skipped")]
    rows, previous = [], None
    for i, stage in enumerate(report.stages):
        row = [stage.title]
        for era in eras:
            s, iv = stage.scores[era], _intervals(report, era, "stages", i)
            u = _uncertainty(report, era, "stages")
            change = u["changes"][i]["overall"] if u and u["changes"][i] else None
            row += [_ci(s.overall, iv.get("overall")), _change(s.overall, previous[era] if previous else None, change),
                    _ci(s.instance, iv.get("instance")), _ci(s.semantic, iv.get("semantic")),
                    str(skipped_count(s.document))]
        rows.append(row)
        previous = {era: stage.scores[era].overall for era in eras}
    return _table(header, rows)


def singles_table(report: Report) -> list[str]:
    """One row per run (no TTA, threshold 0.5), the run chosen as best in each era in bold."""
    eras = report.options.eras
    header = ["run (model)"] + [f"{e} {part}" for e in eras for part in ("overall [95% CI]", "instance", "semantic",
                                                                         "skipped")]
    rows = []
    for i, s in enumerate(report.singles):
        name = s.key.removeprefix("single_")
        row = [s.title]
        for e in eras:
            iv = _intervals(report, e, "singles", i)
            overall = _ci(s.scores[e].overall, iv.get("overall"))
            row += [f"**{overall}**" if report.best_single.get(e) == name else overall,
                    _ci(s.scores[e].instance, iv.get("instance")), _ci(s.scores[e].semantic, iv.get("semantic")),
                    str(skipped_count(s.scores[e].document))]
        rows.append(row)
    return _table(header, rows)


def noise_note(report: Report) -> str:
    """How the brackets and the skipped counts are made, for the lines under the tables."""
    crops = len(next(iter(report.uncertainty.values()))["stages"]["crops"]) if report.uncertainty else 0
    text = (f"Brackets: 95 % intervals of {DRAWS} crop-bootstrap draws over the {crops} scored crops (seed {SEED}); "
            "a change's interval is a paired bootstrap against the row above, \"within noise\" when it holds 0. "
            "Skipped: (crop, label) pairs the era's combining left out for too many predicted objects (nothing "
            "in the official score; every decision counted them as their worst case).")
    if crops == 1:
        text += " With one scored crop every draw is that crop: the intervals are points and cannot show noise."
    return text


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


def crop_uses(report: Report) -> dict[str, str]:
    """What each set of crops was used for (report.md's header and report.json)."""
    era = ERA_TITLES[report.options.tuning_era]
    return {"scored": "every stage's scores and intervals",
            "tuning": f"the choice of the best single model (stage 1), the ensemble weights (stage 3), the "
                      f"post-processing parameters (stage 5) and the per-class switches of stages 2-5, each by "
                      f"the {era} in decision mode",
            "checkpoints": "each run's best.pt was chosen during training on its own tuning crops (its "
                           "validation_roles.csv), in decision mode"}


def _with_roles(report: Report, crops: Sequence[str]) -> str:
    roles = report.plan.roles
    return ", ".join(f"{c} ({roles[c]} crop)" if roles.get(c) else c for c in crops)


def header_lines(report: Report) -> list[str]:
    """What was compared, on which crops for what, how each stage is scored, and the biases."""
    opts, plan = report.options, report.plan
    classes = report.runs[0].classes
    instance = [c for c in classes if is_scored_as_instance(c)]
    semantic = [c for c in classes if not is_scored_as_instance(c)]
    scored = ", ".join(f"{c} ({len(report.truth.get(c, []))} labels)" for c in plan.scored)
    uses = crop_uses(report)
    lines = [
        "# Ablation: what each inference stage adds",
        "",
        f"cellseg {__version__}, {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}. "
        f"Data root `{report.data_root}`.",
        "",
        "Runs: " + "; ".join(f"**{r.name}** ({r.model}, `{r.run_dir}`)" for r in report.runs) + ".",
        "",
        f"- **Scored crops** (`--crops {plan.scored_spec}`): {scored}; used for {uses['scored']}.",
        f"- **Tuning crops** (`--tune-crops {plan.tuning_spec}`): {_with_roles(report, plan.tuning)}; used for "
        f"{uses['tuning']}.",
        f"- **Checkpoints**: {uses['checkpoints']}.",
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


def hierarchy_note(report: Report) -> list[str]:
    """The hierarchy options tuning tried (`cellseg.postprocess.hierarchy`), with the class scores on the tuning
    crops without → with them; empty when none was tried."""
    tried = {c: e for c, e in report.params.get("classes", {}).items() if e.get("hierarchy_on_score") is not None}
    items = [f"{c} {'**' + e['hierarchy'] + '** kept' if e.get('hierarchy') else 'off'} "
             f"({fmt(e['hierarchy_off_score'])} → {fmt(e['hierarchy_on_score'])})" for c, e in sorted(tried.items())]
    return [f"Hierarchy options of stage 5 (tuning crops, without → with): {'; '.join(items)}."] if items else []


SWITCHED = {"uniform": "2. uniform ensemble", "weighted": "3. weighted ensemble", "tta": "4. TTA",
            "postprocess": "5. post-processing"}


def switch_lines(report: Report) -> list[str]:
    """Which classes had a stage switched off (they keep the previous stage's prediction), with the class
    scores on the tuning crops that decided it."""
    if not report.switches:
        return []
    era = report.switches["era"]
    lines = ["## Stage switches", "",
             f"A stage that does not raise a class's {era} score on the tuning crops is switched off for that class, "
             "which keeps the previous stage's prediction (stage 2 is compared with the best single model chosen in "
             f"{era}, stage 3 with stage 2 as switched, stage 5 with the plain decoding of stage 4).", ""]
    rows = []
    for key, title in SWITCHED.items():
        if key not in report.switches:  # a report made before stage 3 was switched
            continue
        switch = report.switches[key]
        idle, best = switch.get("without_weight"), switch.get("best_single")
        lines.append(f"- **{title}**: off for {', '.join(switch['off']) or 'no class'}"
                     + (f" (they keep {best}'s prediction)" if best and switch["off"] else "") + "."
                     + (f" Not predicted with TTA (weight 0 for every class): {', '.join(idle)}." if idle else "")
                     + "".join(f" Switched in {other} for its column and submission: off for "
                               f"{', '.join(own['off']) or 'no class'}." for other, own in other_eras(switch, era)))
        rows += [[title, c, fmt(s["before"]), fmt(s["after"]), "on" if s["on"] else "**off**"]
                 for c, s in switch["classes"].items()]
    return [*lines, "", *_table(["stage", "class", "before (tuning)", "with the stage (tuning)", "switch"], rows)]


def other_eras(switch: Mapping[str, Any], era: str) -> list[tuple[str, Mapping[str, Any]]]:
    """The switches a stage made in eras other than the tuning era (stage 5's: `switch_postprocess`)."""
    return [(other, own) for other, own in (switch.get("eras") or {}).items() if other != era]


def markdown(report: Report) -> str:
    """The whole report.md."""
    lines = [*header_lines(report), "", "## Ablation", "", *ablation_table(report)]
    if report.switches:
        lines += ["", *switch_lines(report)]
    lines += ["", noise_note(report), *(["", *hierarchy_note(report)] if hierarchy_note(report) else []), "",
              "## Single models (no TTA, threshold 0.5; bold: the one chosen on the tuning crops in that era)", "",
              *singles_table(report)]
    tuned = report.options.tuning_era
    for era in report.options.eras:
        under = "" if era == tuned else (f"\n\nStages 1-4 were decided under the {ERA_TITLES[tuned]} and are scored "
                                         f"here under the {ERA_TITLES[era]}; stage 5's decoding was chosen for this era.")
        lines += ["", f"## Per class, {ERA_TITLES[era]}{under}", "", *class_table(report, era)]
    timing_rows = [[t["step"], f"{t['seconds']:.1f}", "resumed: earlier outputs reused" if t.get("resumed") else ""]
                   for t in report.timings]
    lines += ["", "## Timings", "", *_table(["step", "seconds", "note"], timing_rows)]
    if report.figures:
        lines += ["", "## Figures", ""] + [f"![{Path(f).stem}]({Path(f).name})" for f in report.figures]
    return "\n".join(lines) + "\n"


def console(report: Report) -> str:
    """The ablation table for the terminal, with the first bias note."""
    lines = [f"Ablation on {len(report.plan.scored)} scored crops ({_with_roles(report, report.plan.scored)}); "
             f"decisions made on {_with_roles(report, report.plan.tuning)}", "", *ablation_table(report)]
    switched = [f"{title} switched off for: {', '.join(report.switches[key]['off']) or 'no class'}"
                + "".join(f" ({other}: {', '.join(own['off']) or 'no class'})"
                          for other, own in other_eras(report.switches[key], report.switches["era"]))
                for key, title in SWITCHED.items() if key in report.switches]
    return "\n".join([*lines, *switched, "", noise_note(report), "", report.plan.notes[0]])


def _clean(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return nan_to_none(value)


def _era_json(report: Report, kind: str, i: int, era: str, s: EraScores) -> dict[str, Any]:
    doc: dict[str, Any] = {"metric_title": ERA_TITLES[era], "overall": s.overall, "instance": s.instance,
                           "semantic": s.semantic, "skipped_crops": skipped_count(s.document),
                           "decision_overall": decision_overall(s.document)}
    u = _uncertainty(report, era, kind)
    if u:
        doc["interval"] = {part: iv.to_json() for part, iv in u["stages"][i].items()}
        if kind == "stages" and u["changes"][i]:
            previous = report.stages[i - 1].scores[era]
            doc["change"] = {part: {"value": getattr(s, part) - getattr(previous, part), "interval": iv.to_json(),
                                    "within_noise": within_noise(iv)} for part, iv in u["changes"][i].items()}
    return {**doc, "classes": dict(s.classes), "evaluation": dict(s.document)}


def _stage_json(report: Report, kind: str, i: int, stage: StageResult) -> dict[str, Any]:
    return {"key": stage.key, "title": stage.title, "store": stage.store,
            "scores": {era: _era_json(report, kind, i, era, s) for era, s in stage.scores.items()}}


def _bootstrap_json(report: Report) -> dict[str, Any]:
    if not report.uncertainty:
        return {}
    u = next(iter(report.uncertainty.values()))["stages"]
    return {"unit": "scored crop", "draws": u["draws"], "seed": u["seed"], "level": u["level"], "crops": u["crops"],
            "paired_changes": True}


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
                  "tuning_spec": plan.tuning_spec, "roles": dict(plan.roles), "used_for": crop_uses(report),
                  "truth_labels": report.truth},
        "tuning_metric": report.options.tuning_era,
        "bias": list(plan.notes),
        "scoring_rule": {"stages_1_to_4": PLAIN_RULE, "stage_5": "cellseg postprocess (tuned parameters)"},
        "best_single": report.best_single,
        "best_single_choice": {era: {"chosen_on": "tuning crops", "combined": "decision mode", **choice}
                               for era, choice in report.best_single_choice.items()},
        "bootstrap": _bootstrap_json(report),
        "stages": [_stage_json(report, "stages", i, s) for i, s in enumerate(report.stages)],
        "singles": [_stage_json(report, "singles", i, s) for i, s in enumerate(report.singles)],
        "ensemble_weights": report.weights,
        "postprocess_params": report.params,
        "stage_switches": report.switches,
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
