"""The quality benchmark's `product` step: the report's decisions (WORK/report/decisions.json) taken through the
product commands on the same test crops, as a team takes the hidden ones, and scored against the report's stage 5.

    cellseg predict-ensemble --decisions WORK/report/decisions.json --crops test --out WORK/product/ens.zarr
    cellseg postprocess ... --decisions ... --metric ERA      (once per era)
    cellseg submit ... --truth WORK/report/truth.zarr ; cellseg evaluate ... --metric ERA

Writes OUT/quality_product.json: per era the submission's overall score, the report's stage 5 and the largest
difference of a class score between them (0 when the product path is the measured pipeline). Every command resumes
(stores keep their finished crops), so a step cut by the job's time limit is run again.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ERAS = ("2025", "2026")  # the eras the report's table shows; each gets its own decoding and submission


def _largest_difference(ours: dict[str, Any], theirs: dict[str, float]) -> float:
    """The largest |class score difference| between an evaluation's label scores and a stage's class scores."""
    worst = 0.0
    for name, score in theirs.items():
        entry = ours.get(name, {})
        value = entry.get("combined_score", entry.get("iou"))
        worst = max(worst, float("inf") if value is None or score is None else abs(float(value) - float(score)))
    return worst


def product(work: Path, out: Path, device: str, run: Callable[[Sequence[str], float], int | None], *,
            deadline: float) -> int:
    """Run the product path (module docstring); `run(cmd, timeout_s)` runs one command within what is left before
    `deadline` (time.monotonic()) and returns its exit code, None when cut. Returns 0, 75 when cut, or the failing
    command's code."""
    report = work / "report"
    decisions, truth = report / "decisions.json", report / "truth.zarr"
    if not decisions.is_file():
        raise FileNotFoundError(f"{decisions}: run the report step first (it writes the decisions)")
    here = work / "product"
    here.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "cellseg"]
    steps = [[*py, "predict-ensemble", "--decisions", str(decisions), "--crops", "test", "--out",
              str(here / "ens.zarr"), "--device", device]]
    for era in ERAS:
        seg, sub = here / f"seg_{era}.zarr", here / f"submission_{era}.zip"
        steps += [[*py, "postprocess", str(here / "ens.zarr"), "--decisions", str(decisions), "--metric", era,
                   "--out", str(seg), "--device", device],
                  # --allow-empty: a crop a short-trained model predicts nothing on is a score here, as in the
                  # report's stage 5 it is compared with, not a submission to stop
                  [*py, "submit", str(seg), "--truth", str(truth), "--out", str(sub), "--overwrite", "--allow-empty"],
                  [*py, "evaluate", str(sub), str(truth), "--metric", era, "--json", str(here / f"scores_{era}.json")]]
    started = time.monotonic()
    for cmd in steps:
        code = run(cmd, deadline - time.monotonic())
        if code is None:
            print(f"`{' '.join(cmd[2:4])}` was cut by the step limit: run the product step again", file=sys.stderr)
            return 75
        if code:
            print(f"`{' '.join(cmd[2:])}` failed (exit {code})", file=sys.stderr)
            return code
    stage5 = next(s for s in json.loads((report / "report.json").read_text())["stages"]
                  if s["key"] == "postprocess")["scores"]
    doc = {"seconds": round(time.monotonic() - started, 1), "eras": {}}
    for era in ERAS:
        ours = json.loads((here / f"scores_{era}.json").read_text())
        doc["eras"][era] = {"submission_overall": ours["overall_score"], "report_stage5_overall": stage5[era]["overall"],
                            "largest_class_difference": _largest_difference(ours["label_scores"],
                                                                            stage5[era]["classes"])}
    (out / "quality_product.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}/quality_product.json: " + "; ".join(
        f"{era} {e['submission_overall']:.4f} (report {e['report_stage5_overall']:.4f})" for era, e in doc["eras"].items()))
    return 0
