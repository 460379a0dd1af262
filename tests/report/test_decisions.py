"""decisions.json: what the report decides is what the product commands apply. On the tiny synthetic root with
two smoke runs: `cellseg decide` makes the report's decisions from the tuning crops alone; `predict-ensemble
--decisions` → `postprocess --decisions` → `submit` gives the report's stage-5 store and scores, array for array;
a file made for other runs, checkpoints or schema is refused before anything is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cellseg.cli import main as cli
from cellseg.data.prediction_store import PredictionStore
from cellseg.decide.document import SCHEMA_VERSION, Decisions, DecisionsError, file_sha256
from cellseg.decide.options import Layout
from cellseg.decide.truth import truth_labels

CPU = ("--overlap", "0", "--device", "cpu")  # as the report fixture predicted (conftest FAST)


def _report(report_dir: Path) -> dict:
    return json.loads((report_dir / "report.json").read_text())


def _arrays_equal(a: PredictionStore, b: PredictionStore, crop: str) -> list[str]:
    """The channels of `a` whose arrays differ from `b`'s on `crop` (shape or any voxel)."""
    return [ch for ch in a.channels
            if a.read(crop, ch).shape != b.read(crop, ch).shape or not np.array_equal(a.read(crop, ch), b.read(crop, ch))]


def _stage5_store(report: dict, report_dir: Path, era: str) -> Path:
    """The store the report scored as `era`'s stage 5: eras whose switch turned off the same classes share the
    store of the first of them (the tuning era first, then the registered order)."""
    eras, tuning = report["stage_switches"]["postprocess"]["eras"], report["tuning_metric"]
    first = next(e for e in dict.fromkeys([tuning, *eras]) if eras[e]["off"] == eras[era]["off"])
    return Layout(report_dir).postprocessed_in(first, tuning_era=tuning, off=eras[era]["off"])


@pytest.fixture(scope="module")
def product(report_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The product path on the report's scored crop: predict-ensemble --decisions (the runs taken from the file)."""
    out = tmp_path_factory.mktemp("product")
    decisions = report_dir / "decisions.json"
    assert cli(["-q", "predict-ensemble", "--decisions", str(decisions), "--crops", "501", "--out",
                str(out / "ens.zarr"), *CPU]) == 0
    return out


def test_the_file_holds_the_reports_decisions(report_dir, report_runs):
    doc, report = json.loads((report_dir / "decisions.json").read_text()), _report(report_dir)
    assert doc["format"] == "cellseg-decisions" and doc["schema_version"] == SCHEMA_VERSION
    for member, run in zip(doc["members"], report_runs, strict=True):
        assert member["run_dir"] == str(run.resolve()) and member["checkpoint_sha256"] == file_sha256(
            run / "checkpoints" / "best.pt")
        assert member["voxel_size_nm"] == [8.0, 8.0, 8.0] and member["classes"] == report["runs"][0]["classes"]
    switches = report["stage_switches"]
    assert doc["tuning"]["era"] == report["tuning_metric"] and doc["tuning"]["crops"] == ["crop2"]
    assert doc["weights"] == report["ensemble_weights"]["channels"]
    for name, choice in doc["classes"].items():
        fitted, uniform = switches["weighted"]["classes"][name]["on"], switches["uniform"]["classes"][name]["on"]
        assert choice["ensemble"] == ("fitted" if fitted else "uniform" if uniform else "single")
        assert choice["tta"] == switches["tta"]["classes"][name]["on"]
        for era, on in choice["postprocess"].items():
            assert on == switches["postprocess"]["eras"][era]["classes"][name]["on"]
            assert choice["evidence"][f"postprocess_{era}"]["on"] == on
        for evidence in choice["evidence"].values():  # one tuning crop: every draw is that crop, a point
            low, high = evidence["gain_interval"]
            gain = None if None in (evidence["score"], evidence["replaced"]) else evidence["score"] - evidence["replaced"]
            assert (low, high) == (None, None) if gain is None else low == pytest.approx(gain) == high
    assert doc["postprocess_params"]["classes"] == report["postprocess_params"]["classes"]


def test_predict_ensemble_with_decisions_gives_the_reports_stage_4(product, report_dir):
    stages = {s["key"]: s for s in _report(report_dir)["stages"]}
    ours, theirs = PredictionStore.open(product / "ens.zarr"), PredictionStore.open(stages["tta"]["store"])
    assert ours.completed() == ["crop501"] and sorted(ours.channels) == sorted(theirs.channels)
    assert _arrays_equal(ours, theirs, "crop501") == []
    assert not (product / "ens.zarr.parts").exists()  # the passes are gone once the store is complete


@pytest.mark.parametrize("era", ["2026", "2025"])
def test_the_product_path_gives_the_reports_stage_5_and_its_scores(product, report_dir, era):
    report = _report(report_dir)
    seg, sub = product / f"seg_{era}.zarr", product / f"sub_{era}.zip"
    decisions = str(report_dir / "decisions.json")
    assert cli(["-q", "postprocess", str(product / "ens.zarr"), "--decisions", decisions, "--metric", era,
                "--out", str(seg), "--device", "cpu"]) == 0
    stage5 = _stage5_store(report, report_dir, era)
    ours = PredictionStore.open(seg)
    assert _arrays_equal(ours, PredictionStore.open(stage5), "crop501") == []
    assert ours.provenance["decisions"]["era"] == era
    truth = report_dir / "truth.zarr"
    other = "2025" if era == "2026" else "2026"
    assert cli(["-q", "submit", str(seg), "--truth", str(truth), "--metric", other, "--out", str(sub)]) == 2
    assert not sub.exists()  # decoded for another era's leaderboard: refused
    assert cli(["-q", "submit", str(seg), "--truth", str(truth), "--out", str(sub)]) == 0
    scores = product / f"scores_{era}.json"
    assert cli(["-q", "evaluate", str(sub), str(truth), "--metric", era, "--json", str(scores)]) == 0
    stage = next(s for s in report["stages"] if s["key"] == "postprocess")["scores"][era]
    assert json.loads(scores.read_text())["overall_score"] == pytest.approx(stage["overall"], abs=1e-12)


def test_decide_makes_the_reports_decisions_from_the_tuning_crops_alone(report_dir, report_runs, tmp_path):
    """`cellseg decide` predicts and scores only the tuning crop (the member stores the report predicted stand in
    for its predictions), and decides class by class what the report decided."""
    stores = sorted(str(p) for p in (report_dir / "stores").glob("predict_tta*/*.zarr"))
    out = tmp_path / "decide"
    assert cli(["-q", "decide", *map(str, report_runs), "--out", str(out), "--tune-crops", "val", *CPU,
                "--reuse", *stores]) == 0
    ours, theirs = Decisions.load(out / "decisions.json"), Decisions.load(report_dir / "decisions.json")
    assert ours.classes.keys() == theirs.classes.keys()
    for name in ours.classes:
        a, b = ours.classes[name], theirs.classes[name]
        assert (a.ensemble, a.tta, dict(a.postprocess)) == (b.ensemble, b.tta, dict(b.postprocess)), name
    assert ours.weights == theirs.weights and ours.members == theirs.members
    assert ours.params["classes"] == theirs.params["classes"]
    assert list(truth_labels(out / "truth.zarr")) == ["crop2"]  # the tuning crop alone was scored
    # run again (a killed job's next start): every stage is read back, the same decisions are written
    assert cli(["-q", "decide", *map(str, report_runs), "--out", str(out), "--tune-crops", "val", *CPU,
                "--reuse", *stores]) == 0
    steps = json.loads((out / "timings.json").read_text())[-1]
    # (the members' predictions are the --reuse stores, outside DECIDE_DIR: read, never written, either time)
    assert all(s["resumed"] for s in steps if s["step"][0].isdigit() and "predict" not in s["step"]), steps
    again = Decisions.load(out / "decisions.json")
    assert again.classes == ours.classes and again.weights == ours.weights and again.params == ours.params


def _edited(report_dir: Path, tmp_path: Path, edit) -> Path:
    doc = json.loads((report_dir / "decisions.json").read_text())
    edit(doc)
    path = tmp_path / "decisions.json"
    path.write_text(json.dumps(doc))
    return path


def _refused(args: list[str], out: Path, capsys, *words: str) -> None:
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
    assert not out.exists() and not out.with_name(out.name + ".parts").exists()  # nothing written


def test_a_file_of_another_schema_version_is_refused_before_anything_is_written(report_dir, tmp_path, capsys):
    path = _edited(report_dir, tmp_path, lambda d: d.update(schema_version=SCHEMA_VERSION + 1))
    out = tmp_path / "ens.zarr"
    _refused(["predict-ensemble", "--decisions", str(path), "--crops", "501", "--out", str(out), *CPU], out, capsys,
             str(path), f"schema_version {SCHEMA_VERSION + 1}")


def test_other_runs_a_changed_checkpoint_or_a_missing_member_are_refused(report_dir, report_runs, tmp_path, capsys):
    out = tmp_path / "ens.zarr"
    decisions = str(report_dir / "decisions.json")
    _refused(["predict-ensemble", str(report_runs[0]), "--decisions", decisions, "--crops", "501", "--out", str(out),
              *CPU], out, capsys, decisions, "made for the runs")
    # a copy of the runs whose first checkpoint was trained further (here: one byte more)
    copies = [shutil.copytree(r, tmp_path / "runs" / r.name) for r in report_runs]
    with open(copies[0] / "checkpoints" / "best.pt", "ab") as f:
        f.write(b"\0")
    moved = _edited(report_dir, tmp_path, lambda d: [m.update(run_dir=str(c)) for m, c in zip(d["members"], copies,
                                                                                                strict=True)])
    _refused(["predict-ensemble", "--decisions", str(moved), "--crops", "501", "--out", str(out), *CPU], out, capsys,
             str(moved), "member unet_3d", "checkpoint_sha256", "run `cellseg decide` again")
    shutil.rmtree(copies[1])
    with open(copies[0] / "checkpoints" / "best.pt", "rb+") as f:
        f.truncate(f.seek(0, 2) - 1)
    _refused(["predict-ensemble", "--decisions", str(moved), "--crops", "501", "--out", str(out), *CPU], out, capsys,
             str(moved), "member resnet_3d")


def test_postprocess_refuses_an_era_without_a_choice_and_a_second_source_of_parameters(report_dir, product,
                                                                                       tmp_path, capsys):
    one_era = _edited(report_dir, tmp_path, lambda d: d["tuning"].update(eras=[d["tuning"]["era"]]))
    out = tmp_path / "seg.zarr"
    _refused(["postprocess", str(product / "ens.zarr"), "--decisions", str(one_era), "--metric", "2025", "--out",
              str(out)], out, capsys, str(one_era), "no post-processing choice for the 2025 metric")
    _refused(["postprocess", str(product / "ens.zarr"), "--decisions", str(one_era), "--params", "p.json", "--out",
              str(out)], out, capsys, "--decisions", "--params")


def test_a_malformed_file_names_what_is_wrong(report_dir, tmp_path):
    with pytest.raises(DecisionsError, match="weights of mito"):
        Decisions.load(_edited(report_dir, tmp_path, lambda d: d["weights"].update(mito=[1.0])))
    with pytest.raises(DecisionsError, match="not a cellseg decisions file"):
        Decisions.load(_edited(report_dir, tmp_path, lambda d: d.pop("format")))
    with pytest.raises(DecisionsError, match="no such decisions file"):
        Decisions.load(tmp_path / "missing.json")


def test_a_report_of_given_decisions_scores_what_the_deciding_report_scored(report_dir, report_runs, tmp_path):
    """`cellseg report --decisions`: nothing is decided (the tuning crop is never predicted), every stage is what
    the file says, and each stage scores what the report that made the file scored on the same crop."""
    out = tmp_path / "replayed"
    assert cli(["-q", "report", "--runs", *map(str, reversed(report_runs)), "--out", str(out), "--crops", "501",
                "--overlap", "0", "--slices", "0", "--device", "cpu",
                "--decisions", str(report_dir / "decisions.json")]) == 0
    ours, theirs = _report(out), _report(report_dir)
    for a, b in zip(ours["stages"], theirs["stages"], strict=True):
        for era in ("2025", "2026", "2026-07"):
            assert a["scores"][era]["overall"] == pytest.approx(b["scores"][era]["overall"], abs=1e-12), (a["key"], era)
            assert a["scores"][era]["classes"] == pytest.approx(b["scores"][era]["classes"], abs=1e-12, nan_ok=True)
    assert ours["best_single"] == {era: theirs["best_single"][theirs["tuning_metric"]] for era in ours["best_single"]}
    assert not (out / "truth_tuning.zarr").exists()
    assert all("crop2" not in PredictionStore.open(p) for p in (out / "stores").glob("predict_tta*/*.zarr"))
    assert ours["crops"]["tuning"] == ["crop2"]  # named as the file's tuning crops


def test_a_report_refuses_decisions_of_other_runs_before_predicting(report_dir, report_runs, tmp_path, capsys):
    out = tmp_path / "replayed"
    assert cli(["report", "--runs", str(report_runs[0]), str(report_runs[0].parent / "missing"), "--out", str(out),
                "--crops", "501", "--decisions", str(report_dir / "decisions.json")]) == 2
    assert "made for the runs" in capsys.readouterr().err and not out.exists()


def test_decisions_of_one_run_are_its_tta_and_decoding_per_class(report_runs, report_dir, tmp_path, capsys):
    """`cellseg decide RUN_DIR`: one run, no ensemble: each class keeps or drops TTA and its tuned decoding;
    `cellseg predict --decisions` predicts it so, each class as the run predicts it with or without TTA."""
    run = str(report_runs[0])
    out = tmp_path / "decide"
    assert cli(["-q", "decide", run, "--out", str(out), "--tune-crops", "val", *CPU]) == 0
    decisions = Decisions.load(out / "decisions.json")
    assert len(decisions.members) == 1 and set(decisions.weights.values()) == {(1.0,)}
    assert {c.ensemble for c in decisions.classes.values()} == {"single"}
    for choice in decisions.classes.values():
        assert choice.evidence["uniform"]["gain_interval"] == [None, None] and "on" in choice.evidence["tta"]
    pred = tmp_path / "pred.zarr"
    assert cli(["-q", "predict", "--decisions", str(out / "decisions.json"), "--crops", "501", "--out", str(pred),
                *CPU]) == 0
    plain = {tta: tmp_path / f"tta{tta}.zarr" for tta in (1, 8)}
    for tta, path in plain.items():
        assert cli(["-q", "predict", run, "--crops", "501", "--out", str(path), "--tta", str(tta), *CPU]) == 0
    ours = PredictionStore.open(pred)
    for channel in ours.channels:
        tta = 8 if decisions.classes[channel.removesuffix("_boundary")].tta else 1
        want = PredictionStore.open(plain[tta]).read("crop501", channel)
        np.testing.assert_array_equal(ours.read("crop501", channel), want, err_msg=channel)
    assert cli(["-q", "postprocess", str(pred), "--decisions", str(out / "decisions.json"), "--out",
                str(tmp_path / "seg.zarr"), "--device", "cpu"]) == 0
    # a file of several runs is for predict-ensemble
    assert cli(["predict", "--decisions", str(report_dir / "decisions.json"), "--crops", "501", "--out",
                str(tmp_path / "x.zarr")]) == 2
    assert "use `cellseg predict-ensemble --decisions`" in capsys.readouterr().err and not (tmp_path / "x.zarr").exists()
