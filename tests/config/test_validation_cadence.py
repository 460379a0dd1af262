"""Config check: a validation cadence in minutes must fit inside the training budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from cellseg.config import load_run_config

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke" / "unet_3d.yaml"


@pytest.mark.parametrize("val_every", ["5", "8"])
def test_a_budget_too_small_for_one_validation_names_both_keys(tmp_path, val_every):
    with pytest.raises(ValueError, match=rf"train\.val_every_min={float(val_every)} must be shorter than "
                                         r"train\.time_budget_min=5\.0"):
        load_run_config(SMOKE, [f"run_dir={tmp_path}", "train.time_budget_min=5", f"train.val_every_min={val_every}"])


def test_a_cadence_inside_the_budget_or_either_key_alone_loads(tmp_path):
    cfg = load_run_config(SMOKE, [f"run_dir={tmp_path}", "train.time_budget_min=5", "train.val_every_min=4.9"])
    assert (cfg.train.val_every_min, cfg.train.time_budget_min) == (4.9, 5.0)
    assert load_run_config(SMOKE, [f"run_dir={tmp_path}", "train.val_every_min=60"]).train.time_budget_min is None
    assert load_run_config(SMOKE, [f"run_dir={tmp_path}", "train.time_budget_min=1"]).train.val_every_min is None
