"""Every YAML under configs/ loads strictly into the schema, and resolved configs round-trip."""

from pathlib import Path

import pytest

from cellseg.config import dump, load_run_config
from cellseg.config.load import from_dict, read_yaml
from cellseg.config.schema import ModelConfig, RunConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RUNNABLE = sorted([*CONFIGS.glob("experiments/**/*.yaml"), *CONFIGS.glob("smoke/*.yaml")])


@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: str(p.relative_to(CONFIGS).with_suffix("")))
def test_runnable_configs_load_and_round_trip(path, tmp_path):
    cfg = load_run_config(path)
    assert isinstance(cfg, RunConfig)
    resolved = tmp_path / "config.yaml"
    resolved.write_text(dump(cfg))
    assert load_run_config(resolved) == cfg


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("model/*.yaml")), ids=lambda p: p.stem)
def test_model_configs_are_model_sections(path):
    assert isinstance(from_dict(ModelConfig, read_yaml(path)["model"]), ModelConfig)
