"""Validation decodes and scores its classes in worker processes (`val.workers`): the same scores as in the
training process, one pool per training run reused by every validation, nothing left running afterwards."""

from __future__ import annotations

import json
import logging
import multiprocessing
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cellseg.config import load_run_config
from cellseg.data.loader import make_split, open_crops
from cellseg.models.registry import build_model
from cellseg.train.trainer import train
from cellseg.train.validate import run_validation, validation_workers
from cellseg.train.valpool import ValidationPool

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke" / "unet_3d.yaml"
FAST = ["train.max_steps=2", "train.val_every=1", "train.log_every=2", "data.patch_shape_vox=[16,16,16]"]


def _scores(result: dict) -> str:
    """Everything validation reports but its duration, as JSON (NaN included: compared as text)."""
    return json.dumps({k: v for k, v in result.items() if k != "seconds"})


def _validation(root: Path, tmp_path: Path, *overrides: str):
    """Config, validation crops and a (seeded, untrained) model of the smoke run; the model's grid is 16 nm,
    coarser than the labels, so that instance classes are decoded on the model's grid and refined on theirs."""
    cfg = load_run_config(SMOKE, [f"data.root={root}", f"run_dir={tmp_path / 'run'}", "val.max_crops=null",
                                  "val.report_crops=true", "data.voxel_size_nm=[16,16,16]",
                                  "data.patch_shape_vox=[16,16,16]", *overrides])
    crops = open_crops([e for e in make_split(cfg.data) if e.split == "validate"], cfg.data)
    torch.manual_seed(0)
    model = build_model(cfg.model.name, 1, cfg.data.num_target_channels, preset=cfg.model.preset)
    return cfg, crops, model


def test_workers_score_exactly_as_the_training_process_in_one_reused_pool(tiny_synth_root, tmp_path):
    cfg, crops, model = _validation(tiny_synth_root, tmp_path, "val.workers=0")
    assert {c.entry.role for c in crops} == {"tuning", "report"}
    sequential = run_validation(model, crops, cfg, device=torch.device("cpu"), precision="fp32")
    assert multiprocessing.active_children() == []  # val.workers=0: no process at all
    voxel_sizes = {tuple(s["voxel_size"]) for c in sequential["crop_scores"].values() for s in c.values()}
    assert voxel_sizes and all(v[0] < 16 for v in voxel_sizes)  # scored on the (finer) label grids
    assert any(s.get("tp", 0) + s.get("fp", 0) > 0 for c in sequential["crop_scores"].values() for s in c.values())

    cfg, crops, model = _validation(tiny_synth_root, tmp_path, "val.workers=2")
    with ValidationPool(validation_workers(cfg, crops)) as pool:
        first = run_validation(model, crops, cfg, device=torch.device("cpu"), precision="fp32", pool=pool)
        workers = {p.pid for p in multiprocessing.active_children()}
        second = run_validation(model, crops, cfg, device=torch.device("cpu"), precision="fp32", pool=pool)
        assert len(workers) == 2 and {p.pid for p in multiprocessing.active_children()} == workers  # reused
    assert multiprocessing.active_children() == []  # closed
    assert _scores(first) == _scores(sequential) == _scores(second)
    assert first["report"]["crop_scores"] and first["crop_scores"]


def test_a_training_run_starts_its_validation_workers_once_and_ends_them(tiny_synth_root, tmp_path, caplog):
    cfg = load_run_config(SMOKE, [f"data.root={tiny_synth_root}", f"run_dir={tmp_path / 'run'}", *FAST,
                                  "val.workers=1"])
    with caplog.at_level(logging.INFO, logger="cellseg.train.valpool"):
        train(cfg)
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val" in r] == [1, 2]  # two validations ...
    assert caplog.text.count("validation: 1 worker processes started") == 1  # ... one pool
    assert multiprocessing.active_children() == []


def _crop(name: str, role: str, classes: int) -> SimpleNamespace:
    return SimpleNamespace(name=name, entry=SimpleNamespace(role=role), classes=tuple(f"c{i}" for i in range(classes)))


@pytest.mark.parametrize(("overrides", "expected"), [
    (["loader.num_workers=3"], 3),  # null: the loader's workers
    (["loader.num_workers=16"], 5),  # at most one per (crop, class): 2 + 3 tuning classes
    (["loader.num_workers=16", "val.report_crops=true"], 9),  # and the report crop's 4
    (["val.workers=2", "loader.num_workers=0"], 2),
    (["val.workers=0"], 0),
])
def test_validation_workers_default_to_the_loaders_and_are_capped_by_the_tasks(overrides, expected):
    cfg = load_run_config(SMOKE, ["val.max_crops=null", *overrides])
    crops = [_crop("crop1", "tuning", 2), _crop("crop2", "report", 4), _crop("crop3", "tuning", 3)]
    assert validation_workers(cfg, crops) == expected


@pytest.mark.parametrize(("value", "message"), [("-1", "val.workers=-1 must be an integer >= 0"),
                                              ("1.5", "val.workers: expected int"), ("many", "val.workers")])
def test_a_bad_worker_count_is_a_config_error_naming_the_key(value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_run_config(SMOKE, [f"val.workers={value}"])
