"""Every YAML under configs/ loads strictly into the schema (training runs and inference recipes), and resolved
configs round-trip."""

from pathlib import Path

import pytest

from cellseg.config import dump, load, load_run_config
from cellseg.config.jobs import (
    SECTIONS,
    DecideJob,
    EnsembleJob,
    PostprocessJob,
    PredictEnsembleJob,
    PredictJob,
    PredictVolumeJob,
    load_job,
)
from cellseg.config.load import from_dict, read_yaml
from cellseg.config.schema import ModelConfig, RunConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RUNNABLE = sorted([*CONFIGS.glob("experiments/**/*.yaml"), *CONFIGS.glob("smoke/*.yaml"),
                   *CONFIGS.glob("quality/[!_]*.yaml")])


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


RECIPES = sorted(p for d in ("infer", "ensemble", "postprocess", "decide") for p in (CONFIGS / d).glob("*.y*ml"))
JOBS = {  # the section that makes a recipe one for the command, and the keys a recipe leaves to the command line
    PredictJob: ("infer", ["run_dir=runs/unet_3d", "crops=val", "out=p.zarr"]),
    PredictEnsembleJob: ("ensemble", ["crops=test", "out=e.zarr"]),
    EnsembleJob: ("ensemble", ["out=e.zarr", "ensemble.members=[a.zarr, b.zarr]"]),  # stores, not run directories
    PostprocessJob: ("postprocess", ["predictions=e.zarr", "out=s.zarr"]),
    PredictVolumeJob: ("volume", ["dataset=jrc_hela-2", "out=v.zarr", "ensemble.members=[runs/unet_3d]"]),
    DecideJob: ("decide", ["runs=[runs/unet_3d, runs/unet_2d]", "out=decide"]),
}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_inference_recipes_load_and_round_trip(path, tmp_path):
    """Every recipe loads into each command it is for (with the sections of other commands left out), and the
    resolved config round-trips through the plain loader."""
    assert path.read_text().startswith("# "), f"{path}: start with a comment saying what the recipe is for"
    sections = set(read_yaml(path))
    assert sections <= set(SECTIONS), f"{path}: sections {sorted(sections - set(SECTIONS))} are not recipe sections"
    jobs = [cls for cls, (section, _) in JOBS.items() if section in sections]
    assert jobs, f"{path}: sets none of the sections {sorted(SECTIONS)}"
    for cls in jobs:
        job = load_job(cls, path, JOBS[cls][1])
        resolved = tmp_path / f"{cls.__name__}.yaml"
        resolved.write_text(dump(job))
        assert load(cls, resolved) == job
    assert len(RECIPES) >= 6
