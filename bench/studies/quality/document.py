"""The result files of the report step: `quality.md` (tables ready for docs/quality.md), `quality.json`
(everything) and `quality_curves.png`, from the curves, the schedule and `cellseg report`'s report.json."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.studies.quality.curves import LEARNING_RISE, PLATEAU_TOLERANCE, Curve, curves_figure
from cellseg.eval.eras import ERAS  # every registered era: the report scores each one


def fmt(value: Any) -> str:
    """A score with 4 decimals ("n/a" for a missing or NaN one)."""
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(row) + " |" for row in rows), ""]


def _overall(row: Mapping[str, Any], era: str, part: str = "overall") -> Any:
    return row.get("scores", {}).get(era, {}).get(part)


def ablation_table(report: Mapping[str, Any]) -> list[str]:
    """Stages 1-5 of `cellseg report`, both eras: overall (instance, semantic)."""
    rows = [[s["title"], *(f"{fmt(_overall(s, e))} ({fmt(_overall(s, e, 'instance'))}, "
                            f"{fmt(_overall(s, e, 'semantic'))})" for e in ERAS)] for s in report["stages"]]
    return _table(["stage", *(f"{e} overall (instance, semantic)" for e in ERAS)], rows)


def singles_table(report: Mapping[str, Any], curves: Mapping[str, Curve]) -> list[str]:
    """Each architecture alone on the test crops, beside its training: steps, throughput, its curve's end."""
    rows = []
    for s in report["singles"]:
        arch = s["key"].removeprefix("single_")
        c = curves.get(arch)
        rows.append([arch, *(fmt(_overall(s, e)) for e in ERAS),
                     str(c.steps) if c else "", f"{c.samples_per_s:.1f}" if c else "", _percent(c),
                     fmt(c.points[-1]["overall"]) if c else "", _plateau_text(c)])
    return _table(["architecture", *(f"{e} test" for e in ERAS), "steps", "samples/s", "waiting for data",
                   "last validation", "plateaued"], rows)


def _percent(curve: Curve | None) -> str:
    """The run's median share of time waiting for batches ("" when not logged)."""
    return "" if curve is None or math.isnan(curve.data_wait_frac) else f"{100 * curve.data_wait_frac:.0f} %"


def progress_line(curve: Curve) -> str:
    """A run's training so far in one line (the train step's console): validations, steps, samples/s, loader
    wait, where its data lived."""
    scores = " ".join(f"{p['overall']:.3f}" for p in curve.points)
    wait = f", waiting for data {_percent(curve)}" if _percent(curve) else ""
    placement = f", data {curve.data_placement}" if curve.data_placement else ""
    return (f"validation {scores} (last at {curve.points[-1]['train_min']:.1f} min); {curve.steps} steps, "
            f"{curve.samples_per_s:.1f} samples/s{wait}{placement}")


def _plateau_text(curve: Curve | None) -> str:
    if curve is None:
        return ""
    return "**no: not learning**" if curve.learning is False else {True: "yes", False: "**no**",
                                                                      None: "n/a"}[curve.plateaued]


def curve_table(curves: Sequence[Curve], val_every_min: float) -> list[str]:
    """Validation overall score per architecture at each validation period (a validation runs at the first step
    after its period's minute, so `train_min` lies within a step of k × `val_every_min`)."""
    def period(minutes: float) -> int:
        return math.floor(minutes / val_every_min + 1e-6)

    periods = sorted({period(p["train_min"]) for c in curves for p in c.points})
    rows = []
    for c in curves:
        at = {period(p["train_min"]): p["overall"] for p in c.points}  # the later validation of a period wins
        rows.append([c.arch, *(fmt(at.get(k)) for k in periods), _plateau_text(c)])
    return _table(["architecture", *(f"{k * val_every_min:g} min" for k in periods), "plateaued"], rows)


def class_table(report: Mapping[str, Any], era: str) -> list[str]:
    """Per-class test scores of every architecture alone and of the final stage (post-processed ensemble)."""
    columns = [(s["key"].removeprefix("single_"), s) for s in report["singles"]] + [("ensemble (5)",
                                                                                    report["stages"][-1])]
    classes = sorted({k for _, s in columns for k in s.get("scores", {}).get(era, {}).get("classes", {})})
    rows = [[name, *(fmt(s["scores"][era]["classes"].get(name)) for _, s in columns)] for name in classes]
    return _table(["class", *(n for n, _ in columns)], rows)


def class_weights(report: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Stage 3's fitted weights per scored class: {class: {"weights": {architecture: weight}, "chosen": the fit's
    choice (`cellseg.infer.ensemble_fit`)}} from report.json's `ensemble_weights` (boundary channels left out:
    they take their class's weights)."""
    doc = report.get("ensemble_weights") or {}
    names = [s["key"].removeprefix("single_") for s in report["singles"]]
    scored = {c for s in report["singles"] for e in ERAS for c in s.get("scores", {}).get(e, {}).get("classes", {})}
    fit = doc.get("fit", {}).get("classes", {})
    return {c: {"weights": dict(zip(names, w, strict=True)), "chosen": fit.get(c, {}).get("chosen", doc.get("method"))}
            for c, w in sorted(doc.get("channels", {}).items()) if c in scored}


def weights_table(report: Mapping[str, Any]) -> list[str]:
    """`class_weights` as a table (blank: weight 0), then the runs stage 4 did not predict with TTA (weight 0 for
    every class; the report's `stage_switches`)."""
    weights = class_weights(report)
    if not weights:
        return []
    names = list(next(iter(weights.values()))["weights"])
    rows = [[c, *(f"{w:.2f}" if w > 0 else "" for w in e["weights"].values()), str(e["chosen"])]
            for c, e in weights.items()]
    idle = (report.get("stage_switches") or {}).get("tta", {}).get("without_weight", [])
    return [*_table(["class", *names, "chosen"], rows),
            f"Weight 0 for every class (not predicted with TTA in stage 4): {', '.join(idle) or 'none'}.", ""]


def switch_line(report: Mapping[str, Any]) -> list[str]:
    """How many classes each per-class stage switch turned off on the validation crops (the report's
    `stage_switches`; `cellseg.decide.switches`), as one line; empty without switches. The stage titles are the
    report's own (`SWITCHED`, imported here: its module imports torch)."""
    from cellseg.report.render import SWITCHED, other_eras

    switches = report.get("stage_switches") or {}
    parts = []
    for key, title in SWITCHED.items():
        if key in switches:
            switch = switches[key]
            kept = f" (they keep {switch['best_single']}'s prediction)" if switch.get("best_single") else ""
            others = "".join(f" ({len(own['off'])} in {era}'s column)"
                             for era, own in other_eras(switch, switches["era"]))
            parts.append(f"{title} for {len(switch['off'])} of {len(switch['classes'])} classes{kept}{others}")
    return [f"Switched off per class on the validation crops: {'; '.join(parts)}.", ""] if parts else []


def schedule_table(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """When each job ran (minutes after the first start), on which GPU and cores, and how it ended."""
    if not events:
        return []
    t0 = min(e["time"] for e in events)
    rows, open_ = [], {}
    for e in events:
        if e["event"] == "start":
            open_[e["arch"]] = e
        elif e["event"] == "exit" and e["arch"] in open_:
            s = open_.pop(e["arch"])
            rows.append([e["arch"], f"{(s['time'] - t0) / 60:.1f}", f"{(e['time'] - t0) / 60:.1f}",
                         str(s.get("gpu", "—")), ",".join(map(str, s.get("cpus", []))), e.get("outcome", "")])
    return _table(["job", "start (min)", "end (min)", "GPU", "cores", "outcome"], rows)


def startup_table(curves: Sequence[Curve]) -> list[str]:
    """Where each job's time went besides training: seconds to its first optimizer step (the set-up's phases, the
    first step with its lazy compilation) and per validation (the training clock pauses for it); and where its
    training data lived (resident on the GPU or host, or streamed: "off")."""
    rows = []
    for c in curves:
        up, setup = c.startup, c.startup.get("setup", {})
        val = [p["val_s"] for p in c.points if not math.isnan(p.get("val_s", math.nan))]
        total = up.get("process_to_first_step") or up.get("job_to_first_step")
        rows.append([c.arch, _seconds(total), ", ".join(f"{k} {v:.1f}" for k, v in setup.items()) or "—",
                     _seconds(up.get("first_step")), _seconds(statistics.mean(val) if val else None),
                     c.data_placement or "—"])
    return _table(["job", "to first step (s)", "set-up phases (s)", "first step (s)", "per validation (s)",
                   "training data"], rows)


def timings_table(calls: Sequence[Sequence[Mapping[str, Any]]]) -> list[str]:
    """`cellseg report`'s seconds per step in each of its calls (`timings.json`: one list of rows per call; a call
    cut by the step limit lacks the step it was in and those after it; "r": the step found its outputs made)."""
    steps = list(dict.fromkeys(t["step"] for rows in calls for t in rows))
    by_call = [{t["step"]: t for t in rows} for rows in calls]

    def cell(t: Mapping[str, Any] | None) -> str:
        return "—" if t is None else f"{t['seconds']:.1f}" + (" r" if t.get("resumed") else "")

    rows = [[step, *(cell(c.get(step)) for c in by_call)] for step in steps]
    rows.append(["**total**", *(f"**{sum(t['seconds'] for t in c.values()):.1f}**" for c in by_call)])
    return _table(["report step", *(f"call {i} (s)" for i in range(1, len(calls) + 1))], rows)


def markdown(doc: Mapping[str, Any], curves: Sequence[Curve], report: Mapping[str, Any]) -> str:
    """quality.md: the tables of one benchmark run."""
    s, settings = doc["setup"], doc["settings"]
    by_arch = {c.arch: c for c in curves}
    sharing = "as clients of CUDA MPS" if settings.get("mps") else "time-sliced"
    lines = [f"Results of `bench/studies/quality.py` ({doc['created']}, {doc['device']}, {settings['gpus']} GPU(s), the "
             f"jobs on a GPU {sharing}): {len(curves)} architectures, "
             f"{s['budget_min']:g} minutes of training clock each, validated every {s['val_every_min']:g} minutes "
             f"({s['val_metric']} metric); data: preset `{s['preset']}` seed {s['seed']}; "
             f"{len(report['crops']['scored'])} test crops scored, tuned on {len(report['crops']['tuning'])} "
             f"validation crops ({', '.join(report['crops']['tuning'])}).", "",
             "**Ablation** (test crops; ensemble weights and post-processing tuned on the validation crops):", "",
             *ablation_table(report), *switch_line(report),
             "**Single models** (test crops, no TTA, threshold 0.5) and their training:", "",
             *singles_table(report, by_arch),
             f"**Time to score** (validation overall score by minute of training clock; plateaued: the last two "
             f"within {100 * PLATEAU_TOLERANCE:g} %; not learning: no later validation "
             f"{100 * LEARNING_RISE:g} % above the first):", "", *curve_table(curves, s["val_every_min"]),
             "![time to score](quality_curves.png)", "",
             "**Start-up and validation** (each job's process until its first optimizer step, and its validations):",
             "", *startup_table(curves)]
    lines += ["**Ensemble weights** (stage 3, fitted per class on the validation crops):", "", *weights_table(report)]
    for era in reversed(ERAS):
        lines += [f"**Per-class test scores, {era} metric** (single models without TTA; the last column is stage 5):",
                  "", *class_table(report, era)]
    lines += ["**Schedule**:", "", *schedule_table(doc["schedule"]),
              "**Report cost** (`cellseg report`, seconds per step in each call; r: resumed, its outputs found "
              "made; —: not reached, the call cut by the step limit or the step done before):", "",
              *timings_table(doc["report_timings"])]
    return "\n".join(lines)


def write_outputs(out: Path, doc: dict[str, Any], curves: Sequence[Curve], report: Mapping[str, Any],
                  timings: Sequence[Sequence[Mapping[str, Any]]] | None = None) -> list[Path]:
    """quality.md, quality.json and quality_curves.png into `out`; returns their paths. `timings`: the report's
    seconds per step in each of its calls (its `timings.json`; default: report.json's, the last call's only)."""
    from cellseg.viz.figure import save_png

    out.mkdir(parents=True, exist_ok=True)
    doc = {**doc, "curves": [c.to_json() for c in curves],
           "ablation": [{"title": s["title"], **{e: {k: _overall(s, e, k) for k in ("overall", "instance", "semantic")}
                                                  for e in ERAS}} for s in report["stages"]],
           "singles": {s["key"].removeprefix("single_"): {e: {"overall": _overall(s, e),
                                                               "classes": s["scores"][e]["classes"]} for e in ERAS}
                       for s in report["singles"]},
           "final_classes": {e: report["stages"][-1]["scores"][e]["classes"] for e in ERAS},
           "ensemble_weights": class_weights(report),
           "report_timings": list(timings) if timings else [report.get("timings", [])], "crops": report["crops"]}
    paths = [out / "quality.md", out / "quality.json", out / "quality_curves.png"]
    paths[0].write_text(markdown(doc, curves, report) + "\n")
    paths[1].write_text(json.dumps(doc, indent=1, default=str) + "\n")
    save_png(curves_figure(curves, budget_min=doc["setup"]["budget_min"]), paths[2], overwrite=True)
    return paths
