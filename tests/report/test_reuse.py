"""`cellseg report --reuse`: stores written by `cellseg predict` stand for the members' predictions when they hold
every crop from the same checkpoint and settings; others are left untouched and predicted anew; a path that is not
a probability store of one of the runs is refused before anything is predicted."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from cellseg.cli import main as cli
from cellseg.config.inference import InferConfig
from cellseg.data.prediction_store import PredictionStore
from cellseg.decide.inputs import check_runs, plan_crops
from cellseg.decide.options import Layout
from cellseg.decide.predictions import predict_all
from cellseg.decide.reuse import open_candidates
from cellseg.decide.scoring import plain_segmentation
from cellseg.infer.predict import predict_run
from cellseg.report import ReportOptions

OVERLAP = 0.0  # the report's and the stores' (no overlap: fast on 2 cores)


def _options(runs, out: Path, reuse: tuple[str, ...]) -> ReportOptions:
    return ReportOptions(runs=tuple(str(r) for r in runs), out=str(out), crops="test", tune_crops="val",
                         overlap=OVERLAP, device="cpu", progress=False, predict_jobs=1, reuse=reuse)


def _snapshot(store: Path) -> dict[str, float]:
    """Every file of a store with its modification time (a store left untouched keeps both)."""
    return {str(p.relative_to(store)): p.stat().st_mtime_ns for p in store.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def predicted(report_runs, tiny_synth_root, tmp_path_factory):
    """The runs, their crop plan and each run's store of every crop the report needs, as `cellseg predict`
    writes it (no TTA)."""
    runs = check_runs(report_runs)
    plan = plan_crops(runs, tiny_synth_root, crops="test", tune_crops="val")
    folder = tmp_path_factory.mktemp("user_stores")
    stores = []
    for run in runs:
        out = folder / f"{run.name}.zarr"
        predict_run(run.run_dir, ",".join(plan.predicted), out, InferConfig(tta=1, overlap=OVERLAP, device="cpu",
                                                                             progress=False))
        stores.append(out)
    return runs, plan, stores


def test_named_stores_stand_for_the_members_predictions(report_runs, predicted, tmp_path, caplog):
    runs, plan, stores = predicted
    before = [_snapshot(s) for s in stores]
    caplog.set_level(logging.INFO, logger="cellseg")
    layout = Layout(tmp_path / "report")
    got = predict_all(runs, layout, plan, _options(report_runs, layout.root, tuple(map(str, stores))), tta=1)

    assert got == [s.resolve() for s in stores]
    assert "predicted 0 members (tta=1)" in caplog.text
    assert all(f"{r.name} (tta=1): using {s.resolve()}" in caplog.text for r, s in zip(runs, stores, strict=True))
    assert not any(layout.predictions(r, 1).exists() for r in runs)
    assert [_snapshot(s) for s in stores] == before
    # A stage with another number of transforms does not take them: the 8x TTA stores are predicted.
    caplog.clear()
    got = predict_all(runs[:1], layout, plan, _options(report_runs[:1], layout.root, (str(stores[0]),)), tta=8)
    assert got == [layout.predictions(runs[0], 8).resolve()] and "predicted 1 members (tta=8)" in caplog.text


def test_a_store_that_does_not_stand_for_the_prediction_is_left_alone(report_runs, predicted, tmp_path, caplog):
    runs, plan, _ = predicted
    partial, other = tmp_path / "partial.zarr", tmp_path / "overlap.zarr"
    predict_run(runs[0].run_dir, plan.predicted[0], partial, InferConfig(tta=1, overlap=OVERLAP, device="cpu",
                                                                        progress=False))
    predict_run(runs[1].run_dir, ",".join(plan.predicted), other, InferConfig(tta=1, overlap=0.25, device="cpu",
                                                                             progress=False))
    before = [_snapshot(partial), _snapshot(other)]
    caplog.set_level(logging.INFO, logger="cellseg")
    layout = Layout(tmp_path / "report")
    got = predict_all(runs, layout, plan, _options(report_runs, layout.root, (str(partial), str(other))), tta=1)

    assert got == [layout.predictions(r, 1).resolve() for r in runs]
    assert "predicted 2 members (tta=1)" in caplog.text
    assert f"not using {partial.resolve()}: lacks {', '.join(plan.predicted[1:])}" in caplog.text
    assert f"not using {other.resolve()}: overlap 0.25, the report's 0.0" in caplog.text
    assert [_snapshot(partial), _snapshot(other)] == before  # never completed or rewritten


def test_paths_that_are_no_store_of_the_runs_are_refused_before_any_prediction(report_runs, predicted, tmp_path,
                                                                               capsys):
    runs, plan, stores = predicted
    with pytest.raises(FileNotFoundError, match=r"--reuse .*missing\.zarr: no such store"):
        open_candidates([str(tmp_path / "missing.zarr")], runs)
    segmented = plain_segmentation(PredictionStore.open(stores[0]), tmp_path / "seg.zarr", plan.predicted[:1])
    with pytest.raises(ValueError, match="holds segmentation, expected the probabilities"):
        open_candidates([str(segmented.path)], runs[:1])
    stranger = tmp_path / "stranger.zarr"
    predict_run(runs[0].run_dir, plan.predicted[0], stranger, InferConfig(tta=1, overlap=OVERLAP, device="cpu",
                                                                         progress=False))
    attrs = stranger / ".zattrs"
    doc = json.loads(attrs.read_text())
    doc["cellseg"]["provenance"]["run_dir"] = str(tmp_path / "another_run")
    attrs.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"predicted by .*another_run, which is not one of the report's runs"):
        open_candidates([str(stranger)], runs)

    out = tmp_path / "r"
    args = ["report", "--runs", *map(str, report_runs), "--out", str(out), "--device", "cpu", "--crops", "test",
            "--tune-crops", "val", "--overlap", str(OVERLAP)]
    assert cli([*args, "--reuse", str(stores[0]), str(tmp_path / "missing.zarr")]) != 0
    assert "missing.zarr: no such store" in capsys.readouterr().err
    assert not out.exists()
