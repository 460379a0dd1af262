"""`cellseg show`: every figure from the command line, its --help, default output names and user errors."""

import json
import subprocess
import sys

import numpy as np
import pytest
from matplotlib.image import imread

from cellseg.cli import main
from cellseg.data.prediction_store import PredictionStore
from cellseg.viz import open_crop

FIGURES = ("crop", "group", "prediction", "scores", "curves", "bench")
SMALL = ["--panel-px", "96"]


@pytest.mark.parametrize("figure", FIGURES)
def test_every_figure_has_help(figure, capsys):
    with pytest.raises(SystemExit) as done:
        main(["show", figure, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "--out" in text and "--overwrite" in text and "example: cellseg show" in text


def test_show_help_lists_the_figures(capsys):
    with pytest.raises(SystemExit):
        main(["show", "--help"])
    text = capsys.readouterr().out
    assert all(f in text for f in FIGURES)


def test_crop_with_default_name_in_the_current_directory(tiny_synth_root, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["show", "crop", str(tiny_synth_root), "1", "--classes", "mito,er", *SMALL]) == 0
    assert "wrote crop1_z16_mito-er.png" in capsys.readouterr().out
    assert main(["show", "crop", str(tiny_synth_root), "crop3", "--x", "--voxel-size", "8", *SMALL]) == 0
    assert (tmp_path / "crop3_x8.png").is_file()
    assert main(["show", "group", str(tiny_synth_root), "1", "mito", "--y", "3", *SMALL]) == 0
    assert (tmp_path / "crop1_mito_atoms_y3.png").is_file()
    # The same figure again: refused without --overwrite, replaced with it.
    assert main(["show", "crop", str(tiny_synth_root), "1", "--classes", "mito,er", *SMALL]) == 2
    assert "crop1_z16_mito-er.png exists; pass --overwrite" in capsys.readouterr().err
    assert main(["show", "crop", str(tiny_synth_root), "1", "--classes", "mito,er", "--overwrite", *SMALL]) == 0


@pytest.mark.parametrize(("argv", "message"), [
    (["234"], "crop 234 is not in"),
    (["1", "--classes", "mito,mitox"], "unknown CellMap class 'mitox'"),
    (["6", "--classes", "mito_lum"], r"crop6 \(synth-iso8-1\) does not annotate mito_lum"),
    (["1", "--z", "100"], r"slice index z=100 is out of range: 32 z slices at 4×4×4 nm \(valid 0-31\)"),
    (["1", "--y", "-3"], "slice indices start at 0"),
    (["1", "--voxel-size", "fine"], "voxel size 'fine' is not a number"),
])
def test_crop_errors_are_one_clear_line(tiny_synth_root, tmp_path, argv, message, capsys):
    assert main(["show", "crop", str(tiny_synth_root), *argv, "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cellseg show: error: ") and len(err.strip().splitlines()) == 1
    import re

    assert re.search(message, err), err
    assert not (tmp_path / "x.png").exists()


def test_only_one_axis_at_a_time(tiny_synth_root, capsys):
    with pytest.raises(SystemExit):
        main(["show", "crop", str(tiny_synth_root), "1", "--z", "3", "--x", "3"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_prediction_scores_curves_bench(tiny_synth_root, tmp_path, capsys):
    view = open_crop(tiny_synth_root, 2)
    grid = view.grid()
    mito = view.masks(grid, ["mito"])["mito"][0]
    store = PredictionStore.create(tmp_path / "p.zarr", kind="probabilities", channels=["mito"])
    store.write_crop("crop2", grid, {"mito": np.where(mito, 0.9, 0.1).astype(np.float32)})
    out = tmp_path / "pred.png"
    assert main(["show", "prediction", str(tmp_path / "p.zarr"), "2", "--truth", str(tiny_synth_root),
                 "--out", str(out), *SMALL]) == 0
    assert imread(out).shape[0] > 96

    evaluation = tmp_path / "eval.json"
    evaluation.write_text(json.dumps({"metric": "2026", "overall_score": 0.5,
                                      "label_scores": {"mito": {"combined_score": 0.5}, "er": {"iou": 0.7}}}))
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 2, "time": 0.0, "train": {"loss": 1.0, "lr": 1e-3, "samples_per_s": 3.0}}) + "\n"
        + json.dumps({"step": 2, "time": 0.0, "val": {"metric": "2026", "overall_score": 0.2,
                                                       "class_scores": {"mito": 0.2}}}) + "\n")
    bench = tmp_path / "train_step.json"
    bench.write_text(json.dumps({"env": {"gpu": "GPU-X"}, "rows": [
        {"name": "unet_3d", "batch": 2, "patch": [64, 64, 64], "stock": {"step_ms": 10.0, "mfu": 0.1},
         "cellseg": {"step_ms": 5.0, "mfu": 0.2}}]}))
    for argv in (["scores", str(evaluation), str(run)], ["curves", str(run), "--classes", "mito"],
                 ["bench", str(bench)], ["bench", str(bench), "--metrics", "samples_per_s"]):
        target = tmp_path / f"{argv[0]}_{len(argv)}.png"
        assert main(["show", *argv, "--out", str(target)]) == 0, argv
        assert imread(target).ndim == 3
    assert main(["show", "bench", str(evaluation)]) == 2
    assert "not a train-step, models or loader benchmark" in capsys.readouterr().err
    assert main(["show", "scores", str(tmp_path / "missing.json")]) == 2
    assert "missing.json: no such file" in capsys.readouterr().err


def test_importing_viz_leaves_matplotlib_global_state_alone(tiny_synth_root, tmp_path):
    """No pyplot, no backend switch, no rcParams change, even after drawing and saving a figure."""
    code = f"""
import sys, matplotlib
before = matplotlib.rcParams.copy()  # copy(): dict(rcParams) would itself resolve the backend via pyplot
from cellseg import viz
fig = viz.crop_figure(viz.load_crop_slice({str(tiny_synth_root)!r}, 1, classes=["mito"]), panel_px=96)
viz.save_png(fig, {str(tmp_path / "x.png")!r})
assert "matplotlib.pyplot" not in sys.modules, "pyplot imported"
assert matplotlib.rcParams.copy() == before, "rcParams changed"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
