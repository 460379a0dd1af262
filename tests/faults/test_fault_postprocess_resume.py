"""An interrupted `cellseg postprocess --tune-on` goes on when the same command runs again (a requeued job)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cellseg.cli import main
from cellseg.data.crops import Catalog
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore
from cellseg.eval.truth import read_class_truth as read_truth
from cellseg.postprocess.params import ParamSet
from cellseg.postprocess.tune import split_entry
from cellseg.postprocess.tuning import tune_store

CLASSES = ("er", "nuc")  # semantic classes: quick to tune


def _store(root: Path, path: Path) -> PredictionStore:
    """Under-confident probabilities of crop 1 made from its truth (0.5 misses every class: tuning matters)."""
    catalog = Catalog.from_dir(root)
    geometry = catalog.train[1].labels["er"]
    grid = Grid(translation_nm=geometry.translation_nm, shape_vox=geometry.shape_vox,
                voxel_size_nm=geometry.voxel_size_nm)
    store = PredictionStore.create(path, kind="probabilities", channels=list(CLASSES))
    entry = split_entry(catalog, 1)
    store.write_crop("crop1", grid, {c: np.where(read_truth(entry, c, grid)[0], 0.4, 0.1).astype(np.float32)
                                     for c in CLASSES})
    return store


def _command(store: PredictionStore, out: Path, root: Path) -> list[str]:
    return ["postprocess", str(store.path), "--out", str(out), "--tune-on", str(root), "--crops", "1",
            "--metric", "2025", "--device", "cpu"]


def test_a_requeued_tuning_resumes_the_classes_tuned_before(tiny_synth_root: Path, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    store = _store(tiny_synth_root, tmp_path / "pred.zarr")
    out, params = tmp_path / "seg.zarr", tmp_path / "seg.zarr.params.json"
    partial = tmp_path / ".seg.zarr.params.json.partial"
    # What a tuning cut after its first class leaves: its checkpoint holding that class only.
    full = tune_store(store, tiny_synth_root, crops=["1"], era="2025", progress=False, hierarchy=False,
                      checkpoint=partial)
    doc = json.loads(partial.read_text())
    del doc["classes"]["nuc"]
    partial.write_text(json.dumps(doc))
    caplog.set_level("INFO", logger="cellseg")
    assert main(_command(store, out, tiny_synth_root)) == 0
    assert "1 classes tuned before (er), resuming" in caplog.text
    assert not partial.exists() and PredictionStore.open(out).completed() == ["crop1"]
    assert ParamSet.load(params).get("er") == full.get("er")


def test_the_same_command_after_tuning_reuses_the_parameters(tiny_synth_root: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(tiny_synth_root, tmp_path / "pred.zarr")
    out, params = tmp_path / "seg.zarr", tmp_path / "seg.zarr.params.json"
    assert main(_command(store, out, tiny_synth_root)) == 0
    written = params.read_text()
    # Killed while segmenting: the crop's hidden partial group is what is left of OUT.
    seg = PredictionStore.open(out)
    (out / "crop1").rename(out / ".crop1.partial")
    assert seg.completed() == []
    capsys.readouterr()
    assert main(_command(store, out, tiny_synth_root)) == 0
    assert f"reusing {params}" in capsys.readouterr().out
    assert params.read_text() == written and PredictionStore.open(out).completed() == ["crop1"]
    # Another metric is another tuning: refused, naming what differs.
    assert main([*_command(store, out, tiny_synth_root)[:-4], "--metric", "2026", "--device", "cpu"]) == 2
    assert "metric '2025' (asked: '2026')" in capsys.readouterr().err
