"""The inference commands configured by recipe files: `cellseg predict|predict-ensemble|ensemble|postprocess CONFIG
key=value ...` on the tiny trained run gives what the option form gives; precedence, positional arguments, clear
one-line errors and `--print-config` round trips."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from cellseg.cli import main as cli
from cellseg.cli._recipe import split_args
from cellseg.config.jobs import EnsembleJob, PostprocessJob, PredictEnsembleJob, PredictJob, load_job
from cellseg.config.load import load
from cellseg.data.prediction_store import PredictionStore

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
NO_TTA, TTA8 = str(CONFIGS / "infer" / "no_tta.yaml"), str(CONFIGS / "infer" / "tta8.yaml")
FAST = ["infer.overlap=0", "infer.device=cpu"]  # one pass per tile with no_tta.yaml: seconds on the CPU


def assert_same_stores(got: Path, want: Path) -> None:
    a, b = PredictionStore.open(got), PredictionStore.open(want)
    assert a.channels == b.channels and a.completed() == b.completed() and a.completed()
    for crop in a.completed():
        assert a.grid(crop) == b.grid(crop)
        for channel in a.crop_channels(crop):
            np.testing.assert_array_equal(a.read(crop, channel), b.read(crop, channel), err_msg=f"{crop}/{channel}")


def printed_config(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert cli([*argv, "--print-config"]) == 0
    return capsys.readouterr().out


def error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one-line message of a command that must fail as a user error (exit 2)."""
    capsys.readouterr()
    assert cli(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


# ------------------------------------------------------------------------------------------ the four commands


def test_predict_from_a_recipe_equals_the_option_form(tiny_run, tmp_path, capsys):
    recipe, options = tmp_path / "recipe.zarr", tmp_path / "options.zarr"
    assert cli(["predict", NO_TTA, str(tiny_run), "crops=val", f"out={recipe}", *FAST]) == 0
    assert cli(["predict", str(tiny_run), "--crops", "val", "--out", str(options), "--tta", "1", "--overlap", "0",
                "--device", "cpu"]) == 0
    assert_same_stores(recipe, options)
    assert PredictionStore.open(recipe).provenance["tta"] == 1
    text = printed_config(capsys, "predict", NO_TTA, str(tiny_run), "crops=val", f"out={recipe}", *FAST)
    assert "tta: 1" in text and "overlap: 0.0" in text


def test_predict_ensemble_from_a_recipe_equals_the_option_form(tiny_run, tmp_path):
    twin = tmp_path / "twin"  # a second member: predict-ensemble refuses one run twice
    shutil.copytree(tiny_run, twin)
    recipe = tmp_path / "ens.yaml"
    recipe.write_text(f"# two members, 3:1\ninclude: [{NO_TTA}]\n"
                      f"ensemble: {{members: [{tiny_run}, {twin}], weights: [3, 1]}}\n"
                      "infer: {overlap: 0.0, device: cpu}\n")
    assert cli(["predict-ensemble", str(recipe), "crops=val", f"out={tmp_path / 'recipe.zarr'}"]) == 0
    assert cli(["predict-ensemble", str(tiny_run), str(twin), "--crops", "val", "--out", str(tmp_path / "options.zarr"),
                "--weights", "3,1", "--tta", "1", "--overlap", "0", "--device", "cpu"]) == 0
    assert_same_stores(tmp_path / "recipe.zarr", tmp_path / "options.zarr")
    saved = json.loads((tmp_path / "recipe.zarr" / "weights.json").read_text())
    assert saved["method"] == "explicit" and saved["channels"]["mito"] == [0.75, 0.25]


def test_ensemble_from_a_recipe_equals_the_option_form(val_stores, tiny_synth_root, tmp_path, capsys):
    best, last = map(str, val_stores)
    recipe = tmp_path / "fit.yaml"
    recipe.write_text("# fitted weights\nensemble:\n  weights: auto\n"
                      f"  fit: {{metric: '2025', shrink: 0.2, device: cpu, truth_root: {tiny_synth_root}}}\n")
    assert cli(["ensemble", str(recipe), best, last, f"out={tmp_path / 'recipe.zarr'}"]) == 0
    from_recipe = capsys.readouterr().out
    assert cli(["ensemble", best, last, "--out", str(tmp_path / "options.zarr"), "--weights", "auto", "--metric",
                "2025", "--shrink", "0.2", "--device", "cpu", "--truth", str(tiny_synth_root)]) == 0
    from_options = capsys.readouterr().out
    assert_same_stores(tmp_path / "recipe.zarr", tmp_path / "options.zarr")
    fitted = [json.loads((tmp_path / f"{name}.zarr" / "weights.json").read_text()) for name in ("recipe", "options")]
    assert fitted[0]["channels"] == fitted[1]["channels"] and fitted[0]["method"] == "auto"
    assert "2025 metric, shrink 0.2" in from_recipe
    assert from_recipe.replace("recipe.zarr", "options.zarr") == from_options


def test_postprocess_from_recipes_equals_the_option_form(val_stores, tiny_synth_root, tmp_path):
    pred = str(val_stores[0])
    default, tune = str(CONFIGS / "postprocess" / "default.yaml"), str(CONFIGS / "postprocess" / "tune_val_2026.yaml")
    assert cli(["postprocess", default, pred, f"out={tmp_path / 'recipe.zarr'}", "postprocess.device=cpu"]) == 0
    assert cli(["postprocess", pred, "--out", str(tmp_path / "options.zarr"), "--device", "cpu"]) == 0
    assert_same_stores(tmp_path / "recipe.zarr", tmp_path / "options.zarr")
    # Tuned on the validation crops for 2026, as the recipe says; the data root comes from the command line.
    crop = PredictionStore.open(pred).completed()[0]
    assert cli(["postprocess", tune, pred, "--out", str(tmp_path / "tuned.zarr"), f"postprocess.tune_on={tiny_synth_root}",
                "postprocess.device=cpu", f"postprocess.crops={crop.removeprefix('crop')}"]) == 0
    assert cli(["postprocess", pred, "--out", str(tmp_path / "tuned_options.zarr"), "--tune-on", str(tiny_synth_root),
                "--crops", crop, "--metric", "2026", "--device", "cpu"]) == 0
    assert_same_stores(tmp_path / "tuned.zarr", tmp_path / "tuned_options.zarr")
    params = [json.loads((tmp_path / f"{name}.zarr.params.json").read_text()) for name in ("tuned", "tuned_options")]
    assert params[0]["era"] == "2026" and params[0]["classes"] == params[1]["classes"]


# ------------------------------------------------------------------------- precedence and positional arguments


def test_precedence_defaults_config_options_overrides(capsys):
    def overlap(config: str, *extra: str) -> float:
        text = printed_config(capsys, "predict", config, "runs/a", "crops=val", "out=p.zarr", *extra)
        return yaml.safe_load(text)["infer"]["overlap"]

    test_set = str(CONFIGS / "infer" / "test_set.yaml")
    assert overlap(TTA8) == 0.5  # the default
    assert overlap(test_set) == 0.25  # CONFIG over the default
    assert overlap(test_set, "--overlap", "0.3") == 0.3  # an option over CONFIG
    assert overlap(test_set, "infer.overlap=0.1", "--overlap", "0.3") == 0.1  # key=value over the option


def test_positional_arguments_and_options_in_any_order(capsys):
    a = printed_config(capsys, "predict", "--out", "p.zarr", "runs/a", TTA8, "crops=test")
    b = printed_config(capsys, "predict", TTA8, "runs/a", "--crops", "test", "out=p.zarr")
    assert a == b and "run_dir: runs/a" in a
    # An ITEM replaces the config's value: stores given to `ensemble` replace the recipe's run directories.
    text = printed_config(capsys, "ensemble", str(CONFIGS / "ensemble" / "eight.yaml"), "a.zarr", "b.zarr",
                          "--out", "e.zarr")
    assert "members: [a.zarr, b.zarr]" in text and "infer" not in text  # the infer section is for other commands
    assert split_args(["r.yml", "runs/a=b", "infer.tta=1", "x.zarr"]) == ("r.yml", ["infer.tta=1"], ["runs/a=b", "x.zarr"])


@pytest.mark.parametrize(("cls", "argv"), [
    (PredictJob, ["predict", TTA8, "runs/a", "crops=12,34", "out=p.zarr", "--block", "128"]),
    (PredictEnsembleJob, ["predict-ensemble", str(CONFIGS / "ensemble" / "eight.yaml"), "--crops", "test",
                          "out=e.zarr", "ensemble.weights=w/weights.json"]),
    (EnsembleJob, ["ensemble", "a.zarr", "b.zarr", "--out", "e.zarr", "--weights", "2,1", "--crops", "3,crop4",
                   "--uint8"]),
    (PostprocessJob, ["postprocess", str(CONFIGS / "postprocess" / "tune_val_2026.yaml"), "p.zarr", "--out", "s.zarr",
                      "--crops", "1", "crop3"]),
], ids=lambda v: v.__name__ if isinstance(v, type) else "")
def test_print_config_round_trips(cls, argv, tmp_path, capsys):
    text = printed_config(capsys, *argv)
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(text)
    job = load(cls, resolved)  # the training configs' loader reads it back, strictly
    assert isinstance(job, cls) and printed_config(capsys, argv[0], str(resolved)) == text
    assert load_job(cls, resolved) == job


# ------------------------------------------------------------------------------------------------- errors


def test_user_mistakes_are_one_clear_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the relative outputs below would land here
    eight = str(CONFIGS / "ensemble" / "eight.yaml")
    assert "unknown config key infer.ovrlap; valid keys in infer:" in error(
        capsys, "predict", TTA8, "runs/a", "crops=val", "out=p.zarr", "infer.ovrlap=0.2")
    assert "infer.overlap=1.5 (--overlap 1.5): must be in [0, 1)" in error(
        capsys, "predict", "runs/a", "--crops", "val", "--out", "p.zarr", "--overlap", "1.5")
    assert "infer.blend: 'flat' is not one of ['gaussian', 'constant']" in error(
        capsys, "predict", TTA8, "runs/a", "crops=val", "out=p.zarr", "infer.blend=flat")
    assert "config file not found" in error(capsys, "predict", str(tmp_path / "missing.yaml"), "runs/a")
    assert "no out given: pass --out" in error(capsys, "predict", TTA8, "runs/a", "crops=val")
    assert "no run_dir given: pass RUN_DIR" in error(capsys, "predict", "--crops", "val", "--out", "p.zarr")
    assert "one RUN_DIR expected, got 2" in error(capsys, "predict", "a", "b", "--crops", "val", "--out", "p.zarr")
    assert "one CONFIG file at most" in error(capsys, "predict", TTA8, NO_TTA, "runs/a")
    assert "unknown config key postprocess" in error(  # a section this command does not read
        capsys, "predict", TTA8, "runs/a", "crops=val", "out=p.zarr", "postprocess.metric=2025")
    assert "ensemble.weights=auto (--weights auto) fits on member predictions" in error(
        capsys, "predict-ensemble", eight, "crops=test", "out=e.zarr", "--weights", "auto")
    assert "ensemble.members: an ensemble needs at least 2 members" in error(
        capsys, "ensemble", "a.zarr", "--out", "e.zarr")
    assert "ensemble.weights='3,x' (--weights): choose 'uniform', 'auto'" in error(
        capsys, "ensemble", "a.zarr", "b.zarr", "--out", "e.zarr", "--weights", "3,x")
    assert "ensemble.fit.crops (--crops): 'mito' is not a crop id" in error(
        capsys, "ensemble", "a.zarr", "b.zarr", "--out", "e.zarr", "--crops", "mito")
    assert "postprocess.device='gpu' (--device): choose 'auto', 'cpu', 'cuda' or 'cuda:N'" in error(
        capsys, "postprocess", "p.zarr", "--out", "s.zarr", "--device", "gpu")
    bad = tmp_path / "bad.yaml"
    bad.write_text("# a typo in a section another command reads still fails\ninfer: {tta: 8}\n"
                   "postprocess: {treshold: 0.3}\n")
    assert "unknown config key postprocess.treshold" in error(capsys, "predict", str(bad), "runs/a", "crops=val",
                                                              "out=p.zarr")
    assert [p.name for p in tmp_path.iterdir()] == ["bad.yaml"]  # nothing was written
