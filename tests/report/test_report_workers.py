"""`cellseg report`'s numbers do not depend on `--workers`, and every run's timings are on disk as each step ends.

One report on both test crops of `tiny_synth_root` (so that the bootstrap draws differ) scored with 2 processes,
then scored again with 1 (the stores are reused; the evaluations kept for resuming are removed first, so every
evaluation, switch and interval is recomputed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cellseg.report import ReportOptions, run_report
from cellseg.report.ablation import TIMINGS_FILE

VARYING = ("created", "options", "timings", "figures")  # what may differ between two runs of the same report


def _options(runs, out: Path, workers: int) -> ReportOptions:
    return ReportOptions(runs=tuple(str(r) for r in runs), out=str(out), crops="test", tune_crops="val", overlap=0.0,
                         slices=0, device="cpu", progress=False, workers=workers)


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in doc.items() if k not in VARYING}
    out["crops"] = {**out["crops"], "truth_labels": {c: sorted(v) for c, v in out["crops"]["truth_labels"].items()}}
    return out


def test_scores_switches_and_intervals_do_not_depend_on_the_workers(report_runs, tmp_path):
    out = tmp_path / "report"
    run_report(_options(report_runs, out, workers=2))
    doc = json.loads((out / "report.json").read_text())
    assert len(doc["crops"]["scored"]) == 2
    (steps,) = json.loads((out / TIMINGS_FILE).read_text())  # one run so far
    assert [t["step"] for t in steps] == [t["step"] for t in doc["timings"]]  # the figures too
    assert all(t["seconds"] >= 0 and not t["resumed"] for t in steps)

    for evaluation in (out / "stores" / "submissions").glob("*.json"):  # else read back (resuming)
        evaluation.unlink()
    run_report(_options(report_runs, out, workers=1))  # resumed: only the scoring and what follows run again
    redo = json.loads((out / "report.json").read_text())
    assert [t["resumed"] for t in redo["timings"] if t["step"][0].isdigit()] == [True] * 5
    assert json.loads((out / TIMINGS_FILE).read_text()) == [steps, redo["timings"]]  # both runs
    assert json.dumps(_comparable(redo), sort_keys=True) == json.dumps(_comparable(doc), sort_keys=True)


def test_the_stages_see_when_the_scoring_beside_them_is_done(tmp_path):
    # Stage 2's switch takes every scoring worker once the single models' scoring beside the stages has finished.
    from cellseg.decide.scoring import scoring_beside

    with scoring_beside([], ["2026"], workers=1, plain_processes=1) as scoring:
        scoring.all.result(timeout=60)
        assert scoring.first.done() and scoring.all.done()
