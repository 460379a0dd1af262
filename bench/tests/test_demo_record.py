"""bench/demo_record: the demo's record from its output folder (timings, ablation rows, the product path's check)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.demo_record import record


def _out(tmp_path: Path, submitted: float) -> Path:
    out = tmp_path / "demo"
    (out / "report").mkdir(parents=True)
    (out / "timings.txt").write_text("     0.2 s  set-up\n   249.0 s  train unet_3d (configs/demo/)\n"
                                     "   709.3 s  total\n")
    scores = {era: {"overall": 0.5, "interval": {"overall": [0.4, 0.6]}, "classes": {"mito": 0.7, "er": 0.3}}
              for era in ("2025", "2026")}
    report = {"stages": [{"key": "postprocess", "title": "5.", "scores": scores}], "best_single": {"2026": "a"},
              "stage_switches": {"era": "2026", "tta": {"off": ["er"], "classes": {}}}, "crops": {"tuning": ["crop1"]}}
    (out / "report" / "report.json").write_text(json.dumps(report))
    for era in ("2025", "2026"):
        labels = {"mito": {"combined_score": submitted}, "er": {"iou": 0.3}}
        (out / f"scores_{era}.json").write_text(json.dumps({"label_scores": labels}))
    return out


def test_the_record_says_whether_the_submissions_scored_the_reports_stage_5(tmp_path):
    doc = record(_out(tmp_path, 0.7))
    assert doc["timings_s"] == {"setup": 0.2, "train": 249.0, "total": 709.3}
    assert doc["stages"][0]["2026"] == {"overall": 0.5, "interval": [0.4, 0.6], "change": None}
    assert doc["product_path"]["equal"] and doc["switched_off"] == {"tta": ["er"]}
    assert not record(_out(tmp_path / "b", 0.69))["product_path"]["equal"]


def test_an_unknown_demo_step_is_named(tmp_path):
    out = _out(tmp_path, 0.7)
    (out / "timings.txt").write_text("   1.0 s  something new\n")
    with pytest.raises(KeyError, match="something new"):
        record(out)
