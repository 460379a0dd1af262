"""configs/model/*.yaml and configs/experiments/*.yaml agree with the registry."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from cellseg.models import build_model, get_entry, list_models

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SEED_BATCH = {
    "unet_2d": 64,
    "unet_3d": 8,
    "resnet_2d": 48,
    "resnet_3d": 8,
    "swin_2d": 32,
    "swin_3d": 2,
    "vit_2d": 16,
    "vit_3d": 2,
}


@pytest.mark.parametrize("name", list_models())
def test_model_config_holds_exactly_the_default_params(name: str) -> None:
    config = yaml.safe_load((CONFIGS / "model" / f"{name}.yaml").read_text())
    assert config["model"]["name"] == name
    params = config["model"]["params"]
    defaults = dataclasses.asdict(get_entry(name).params_type())
    assert set(params) == set(defaults)
    with torch.device("meta"):
        model = build_model(name, 1, 2, **params)
    assert dataclasses.asdict(get_entry(name).params_type()) == model.spec.params


@pytest.mark.parametrize("name", list_models())
def test_experiment_preset_follows_the_seed_plan(name: str) -> None:
    config = yaml.safe_load((CONFIGS / "experiments" / f"{name}.yaml").read_text())
    assert f"../model/{name}.yaml" in config["include"]
    train, data = config["train"], config["data"]
    assert train["batch_size"] == SEED_BATCH[name]
    assert train["num_gpus"] == (4 if name.endswith("3d") else 2)
    assert train["precision"] == "bf16" and train["channels_last"] is True
    with torch.device("meta"):
        divisor = build_model(name, 1, 2).input_divisor
    patch = data["patch_shape_vox"][-len(divisor) :]
    assert all(size % step == 0 for size, step in zip(patch, divisor, strict=True))
    assert "# measured (H200" in (CONFIGS / "experiments" / f"{name}.yaml").read_text()  # the fit verdict
