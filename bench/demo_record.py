"""The record of one `bash scripts/demo.sh OUT` run: its stage timings, the ablation table its report printed, and
whether each era's submission (the product path: `decide` → `predict-ensemble --decisions` → `postprocess
--decisions` → `submit`) scored what the report's stage 5 scored, class by class. docs/demo.md quotes it.

    bash scripts/demo.sh /tmp/demo && python -m bench.demo_record /tmp/demo    # → bench/results/demo_cpu.json

Reads OUT/timings.txt, OUT/report/report.json and OUT/scores_<era>.json; nothing is measured here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
from pathlib import Path
from typing import Any

from bench.record import record_stem

ERAS = ("2025", "2026")  # the eras demo.sh submits for
TIMING = re.compile(r"^\s*(?P<seconds>[\d.]+) s  (?P<step>.+)$")


# demo.sh's stage titles (their beginnings) → the record's keys
STEPS = {"set-up": "setup", "synthetic dataset": "data", "train": "train", "predict the validation": "predict_members",
         "decide": "decide", "predict the test crops as decided": "predict_decided", "post-process": "postprocess",
         "submissions": "submit", "validate": "validate", "leaderboard": "score", "ablation report": "report",
         "the submissions against": "check", "total": "total"}


def timings(out: Path) -> dict[str, float]:
    """Step (`STEPS`' keys) → seconds, as demo.sh wrote them (OUT/timings.txt).

    Raises:
        KeyError: a step this record does not know (demo.sh changed: add it to `STEPS`).
    """
    rows = {}
    for line in (out / "timings.txt").read_text().splitlines():
        m = TIMING.match(line)
        if m:
            key = next((k for title, k in STEPS.items() if m["step"].startswith(title)), None)
            if key is None:
                raise KeyError(f"{out / 'timings.txt'}: unknown demo step {m['step']!r}")
            rows[key] = float(m["seconds"])
    return rows


def product_path(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """Era → the largest difference between a class's score in the submission and in the report's stage 5."""
    stage5 = next(s for s in report["stages"] if s["key"] == "postprocess")["scores"]
    diffs = {}
    for era in ERAS:
        ours = json.loads((out / f"scores_{era}.json").read_text())["label_scores"]
        worst = 0.0
        for name, theirs in stage5[era]["classes"].items():
            key = "combined_score" if "combined_score" in ours[name] else "iou"
            worst = max(worst, abs(float(ours[name][key]) - float(theirs)))
        diffs[era] = worst
    return {"max_class_difference": diffs, "equal": all(math.isclose(v, 0.0, abs_tol=1e-9) for v in diffs.values())}


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def record(out: Path) -> dict[str, Any]:
    """The demo's record (module docstring)."""
    report = json.loads((out / "report" / "report.json").read_text())
    stages = []
    for s in report["stages"]:
        row = {"key": s["key"], "title": s["title"]}
        for era in ERAS:
            scores = s["scores"][era]
            row[era] = {"overall": scores["overall"], "interval": scores["interval"]["overall"],
                        "change": (scores.get("change") or {}).get("overall")}
        stages.append(row)
    return {"benchmark": "demo", "date": datetime.date.today().isoformat(), "machine": cpu_name(), "cores": len(os.sched_getaffinity(0)), "timings_s": timings(out), "stages": stages,
            "best_single": report["best_single"], "switched_off": {k: v["off"] for k, v in
                                                                   report["stage_switches"].items() if "off" in v},
            "product_path": product_path(out, report), "tuning_crops": report["crops"]["tuning"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the demo's OUT_DIR")
    args = parser.parse_args(argv)
    path = record_stem("demo", cpu=True).with_suffix(".json")
    doc = record(args.out)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {path}: product path {'equal to' if doc['product_path']['equal'] else 'DIFFERENT from'} the "
          "report's stage 5")
    return 0 if doc["product_path"]["equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
