"""`cellseg report` on the tiny synthetic root with two smoke runs: every stage in both eras, the files it
writes, its truth and scoring rule, resuming, and clear errors for bad input."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from cellseg.cli import main as cli
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.split import read_datasplit
from cellseg.decide.inputs import check_runs, plan_crops
from cellseg.decide.options import Layout
from cellseg.decide.scoring import (
    ScoreJob,
    plain_segmentation,
    score_segmentations,
    scores_file,
    scoring_beside,
    thresholding_of,
)
from cellseg.eval.eras import ERAS
from cellseg.eval.io import open_source
from cellseg.eval.relabel import relabel_26
from cellseg.eval.validate import crops_from_truth
from cellseg.postprocess.annotation import to_grid
from cellseg.postprocess.native import (
    axis_maps,
    decode_on_grid,
    linear_probability,
    plain_params,
    segment_class,
)
from cellseg.report import ReportOptions, run_report
from cellseg.report.ablation import Stores, score_jobs

STAGE_KEYS = ("uniform", "weighted", "tta", "postprocess")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Fast settings: the smaller test crop scored (truth in ground_truth.zarr), the runs' validation crop tunes;
# no tile overlap, one overlay crop.
FAST = ("--crops", "501", "--tune-crops", "val", "--overlap", "0", "--slices", "1", "--device", "cpu")


def plain_jobs(runs, stores, layout, plan):
    """The thresholded segmentations `score_stages` scores: (probability store, segmentation store, crops)."""
    return thresholding_of([job for _, job in score_jobs(runs, stores, layout, plan).values()])


def _options(runs, out, **kw) -> ReportOptions:
    base = {"crops": "501", "tune_crops": "val", "overlap": 0.0, "slices": 1, "device": "cpu", "progress": False}
    return ReportOptions(runs=tuple(str(r) for r in runs), out=str(out), **{**base, **kw})


def _doc(report_dir: Path) -> dict:
    return json.loads((report_dir / "report.json").read_text())


def _unit(value) -> bool:
    return value is None or (0.0 <= value <= 1.0 and not math.isnan(value))


def test_every_stage_is_scored_in_every_era(report_dir, report_runs):
    doc = _doc(report_dir)
    names = [r.name for r in report_runs]
    assert [s["key"] for s in doc["singles"]] == [f"single_{n}" for n in names]
    assert set(doc["best_single"]) == set(ERAS) and set(doc["best_single"].values()) <= set(names)
    assert [s["key"] for s in doc["stages"]] == ["best_single", *STAGE_KEYS]
    for era, name in doc["best_single"].items():  # stage 1 holds each era's best single model's scores
        single = next(s for s in doc["singles"] if s["key"] == f"single_{name}")
        assert doc["stages"][0]["scores"][era]["overall"] == single["scores"][era]["overall"]
        choice = doc["best_single_choice"][era]  # chosen by the decision score on the tuning crops, not the scored
        assert choice["run"] == name and choice["chosen_on"] == "tuning crops"
        assert choice["scores"][name] == max(choice["scores"].values())
    classes = set(doc["runs"][0]["classes"])
    for stage in doc["stages"] + doc["singles"]:
        assert set(stage["scores"]) == set(ERAS)
        for era, s in stage["scores"].items():
            assert s["evaluation"]["metric"] == era
            assert all(_unit(s[k]) for k in ("overall", "instance", "semantic")), (stage["key"], era)
            assert set(s["classes"]) == classes and all(_unit(v) for v in s["classes"].values())
    validation = sorted(e.crop_name for e in read_datasplit(report_runs[0] / "datasplit.csv") if e.split == "validate")
    tuning = [c for c in validation if doc["crops"]["roles"].get(c) == "tuning"]  # the runs' tuning crops only
    assert doc["crops"]["scored"] == ["crop501"] and doc["crops"]["tuning"] == tuning != []
    assert "not biased" in doc["bias"][0]  # tuned on a validation crop, scored on the test crops
    stores = report_dir / "stores"  # the tuned parameters; the tuning's checkpoint is gone with the tuning done
    assert (stores / "postprocess_params.json").is_file() and not (stores / "postprocess_params.partial.json").exists()


def test_report_markdown_names_stages_eras_and_bias(report_dir):
    text = (report_dir / "report.md").read_text()
    for title in ("1. best single model", "2. uniform ensemble", "3. weighted ensemble", "4. + TTA (8×)",
                  "5. + post-processing (tuned)", "2025 challenge-era metric", "2026 metric (official code at 6b9ad68)",
                  "## Per class, 2025", "## Per class, 2026", "## Timings", "**Bias.**", "## Stage switches",
                  "**4. TTA**: off for", "**5. post-processing**: off for"):
        assert title in text, title
    # ecs and pm are the runs' atoms: each tried "argmax" against the other, listed whether kept or not
    note = next(line for line in text.splitlines() if line.startswith("Hierarchy options of stage 5"))
    assert "ecs " in note and "pm " in note and "→" in note
    params = json.loads((report_dir / "report.json").read_text())["postprocess_params"]["classes"]
    assert params["pm"]["hierarchy_on_score"] is not None and params["mito"]["hierarchy"] is None


def test_stages_2_to_5_are_switched_per_class_on_the_tuning_crops(report_dir, report_runs):
    doc = _doc(report_dir)
    switches, classes = doc["stage_switches"], doc["runs"][0]["classes"]
    assert switches["era"] == doc["tuning_metric"]
    for key in ("uniform", "weighted", "tta", "postprocess"):
        assert sorted(switches[key]["classes"]) == sorted(classes)
        assert switches[key]["off"] == [c for c, s in switches[key]["classes"].items() if not s["on"]]
        for s in switches[key]["classes"].values():  # on exactly where the stage scores strictly higher
            assert s["on"] == (s["after"] is None or s["before"] is None or s["after"] > s["before"] + 1e-9)
    # Stage 2 is compared with the best single model chosen in the tuning era.
    assert switches["uniform"]["best_single"] == doc["best_single_choice"][doc["tuning_metric"]]["run"]
    # The stores scored as stages 2-5 are the switched ones whenever a class was switched off.
    stages = {s["key"]: s for s in doc["stages"]}
    assert stages["uniform"]["store"].endswith("ensemble_uniform_switched.zarr" if switches["uniform"]["off"]
                                               else "ensemble_uniform.zarr")
    assert stages["weighted"]["store"].endswith("ensemble_weighted_switched.zarr" if switches["weighted"]["off"]
                                                else "ensemble_weighted.zarr")
    assert stages["tta"]["store"].endswith("ensemble_weighted_tta8_switched.zarr" if switches["tta"]["off"]
                                           else "ensemble_weighted_tta8.zarr")
    tuning_store, *other_stores = stages["postprocess"]["store"].split(", ")  # the tuning era's first
    assert tuning_store.endswith("postprocessed_switched.zarr" if switches["postprocess"]["off"]
                                 else "postprocessed.zarr")
    # Stage 5 is switched in every era scored, each era's column scoring the store its own switch kept.
    eras = switches["postprocess"]["eras"]
    assert sorted(eras) == sorted(ERAS) and eras[doc["tuning_metric"]]["off"] == switches["postprocess"]["off"]
    assert len(other_stores) == len({tuple(e["off"]) for e in eras.values()}) - 1


def test_stage_4_predicts_the_members_stage_3_weighs(report_dir, report_runs):
    """Stage 4 reuses stage 3's weights, so a run of weight 0 for every class is not predicted with TTA; the
    report names it."""
    doc = _doc(report_dir)
    channels = doc["ensemble_weights"]["channels"]
    names = [r.name for r in report_runs]
    weighed = {n for i, n in enumerate(names) if any(w[i] > 0 for w in channels.values())}
    predicted = {p.stem for p in (report_dir / "stores" / "predict_tta8").glob("*.zarr")}
    assert weighed <= predicted <= set(names)
    assert doc["stage_switches"]["tta"]["without_weight"] == [n for n in names if n not in predicted]


def test_stage_4_begins_beside_stages_2_and_3_when_members_predict_in_processes(report_dir, report_runs, tmp_path):
    """With the members in processes, stage 4's predictions run while stages 2-3 ensemble and fit: the same
    report as one member after the other (stores equal to float16 rounding; the scores to the last voxels)."""
    out = tmp_path / "report"
    run_report(_options(report_runs, out, predict_jobs=2))
    doc, before = _doc(out), _doc(report_dir)
    assert [t["step"] for t in doc["timings"] if t["step"].startswith("4. + TTA")] == [
        f"4. + TTA: predict 2 crops with 8 transforms ({len(report_runs)} of {len(report_runs)} members begun beside "
        "stages 2-3)"]
    for stage, expected in zip(doc["stages"], before["stages"], strict=True):
        for era in ("2025", "2026"):
            assert stage["scores"][era]["overall"] == pytest.approx(expected["scores"][era]["overall"], abs=0.01)


def test_stage_4_keeps_a_member_whose_grid_the_ensemble_takes(tmp_path):
    """Of two members, one of weight 0 everywhere but on a finer grid: stage 4 still predicts it, so that its
    ensemble has stage 3's grid (grid "finest")."""
    from cellseg.config.inference import EnsembleConfig
    from cellseg.decide.stages import tta_members
    from cellseg.infer.ensemble import ensemble
    from cellseg.infer.weights import WEIGHTS_FILE

    def member(name: str, grid: Grid) -> Path:
        store = PredictionStore.create(tmp_path / f"{name}.zarr", kind="probabilities", channels=("mito",),
                                       instance_channels=())
        store.write_crop("crop1", grid, {"mito": np.full(grid.shape_vox, 0.5, np.float32)})
        return store.path

    coarse = Grid(translation_nm=(4.0,) * 3, shape_vox=(4, 4, 4), voxel_size_nm=(8.0,) * 3)
    fine = Grid(translation_nm=(2.0,) * 3, shape_vox=(8, 8, 8), voxel_size_nm=(4.0,) * 3)
    a, b = member("a", coarse), member("b", fine)
    first_coarse = ensemble(EnsembleConfig(members=(a, b), weights=(1, 0)), tmp_path / "w.zarr").store
    first_fine = ensemble(EnsembleConfig(members=(b, a), weights=(1, 0)), tmp_path / "v.zarr").store
    assert tta_members(first_coarse.path / WEIGHTS_FILE, [a, b], ["crop1"]) == [0, 1]
    assert tta_members(first_fine.path / WEIGHTS_FILE, [b, a], ["crop1"]) == [0]


def test_pngs_are_written(report_dir):
    names = ["overall.png", *(f"classes_{era}.png" for era in ERAS), "overlay_crop501_tta.png",
             "overlay_crop501_postprocessed.png"]
    for name in names:
        data = (report_dir / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000, name
    assert _doc(report_dir)["figures"] == names


def test_truth_is_the_held_out_truth_of_the_runs_classes(report_dir, report_runs, tiny_synth_root):
    import zarr

    classes = check_runs(report_runs)[0].classes
    for crop in ("crop501",):
        ours = zarr.open_group(str(report_dir / "truth.zarr" / crop), mode="r")
        theirs = zarr.open_group(str(tiny_synth_root / "ground_truth.zarr" / crop), mode="r")
        assert sorted(ours.array_keys()) == sorted(c for c in classes if c in theirs)
        for label in ours.array_keys():
            np.testing.assert_array_equal(ours[label][...], theirs[label][...])
            assert dict(ours[label].attrs) == dict(theirs[label].attrs)


def test_plain_stages_threshold_at_half_and_label_26_connected_components(report_dir):
    stage = next(s for s in _doc(report_dir)["stages"] if s["key"] == "uniform")
    prob = PredictionStore.open(stage["store"])  # the uniform ensemble, per class where it helps
    seg = PredictionStore.open(report_dir / "stores" / "segmentation" / "uniform.zarr")
    assert seg.completed() == ["crop501"]  # scored crops only, not the tuning crop
    truth = crops_from_truth(open_source(report_dir / "truth.zarr"))[501]
    source = prob.grid("crop501")
    for name in prob.classes:
        p, target = prob.read("crop501", name), to_grid(truth.labels[name])
        assert seg.grid("crop501", name) == target != source  # on the truth's 4 nm grid, not the model's 8 nm
        maps = axis_maps(source, target)
        if name in prob.instance_channels:  # 26-connected components of p > 0.5 on the model grid, then refined
            ids = segment_class(name, p, None, voxel_size_nm=source.voxel_size_nm, params=plain_params(name))
            np.testing.assert_array_equal(ids, relabel_26(p > 0.5)[0])
            expected = decode_on_grid(name, p, source=source, target=target, params=plain_params(name))
        else:  # the probability interpolated linearly onto the truth's grid, > 0.5
            expected = linear_probability(p, maps) > 0.5
        np.testing.assert_array_equal(seg.read("crop501", name), expected.astype(seg.read("crop501", name).dtype))


def test_plain_segmentation_joins_diagonal_neighbours(tmp_path):
    grid = Grid(translation_nm=(4.0, 4.0, 4.0), shape_vox=(4, 4, 4), voxel_size_nm=(8.0, 8.0, 8.0))
    probs = np.zeros((4, 4, 4), np.float32)
    probs[0, 0, 0] = probs[1, 1, 1] = 0.9  # corners touch: one object under 26-connectivity
    probs[3, 3, 3] = 0.6
    probs[3, 0, 3] = 0.5  # not above 0.5
    store = PredictionStore.create(tmp_path / "p.zarr", kind="probabilities", channels=["mito", "er"],
                                   instance_channels=["mito"])
    store.write_crop("crop7", grid, {"mito": probs, "er": probs})
    seg = plain_segmentation(store, tmp_path / "s.zarr", ["crop7"])
    ids = seg.read("crop7", "mito")
    assert ids.dtype == np.uint32 and sorted(np.unique(ids).tolist()) == [0, 1, 2]
    assert ids[0, 0, 0] == ids[1, 1, 1] != ids[3, 3, 3]
    assert seg.read("crop7", "er").sum() == 3


def test_the_thresholding_jobs_name_the_stores_the_scoring_wrote(report_dir, report_runs, tiny_synth_root):
    # On a machine with 16 cores or more the report thresholds these stores side by side first (`plain_jobs`);
    # here it thresholded each as it scored it: the jobs must name those very stores, from the same sources.
    runs = check_runs(report_runs)
    layout = Layout(report_dir)
    scored = {s["key"]: s["store"] for s in _doc(report_dir)["stages"]}
    stores = Stores(singles=[layout.predictions(r, 1) for r in runs],
                    uniform=PredictionStore.open(scored["uniform"]),
                    weighted=PredictionStore.open(scored["weighted"]),
                    weights=layout.ensemble("weighted") / "weights.json",
                    with_tta=PredictionStore.open(layout.ensemble("weighted_tta8_switched")),
                    postprocessed={"2026": PredictionStore.open(layout.postprocessed)}, params=None,
                    switches={"era": "2026"})
    plan = plan_crops(runs, tiny_synth_root, crops="501", tune_crops="val")
    jobs = plain_jobs(runs, stores, layout, plan)
    assert len(jobs) == 2 * len(runs) + 3
    for prob, out, crops in jobs:
        seg = PredictionStore.open(out)
        assert seg.provenance["source"] == str(Path(prob).resolve()) and sorted(seg.completed()) == sorted(crops)


def test_rerun_resumes_and_prints_the_table(report_dir, report_runs, capsys):
    store = report_dir / "stores" / "predict_tta8" / f"{report_runs[0].name}.zarr" / "crop501" / ".zattrs"
    written = store.stat().st_mtime_ns
    before = _doc(report_dir)["stages"]
    # One scoring process here, the default (the CPU cores) in the fixture: the scores do not depend on it.
    rerun_started = time.time_ns()
    assert cli(["-q", "report", "--runs", *map(str, report_runs), "--out", str(report_dir), *FAST,
                "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    assert "| stage | 2025 overall" in printed and "5. + post-processing (tuned)" in printed
    assert store.stat().st_mtime_ns == written
    doc = _doc(report_dir)
    assert [t["resumed"] for t in doc["timings"] if t["step"][0].isdigit()] == [True] * 5
    assert [s["scores"]["2026"]["overall"] for s in doc["stages"]] == [s["scores"]["2026"]["overall"] for s in before]
    # the evaluations were read back, not computed again: each era's file is older than this run
    submissions = report_dir / "stores" / "submissions"
    for key in STAGE_KEYS:
        for era in ("2025", "2026"):
            assert scores_file(submissions / f"{key}.zip", era).stat().st_mtime_ns < rerun_started, (key, era)


def test_stores_scored_side_by_side_score_as_one_at_a_time(report_dir, tmp_path):
    # `score_segmentations` with 8 workers scores 2 stores at a time, 4 processes each: the same evaluations.
    doc, layout = _doc(report_dir), Layout(report_dir)
    keys = ["uniform", "weighted", "postprocess"]
    jobs = [ScoreJob(layout.segmentation(k) if k != "postprocess" else Path(_stage(doc, k)["store"]), layout.truth,
                     tmp_path / f"{k}.zip") for k in keys]
    scores = score_segmentations(jobs, ["2025", "2026"], workers=8)
    for key, got in zip(keys, scores, strict=True):
        for era in ("2025", "2026"):
            assert got[era].overall == _stage(doc, key)["scores"][era]["overall"], (key, era)
            assert json.loads(scores_file(tmp_path / f"{key}.zip", era).read_text()) == got[era].document
    # a store that is not there fails the call at once, named
    missing = ScoreJob(tmp_path / "missing.zarr", layout.truth, tmp_path / "missing.zip")
    late = ScoreJob(jobs[0].seg, layout.truth, tmp_path / "late.zip")
    with pytest.raises(FileNotFoundError, match=r"missing\.zarr: no prediction store here"):
        score_segmentations([missing, late, late], ["2026"], workers=8)


def test_scoring_beside_the_stages_keeps_its_evaluations_and_raises_its_errors(report_dir, tmp_path):
    # The report scores the single models in a background thread while the later stages run; leaving the block
    # waits for it, so the evaluation is on disk (read back by `score_stages`), and a failure is raised there.
    doc, layout = _doc(report_dir), Layout(report_dir)
    job = ScoreJob(layout.segmentation("uniform"), layout.truth, tmp_path / "uniform.zip")
    with scoring_beside([job], ["2026"], workers=1, plain_processes=1):
        pass
    saved = json.loads(scores_file(job.submission, "2026").read_text())
    assert saved["overall_score"] == _stage(doc, "uniform")["scores"]["2026"]["overall"]
    missing = ScoreJob(tmp_path / "missing.zarr", layout.truth, tmp_path / "missing.zip")
    with pytest.raises(FileNotFoundError, match=r"missing\.zarr"), \
            scoring_beside([missing], ["2026"], workers=1, plain_processes=1):
        pass
    with pytest.raises(RuntimeError, match="the stage's own error"), \
            scoring_beside([missing], ["2026"], workers=1, plain_processes=1):
        raise RuntimeError("the stage's own error")  # wins over the thread's



def test_scoring_beside_the_stages_scores_its_first_jobs_first(report_dir, tmp_path):
    # Stage 2's switch waits for the single models on the tuning crops (`first`) and reads their evaluations back,
    # while the others are still being scored; a failure among the first reaches the stage that waits for them.
    layout = Layout(report_dir)
    first = ScoreJob(layout.segmentation("uniform"), layout.truth, tmp_path / "first.zip")
    later = ScoreJob(layout.segmentation("uniform"), layout.truth, tmp_path / "later.zip")
    with scoring_beside([later], ["2026"], workers=1, plain_processes=1, first=[first]) as scoring:
        scoring.first.result(timeout=120)
        assert scores_file(first.submission, "2026").is_file()
        written = scores_file(first.submission, "2026").stat().st_mtime_ns
        score_segmentations([first], ["2026"], workers=1)  # read back, not scored again
        assert scores_file(first.submission, "2026").stat().st_mtime_ns == written
    assert scoring.all.done() and scores_file(later.submission, "2026").is_file()
    missing = ScoreJob(tmp_path / "missing.zarr", layout.truth, tmp_path / "missing.zip")
    with pytest.raises(FileNotFoundError, match=r"missing\.zarr"), \
            scoring_beside([later], ["2026"], workers=1, plain_processes=1, first=[missing]) as scoring:
        scoring.first.result(timeout=120)


def _stage(doc: dict, key: str) -> dict:
    return next(s for s in doc["stages"] if s["key"] == key)


def test_other_settings_in_the_same_directory_need_overwrite(report_dir, report_runs):
    with pytest.raises(ValueError, match=r"other settings .*tune_crops"):
        run_report(_options(report_runs, report_dir, tune_crops="1"))


def test_a_directory_that_is_not_a_report_is_never_touched(report_runs, tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a cellseg decide or report directory"):
        run_report(_options(report_runs, tmp_path, overwrite=True))
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_a_run_without_checkpoint_is_a_clear_error(report_runs, tmp_path, capsys):
    bare = tmp_path / "no_ckpt"
    shutil.copytree(report_runs[1], bare, ignore=shutil.ignore_patterns("checkpoints"))
    assert cli(["report", "--runs", str(report_runs[0]), str(bare), "--out", str(tmp_path / "r"), *FAST]) == 2
    err = capsys.readouterr().err
    assert str(bare) in err and "no checkpoint best.pt" in err
    assert not (tmp_path / "r").exists()  # checked before anything is written


def test_runs_with_incompatible_classes_are_a_clear_error(report_runs, tmp_path):
    other = tmp_path / "other_classes"
    shutil.copytree(report_runs[1], other)
    cfg = yaml.safe_load((other / "config.yaml").read_text())
    cfg["data"]["classes"] = ["mito", "er"]
    (other / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ValueError, match="incompatible classes") as err:
        run_report(_options([report_runs[0], other], tmp_path / "r"))
    assert str(other) in str(err.value) and "['mito', 'er']" in str(err.value)
    lacking = sorted(set(check_runs(report_runs)[0].classes) - {"mito", "er"})
    assert f"{other} lacks {lacking} and adds []" in str(err.value)  # the classes that differ, named
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("metrics", ["no validation record", "missing"])
def test_a_run_that_never_validated_is_refused_before_any_prediction(report_runs, tmp_path, capsys, metrics):
    run = tmp_path / "never_validated"
    shutil.copytree(report_runs[1], run)
    path = run / "metrics.jsonl"
    if metrics == "missing":
        path.unlink()
    else:
        path.write_text("".join(f"{line}\n" for line in path.read_text().splitlines() if '"val"' not in line))
    assert cli(["report", "--runs", str(report_runs[0]), str(run), "--out", str(tmp_path / "r"), *FAST,
                "--checkpoint", "last"]) == 2
    err = capsys.readouterr().err
    assert f"{run}: the run never validated" in err and metrics in err
    assert not (tmp_path / "r").exists()  # checked before anything is written


def test_one_run_an_unknown_crop_or_a_bad_option_is_refused(report_runs, tmp_path):
    with pytest.raises(ValueError, match="--workers 0: must be ≥ 1"):
        _options(report_runs, tmp_path / "r", workers=0)
    assert _options(report_runs, tmp_path / "r").scoring_workers == min(os.cpu_count() or 1, 16)
    with pytest.raises(ValueError, match=r"--overlap 1\.0"):
        _options(report_runs, tmp_path / "r", overlap=1.0)
    with pytest.raises(ValueError, match="at least 2 runs"):
        run_report(_options(report_runs[:1], tmp_path / "r"))
    with pytest.raises(ValueError, match="crop999: not a crop"):
        run_report(_options(report_runs, tmp_path / "r", crops="999"))


def test_tuning_on_the_scored_crops_is_reported_as_biased(report_runs, tiny_synth_root):
    runs = check_runs(report_runs)
    plan = plan_crops(runs, tiny_synth_root, crops="val", tune_crops="same")
    assert plan.tuning == plan.scored and "optimistically biased" in plan.notes[0]
    with pytest.raises(ValueError, match="tuning crops must be training crops"):
        plan_crops(runs, tiny_synth_root, crops="val", tune_crops="test")


def test_validation_crops_are_scored_on_the_report_crops_and_tuned_on_the_tuning_crops(report_runs, tiny_synth_root):
    runs = check_runs(report_runs)
    roles = dict(runs[0].roles)
    plan = plan_crops(runs, tiny_synth_root, crops="val")
    assert list(plan.scored) == [c for c, r in roles.items() if r == "report"] != []
    assert list(plan.tuning) == [c for c, r in roles.items() if r == "tuning"] != []
    assert plan.roles == roles and "not biased" in plan.notes[0]
    plan = plan_crops(runs, tiny_synth_root, crops="test")
    assert list(plan.tuning) == [c for c, r in roles.items() if r == "tuning"]  # decisions: tuning crops only


def test_the_table_has_intervals_changes_and_skipped_counts(report_dir):
    from cellseg.decide.bootstrap import DRAWS, SEED

    doc = _doc(report_dir)
    assert doc["bootstrap"] == {"unit": "scored crop", "draws": DRAWS, "seed": SEED, "level": 0.95,
                                "crops": ["crop501"], "paired_changes": True}
    for i, stage in enumerate(doc["stages"]):
        for s in stage["scores"].values():
            low, high = s["interval"]["overall"]
            assert s["overall"] is None or low <= s["overall"] <= high  # one scored crop: a point
            assert isinstance(s["skipped_crops"], int) and "decision_overall" in s
            assert ("change" in s) == (i > 0)
    text = (report_dir / "report.md").read_text()
    assert "2026 overall [95% CI]" in text and "2026 skipped" in text and "paired bootstrap" in text
    assert "the intervals are points" in text  # and the report says what one crop cannot show
    assert "**Tuning crops**" in text and "best single model (stage 1)" in text and "**Checkpoints**" in text
