"""Validation during training ranks checkpoints on the tuning crops, in decision mode, by a score that is
defined for the classes trained, and says which score ranked."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from cellseg.config import load_run_config
from cellseg.train.trainer import train
from cellseg.train.validate import validation_sets

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke" / "unet_3d.yaml"
FAST = ["train.max_steps=2", "train.val_every=2", "train.log_every=2", "data.patch_shape_vox=[16,16,16]"]


def _val_records(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["val"] for r in lines if "val" in r]


def _crop(name: str, role: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, entry=SimpleNamespace(role=role))


def test_validation_sets_split_by_role_and_need_a_tuning_crop():
    crops = [_crop("crop1", "tuning"), _crop("crop2", "report"), _crop("crop3", ""), _crop("crop4", "report")]
    tuning, report = validation_sets(crops)
    assert [c.name for c in tuning] == ["crop1", "crop3"] and [c.name for c in report] == ["crop2", "crop4"]
    assert [c.name for c in validation_sets(crops, 1)[0]] == ["crop1"]
    assert validation_sets([]) == ([], [])
    with pytest.raises(ValueError, match="no tuning crop among the validation crops"):
        validation_sets([_crop("crop2", "report")])


def test_checkpoints_are_ranked_on_tuning_crops_in_decision_mode(tiny_synth_root, tmp_path):
    run = tmp_path / "run"
    cfg = load_run_config(SMOKE, [f"data.root={tiny_synth_root}", f"run_dir={run}", *FAST, "val.max_crops=null",
                                  "val.report_crops=true"])
    train(cfg)
    (val,) = _val_records(run)
    roles = dict(line.split(",") for line in (run / "validation_roles.csv").read_text().split()[1:])
    assert set(val["crops"]["tuning"]) == {c for c, r in roles.items() if r == "tuning"}
    assert set(val["crops"]["report"]) == {c for c, r in roles.items() if r == "report"} != set()
    assert set(val["crop_scores"]) == set(val["crops"]["tuning"])  # report crops never rank ...
    assert set(val["report"]["crop_scores"]) == set(val["crops"]["report"])  # ... they are logged apart
    assert val["ranked_by"] == "overall_score" and isinstance(val["skipped_crops"], int)
    assert val["grid"] == cfg.val.grid and val["seconds"] > 0
    assert json.loads((run / "checkpoints" / "index.json").read_text()) == {"2": val["ranking_score"]}
    ranking = json.loads((run / "checkpoints" / "ranking.json").read_text())
    assert ranking["ranked_by"] == "overall_score" and ranking["crops"] == val["crops"]["tuning"]


def test_instance_classes_only_under_2025_rank_on_the_instance_mean(tiny_synth_root, tmp_path, caplog):
    run = tmp_path / "run"
    cfg = load_run_config(SMOKE, [f"data.root={tiny_synth_root}", f"run_dir={run}", *FAST,
                                  "data.classes=[mito,nuc]", "val.metric='2025'"])
    with caplog.at_level(logging.WARNING, logger="cellseg.train.validate"):
        train(cfg)
    (val,) = _val_records(run)
    assert val["overall_score"] is None or math.isnan(val["overall_score"])  # 2025: no semantic class
    assert val["ranked_by"] == "overall_instance_score"
    # the ranking is the instance mean over the crops with each class's foreground (`cellseg.eval.presence`)
    assert set(val["positive_crops"]) == {"mito", "nuc"} and val["uninformed_classes"] == [
        c for c, n in val["positive_crops"].items() if n == 0]
    if not val["uninformed_classes"] and all(n == len(val["crop_scores"]) for n in val["positive_crops"].values()):
        assert val["ranking_score"] == val["overall_instance_score"]
    assert json.loads((run / "checkpoints" / "ranking.json").read_text())["ranked_by"] == "overall_instance_score"
    assert (run / "checkpoints" / "best.pt").is_file()  # a NaN overall score would never have been kept
    assert "only instance classes are scored" in caplog.text


def test_a_split_without_tuning_crops_is_refused_before_training(tiny_synth_root, tmp_path):
    split = tmp_path / "split" / "datasplit.csv"
    split.parent.mkdir()
    split.write_text((tiny_synth_root / "datasplit.csv").read_text())
    (split.parent / "validation_roles.csv").write_text("crop_name,role\ncrop2,report\ncrop3,report\n")
    cfg = load_run_config(SMOKE, [f"data.root={tiny_synth_root}", f"run_dir={tmp_path / 'run'}", *FAST,
                                  f"data.datasplit={split}"])
    with pytest.raises(ValueError, match="no tuning crop among the validation crops"):
        train(cfg)
    assert not (tmp_path / "run" / "checkpoints" / "last.pt").exists()
