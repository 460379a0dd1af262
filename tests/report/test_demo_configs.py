"""The demo's run configs (`configs/demo/`, used by scripts/demo.sh): they load strictly, predict the same
classes (the demo ensembles them and `cellseg report` refuses runs with different classes), and their
patches fit their models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cellseg.config import load_run_config
from cellseg.models import build_model

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo"
RUNS = sorted(p for p in DEMO.glob("*.yaml") if not p.name.startswith("_"))
DEMO_SCRIPT_MODELS = ("unet_3d", "resnet_3d", "unet_2d")  # scripts/demo.sh's default DEMO_MODELS


def _load(path: Path):
    return load_run_config(path, ["data.root=/nonexistent/demo_root"])


def test_the_demo_script_models_have_configs():
    assert {p.stem for p in RUNS} >= set(DEMO_SCRIPT_MODELS)


def test_demo_runs_predict_the_same_classes():
    classes = {p.stem: tuple(_load(p).data.classes) for p in RUNS}
    assert len(set(classes.values())) == 1, classes


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.stem)
def test_demo_config_builds_its_model_on_its_patch(path):
    cfg = _load(path)
    assert cfg.model.name == path.stem and cfg.train.compile == "off"
    model = build_model(cfg.model.name, 1, cfg.data.num_target_channels, preset=cfg.model.preset, **cfg.model.params)
    patch = cfg.data.patch_shape_vox
    x = torch.zeros((1, 1, *(patch[1:] if cfg.data.is_2d else patch)))
    with torch.inference_mode():
        assert model.eval()(x).shape[1] == cfg.data.num_target_channels
