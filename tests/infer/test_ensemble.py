"""`cellseg ensemble`: weighted means of probability stores, resampling, auto weights, errors, atomic output."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from crafted import crop_truth
from crop_scores import score_semantic_2025, score_semantic_2026

from cellseg.cli import main
from cellseg.config.inference import EnsembleConfig, FitConfig
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore, quantise
from cellseg.data.split import read_datasplit
from cellseg.eval.crop_score import semantic_from_counts
from cellseg.infer.ensemble import ensemble
from cellseg.infer.ensemble_fit import candidate_weights, shrinkage
from cellseg.infer.members import read_on_grid
from cellseg.infer.weights import members_in_use, parse_weights, restrict_weights_file

GRID = Grid(translation_nm=(4.0, 4.0, 4.0), shape_vox=(8, 10, 12), voxel_size_nm=(8.0, 8.0, 8.0))
CHANNELS = ("mito", "er", "mito_boundary")


def write_store(path: Path, crops: dict[str, tuple[Grid, dict[str, np.ndarray]]], *, channels=CHANNELS,
                instance=("mito",), provenance=None) -> Path:
    store = PredictionStore.create(path, kind="probabilities", channels=channels, instance_channels=instance,
                                   provenance=provenance)
    for crop, (grid, arrays) in crops.items():
        store.write_crop(crop, grid, arrays, attrs={"dataset": "synth"})
    return path


def random_channels(seed: int, grid: Grid = GRID, channels=CHANNELS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {c: rng.random(grid.shape_vox, dtype=np.float32) for c in channels}


def test_uniform_ensemble_of_two_members_is_their_mean(tmp_path):
    a = write_store(tmp_path / "a.zarr", {"crop1": (GRID, random_channels(0)), "crop7": (GRID, random_channels(1))})
    b = write_store(tmp_path / "b.zarr", {"crop1": (GRID, random_channels(2)), "crop7": (GRID, random_channels(3))})
    result = ensemble(EnsembleConfig(members=(a, b)), tmp_path / "ens.zarr")
    out, sa, sb = result.store, PredictionStore.open(a), PredictionStore.open(b)
    assert out.channels == CHANNELS and out.instance_channels == ("mito",) and out.completed() == ["crop1", "crop7"]
    for crop in ("crop1", "crop7"):
        assert out.grid(crop) == GRID and out.crop_attrs(crop)["dataset"] == "synth"
        for c in CHANNELS:
            expected = (sa.read(crop, c) + sb.read(crop, c)) / 2
            np.testing.assert_allclose(out.read(crop, c), expected, atol=5e-4)  # float16 storage
    doc = json.loads((tmp_path / "ens.zarr" / "weights.json").read_text())
    assert doc["method"] == "uniform" and doc["channels"]["er"] == [0.5, 0.5]
    assert out.provenance["ensemble"]["weights"]["channels"]["mito_boundary"] == [0.5, 0.5]


def test_explicit_weights_are_normalised_and_checked(tmp_path):
    a = write_store(tmp_path / "a.zarr", {"crop1": (GRID, random_channels(0))})
    b = write_store(tmp_path / "b.zarr", {"crop1": (GRID, random_channels(1))})
    out = ensemble(EnsembleConfig(members=(a, b), weights=(3, 1)), tmp_path / "ens.zarr").store
    sa, sb = PredictionStore.open(a), PredictionStore.open(b)
    np.testing.assert_allclose(out.read("crop1", "er"), 0.75 * sa.read("crop1", "er") + 0.25 * sb.read("crop1", "er"),
                               atol=5e-4)
    with pytest.raises(ValueError, match="3 values for 2 member stores"):
        ensemble(EnsembleConfig(members=(a, b), weights=(1, 2, 3)), tmp_path / "e2.zarr")
    with pytest.raises(ValueError, match="non-negative"):
        ensemble(EnsembleConfig(members=(a, b), weights=(1, -1)), tmp_path / "e2.zarr")
    with pytest.raises(ValueError, match="expected 'uniform', 'auto'"):
        parse_weights("best")


def linear_field(grid: Grid) -> np.ndarray:
    """A probability field linear in world coordinates (nm): exact under linear/area resampling."""
    z, y, x = (t + v * np.arange(n) for t, v, n in zip(grid.translation_nm, grid.voxel_size_nm, grid.shape_vox,
                                                          strict=True))
    return (0.1 + 0.8 * (z[:, None, None] / 200 + y[None, :, None] / 400 + x[None, None, :] / 800) / 1.75
            ).astype(np.float32)


def test_members_on_different_voxel_sizes_meet_on_a_common_grid(tmp_path):
    # The same 128 nm field seen by an 8 nm model (uint8-quantised) and a 4 nm model: corners agree at 0 nm.
    g8 = Grid(translation_nm=(4.0, 4.0, 4.0), shape_vox=(16, 16, 16), voxel_size_nm=(8.0, 8.0, 8.0))
    g4 = Grid(translation_nm=(2.0, 2.0, 2.0), shape_vox=(32, 32, 32), voxel_size_nm=(4.0, 4.0, 4.0))
    ch = ("er",)
    coarse = write_store(tmp_path / "m8.zarr", {"crop3": (g8, {"er": quantise(linear_field(g8))})}, channels=ch,
                         instance=())
    fine = write_store(tmp_path / "m4.zarr", {"crop3": (g4, {"er": linear_field(g4)})}, channels=ch, instance=())
    out = ensemble(EnsembleConfig(members=(coarse, fine)), tmp_path / "finest.zarr").store  # default grid: finest
    assert out.grid("crop3") == g4
    # Up-sampling is linear; the outermost 4 nm voxels lie beyond the outer 8 nm centres (edge values repeat).
    inner = (slice(1, -1),) * 3
    np.testing.assert_allclose(out.read("crop3", "er")[inner], linear_field(g4)[inner], atol=3e-3)
    coarse_on_fine = read_on_grid(PredictionStore.open(coarse), "crop3", "er", g4)
    assert coarse_on_fine.dtype == np.float32 and not np.isnan(coarse_on_fine).any()

    out = ensemble(EnsembleConfig(members=(coarse, fine), grid="first"), tmp_path / "first.zarr").store
    assert out.grid("crop3") == g8
    # Down-sampling averages the two 4 nm voxels under each 8 nm voxel: exact for a linear field, edges included.
    np.testing.assert_allclose(out.read("crop3", "er"), linear_field(g8), atol=3e-3)


def test_a_member_that_covers_part_of_the_grid_is_averaged_only_where_it_covers(tmp_path):
    half = Grid(translation_nm=GRID.translation_nm, shape_vox=(4, 10, 12), voxel_size_nm=GRID.voxel_size_nm)
    a = write_store(tmp_path / "a.zarr", {"crop1": (GRID, {"er": np.full(GRID.shape_vox, 0.2, np.float32)})},
                    channels=("er",), instance=())
    b = write_store(tmp_path / "b.zarr", {"crop1": (half, {"er": np.full(half.shape_vox, 0.6, np.float32)})},
                    channels=("er",), instance=())
    er = ensemble(EnsembleConfig(members=(a, b), grid="first"), tmp_path / "ens.zarr").store.read("crop1", "er")
    np.testing.assert_allclose(er[:4], 0.4, atol=1e-3)
    np.testing.assert_allclose(er[5:], 0.2, atol=1e-3)  # slice 4 is the half-voxel edge (still inside b)


def test_incompatible_classes_are_a_clear_error_or_partial(tmp_path, caplog):
    a = write_store(tmp_path / "a.zarr", {"crop1": (GRID, random_channels(0))})
    b_channels = ("mito", "nuc")
    b = write_store(tmp_path / "b.zarr", {"crop1": (GRID, random_channels(1, channels=b_channels))},
                    channels=b_channels, instance=("mito", "nuc"))
    with pytest.raises(ValueError, match="incompatible classes") as err:
        ensemble(EnsembleConfig(members=(a, b)), tmp_path / "ens.zarr")
    message = str(err.value)
    assert f"{a} lacks ['nuc']" in message and f"{b} lacks ['er']" in message and "--allow-partial" in message
    c = write_store(tmp_path / "c.zarr", {"crop1": (GRID, random_channels(1, channels=("ecs",)))}, channels=("ecs",),
                    instance=())
    with pytest.raises(ValueError, match="share no class"):
        ensemble(EnsembleConfig(members=(a, c)), tmp_path / "ens.zarr")

    with caplog.at_level(logging.WARNING, logger="cellseg.infer.ensemble"):
        out = ensemble(EnsembleConfig(members=(a, b), allow_partial=True, weights=(1, 3)), tmp_path / "ens.zarr").store
    assert out.channels == ("mito", "er", "nuc", "mito_boundary")
    assert out.instance_channels == ("mito", "nuc")
    sa, sb = PredictionStore.open(a), PredictionStore.open(b)
    np.testing.assert_allclose(out.read("crop1", "er"), sa.read("crop1", "er"), atol=1e-3)  # a alone has er
    np.testing.assert_allclose(out.read("crop1", "nuc"), sb.read("crop1", "nuc"), atol=1e-3)
    np.testing.assert_allclose(out.read("crop1", "mito"), 0.25 * sa.read("crop1", "mito")
                               + 0.75 * sb.read("crop1", "mito"), atol=1e-3)
    np.testing.assert_allclose(out.read("crop1", "mito_boundary"), sa.read("crop1", "mito_boundary"), atol=1e-3)

    # Without --allow-partial, a boundary channel that only some members have is dropped, with a warning.
    d = write_store(tmp_path / "d.zarr", {"crop1": (GRID, random_channels(4, channels=("mito", "er")))},
                    channels=("mito", "er"))
    with caplog.at_level(logging.WARNING, logger="cellseg.infer.members"):
        out = ensemble(EnsembleConfig(members=(a, d)), tmp_path / "ens2.zarr").store
    assert out.channels == ("mito", "er")
    assert any("mito_boundary: dropped" in r.getMessage() and str(d) in r.getMessage() for r in caplog.records)


def test_crops_missing_in_a_member_are_skipped_with_a_log_line(tmp_path, caplog):
    a = write_store(tmp_path / "a.zarr", {"crop1": (GRID, random_channels(0)), "crop2": (GRID, random_channels(1))})
    b = write_store(tmp_path / "b.zarr", {"crop1": (GRID, random_channels(2)), "crop3": (GRID, random_channels(3))})
    with caplog.at_level(logging.WARNING, logger="cellseg.infer.members"):
        result = ensemble(EnsembleConfig(members=(a, b)), tmp_path / "ens.zarr")
    assert result.store.completed() == ["crop1"]
    assert result.skipped == {"crop2": [str(b)], "crop3": [str(a)]}
    lines = [r.getMessage() for r in caplog.records]
    assert any("crop2: skipped" in m and str(b) in m for m in lines)
    assert any("crop3: skipped" in m and str(a) in m for m in lines)


def test_output_is_written_atomically_and_replaced_only_with_overwrite(tmp_path):
    a = write_store(tmp_path / "a.zarr", {"crop1": (GRID, random_channels(0)), "crop2": (GRID, random_channels(1))})
    b = write_store(tmp_path / "b.zarr", {"crop1": (GRID, random_channels(2)), "crop2": (GRID, random_channels(3))})
    out = tmp_path / "ens.zarr"
    ensemble(EnsembleConfig(members=(a, b)), out)
    with pytest.raises(FileExistsError, match="--overwrite"):
        ensemble(EnsembleConfig(members=(a, b), weights=(1, 0)), out)
    assert json.loads((out / "weights.json").read_text())["method"] == "uniform"  # untouched
    ensemble(EnsembleConfig(members=(a, b), weights=(1, 0)), out, overwrite=True)
    assert json.loads((out / "weights.json").read_text())["method"] == "explicit"

    # A member breaking mid-way (crop2 unreadable) leaves neither an output nor temporary folders behind.
    (b / "crop2" / "er" / "s0" / ".zarray").unlink()
    with pytest.raises(FileNotFoundError):
        ensemble(EnsembleConfig(members=(a, b)), tmp_path / "broken.zarr")
    assert not (tmp_path / "broken.zarr").exists()
    with pytest.raises(FileNotFoundError):
        ensemble(EnsembleConfig(members=(a, b)), out, overwrite=True)
    assert json.loads((out / "weights.json").read_text())["method"] == "explicit"  # the old output survives
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.zarr", "b.zarr", "ens.zarr"]


def test_resume_keeps_the_crops_an_interrupted_run_wrote(tmp_path, caplog):
    crops = {f"crop{i}": (GRID, random_channels(i)) for i in (1, 2, 3)}
    a = write_store(tmp_path / "a.zarr", crops)
    b = write_store(tmp_path / "b.zarr", {name: (GRID, random_channels(10 + i)) for i, name in enumerate(crops)})
    fresh = ensemble(EnsembleConfig(members=(a, b)), tmp_path / "fresh.zarr").store
    out, partial = tmp_path / "ens.zarr", tmp_path / ".ens.zarr.partial"

    # A member breaking at crop2 (as a report cut there): crop1 stays in the hidden partial store, no output yet.
    zarray = b / "crop2" / "er" / "s0" / ".zarray"
    saved = zarray.read_bytes()
    zarray.unlink()
    with pytest.raises(FileNotFoundError):
        ensemble(EnsembleConfig(members=(a, b)), out, resume=True)
    assert not out.exists() and PredictionStore.open(partial).completed() == ["crop1"]
    zarray.write_bytes(saved)

    caplog.set_level(logging.INFO, logger="cellseg")
    done = ensemble(EnsembleConfig(members=(a, b)), out, resume=True).store
    assert "resuming, 1 of 3 crops written by an interrupted run" in caplog.text
    assert not partial.exists() and done.completed() == fresh.completed() == ["crop1", "crop2", "crop3"]
    for crop in crops:
        for c in CHANNELS:
            np.testing.assert_array_equal(done.read(crop, c), fresh.read(crop, c))
    assert json.loads((out / "weights.json").read_text())["crops"] == ["crop1", "crop2", "crop3"]

    # A partial made with other weights is started over, not mixed in.
    zarray.unlink()
    with pytest.raises(FileNotFoundError):
        # crop1 from b alone
        ensemble(EnsembleConfig(members=(a, b), weights=(0, 1)), tmp_path / "other.zarr", resume=True)
    zarray.write_bytes(saved)
    caplog.clear()
    other = ensemble(EnsembleConfig(members=(a, b), weights=(1, 0)), tmp_path / "other.zarr", resume=True).store
    assert "made with other members, weights or grid: started over" in caplog.text
    np.testing.assert_allclose(other.read("crop1", "er"), PredictionStore.open(a).read("crop1", "er"), atol=5e-4)


def test_bad_members_are_clear_errors(tmp_path):
    a = write_store(tmp_path / "a.zarr", {"crop1": (GRID, random_channels(0))})
    seg = PredictionStore.create(tmp_path / "seg.zarr", kind="segmentation", channels=("er",))
    with pytest.raises(ValueError, match="at least 2 member stores"):
        ensemble(EnsembleConfig(members=(a,)), tmp_path / "ens.zarr")
    with pytest.raises(ValueError, match="more than once"):
        ensemble(EnsembleConfig(members=(a, a)), tmp_path / "ens.zarr")
    with pytest.raises(ValueError, match=r"seg.zarr: holds segmentation"):
        ensemble(EnsembleConfig(members=(a, seg.path)), tmp_path / "ens.zarr")
    with pytest.raises(FileNotFoundError, match="no prediction store"):
        ensemble(EnsembleConfig(members=(a, tmp_path / "none.zarr")), tmp_path / "ens.zarr")
    with pytest.raises(ValueError, match="cannot be one of the members"):
        ensemble(EnsembleConfig(members=(a, tmp_path / "none.zarr")), a, overwrite=True)


# ------------------------------------------------------------------------------------------- auto weights


def good_and_bad_members(root: Path, tmp_path: Path, *, noisy: bool = False) -> tuple[Path, Path]:
    """Member A equals the truth; member B is its negative (1 − truth) or, `noisy`, the truth with 40 % of the
    voxels replaced by uniform noise; on the validation crops and crop1."""
    classes = ("mito", "er")
    good, bad = {}, {}
    rng = np.random.default_rng(0)
    for crop in ("crop1", "crop2", "crop3"):
        grid, truth = crop_truth(root, crop, classes)
        good[crop] = (grid, truth)
        if noisy:
            bad[crop] = (grid, {c: np.where(rng.random(p.shape) < 0.4, rng.random(p.shape, dtype=np.float32), p)
                                for c, p in truth.items()})
        else:
            bad[crop] = (grid, {c: 1 - p for c, p in truth.items()})
    provenance = {"data_root": str(root)}
    return (write_store(tmp_path / "good.zarr", good, channels=classes, provenance=provenance),
            write_store(tmp_path / "bad.zarr", bad, channels=classes, provenance=provenance))


def test_auto_weights_give_a_bad_member_less_weight_but_keep_it(tiny_synth_root, tmp_path):
    good, bad = good_and_bad_members(tiny_synth_root, tmp_path)
    # Validation crops come from the data root's datasplit (crop2, crop3), found through the provenance.
    result = ensemble(EnsembleConfig(members=(bad, good), weights="auto"), tmp_path / "ens.zarr")
    report = result.weights.report
    assert report["validation_crops"] == ["crop2", "crop3"] and report["metric"] == "2026-07"
    assert result.store.completed() == ["crop1", "crop2", "crop3"]  # every common crop is written
    for c in ("mito", "er"):
        fit = report["classes"][c]
        w_bad, w_good = result.weights.per_channel[c]
        assert 0 < w_bad < w_good
        assert fit["num_crops"] == 2 and fit["truth_voxels"] > 0
        assert fit["lambda"] == pytest.approx(shrinkage(0.5, 2, fit["truth_voxels"]))
        assert fit["lambda"] >= 0.875  # two crops: little evidence, strong pull to uniform
        assert fit["scores"]["members"][1] == 1.0 > fit["scores"]["members"][0]
        assert fit["scores"]["uniform"] < 1.0  # 0.5·t + 0.5·(1 − t) = 0.5 is never above the threshold
        assert fit["scores"]["fitted"] == fit["scores"]["final"] == 1.0
        assert fit["fitted_weights"] == pytest.approx([0.2, 0.8])  # the middle of the perfect plateau 0.6..1
    assert report["classes"]["mito"]["score"] == "foreground IoU"
    doc = json.loads((tmp_path / "ens.zarr" / "weights.json").read_text())
    assert doc["fit"]["classes"]["er"]["weights"] == list(result.weights.per_channel["er"])
    assert doc["members"][0]["path"] == str(bad)

    # The challenge-era metric with the official instance scorer for mito, crops named explicitly.
    fit = FitConfig(truth_root=str(tiny_synth_root), crops="2,crop3", metric="2025", instance_score="metric",
                    shrink=0.0)
    result = ensemble(EnsembleConfig(members=(bad, good), weights="auto", fit=fit), tmp_path / "ens2025.zarr")
    mito = result.weights.report["classes"]["mito"]
    assert mito["score"] == "combined_score" and mito["scores"]["members"][1] == 1.0
    w_bad, w_good = result.weights.per_channel["mito"]
    assert 0 < w_bad < w_good


def test_auto_weights_give_a_noisy_member_less_weight(tiny_synth_root, tmp_path):
    good, noisy = good_and_bad_members(tiny_synth_root, tmp_path, noisy=True)
    result = ensemble(EnsembleConfig(members=(good, noisy), weights="auto", fit=FitConfig(shrink=0.0)),
                      tmp_path / "ens.zarr")
    for c in ("mito", "er"):
        fit = result.weights.report["classes"][c]
        scores = fit["scores"]
        assert scores["members"][0] == 1.0 > scores["members"][1] > 0
        w_good, w_noisy = fit["fitted_weights"]
        assert w_good > w_noisy > 0  # the middle of the perfect plateau
        # The noise never flips the mean of the two across 0.5: uniform is as good, and the simplest of the tied.
        assert scores["uniform"] == scores["final"] == 1.0 and fit["chosen"] == "uniform"
        assert result.weights.per_channel[c] == (0.5, 0.5)


def test_auto_weights_need_labels_and_validation_crops(tiny_synth_root, tmp_path):
    a = write_store(tmp_path / "a.zarr", {"crop1": (GRID, random_channels(0))})
    b = write_store(tmp_path / "b.zarr", {"crop1": (GRID, random_channels(1))})
    with pytest.raises(ValueError, match="needs validation crops"):
        ensemble(EnsembleConfig(members=(a, b), weights="auto"), tmp_path / "ens.zarr")
    with pytest.raises(ValueError, match=r"not in every member store"):
        fit = FitConfig(truth_root=str(tiny_synth_root), crops="2")
        ensemble(EnsembleConfig(members=(a, b), weights="auto", fit=fit), tmp_path / "ens.zarr")
    with pytest.raises(ValueError, match="no validation crop is predicted by every member"):
        ensemble(EnsembleConfig(members=(a, b), weights="auto", fit=FitConfig(truth_root=str(tiny_synth_root))),
                 tmp_path / "ens.zarr")  # crop1 is training
    with pytest.raises(ValueError, match="is not a crop id"):
        FitConfig(truth_root=str(tiny_synth_root), crops="mito")


def _run_dir(tmp_path: Path, root: Path, name: str, roles: dict[str, str]) -> Path:
    """A run directory holding the data root's datasplit.csv and the given validation roles."""
    run = tmp_path / name
    run.mkdir()
    (run / "datasplit.csv").write_text((root / "datasplit.csv").read_text())
    (run / "validation_roles.csv").write_text("crop_name,role\n" + "".join(f"{c},{r}\n" for c, r in roles.items()))
    return run


def test_auto_weights_fit_on_the_runs_tuning_crops_only(tiny_synth_root, tmp_path):
    good, bad = good_and_bad_members(tiny_synth_root, tmp_path)
    run = _run_dir(tmp_path, tiny_synth_root, "run", {"crop2": "tuning", "crop3": "report"})
    provenance = {"data_root": str(tiny_synth_root), "run_dir": str(run)}  # as `cellseg predict` records them
    members = []
    for path in (bad, good):
        store = PredictionStore.open(path)
        crops = {c: (store.grid(c), {k: store.read(c, k) for k in store.classes}) for c in ("crop2", "crop3")}
        members.append(write_store(tmp_path / f"{path.stem}_run.zarr", crops, channels=store.classes,
                                   provenance=provenance))
    report = ensemble(EnsembleConfig(members=tuple(members), weights="auto"), tmp_path / "ens.zarr").weights.report
    assert report["validation_crops"] == ["crop2"] and report["crop_roles"] == {"crop2": "tuning"}
    assert report["combined"] == "decision mode"

    all_report = _run_dir(tmp_path, tiny_synth_root, "all_report", {"crop2": "report", "crop3": "report"})
    others = [write_store(tmp_path / f"other{i}.zarr", {"crop2": (GRID, random_channels(i, channels=("mito", "er")))},
                          channels=("mito", "er"), provenance={**provenance, "run_dir": str(all_report)})
              for i in range(2)]
    with pytest.raises(ValueError, match=r"all_report/datasplit.csv: no tuning crop .* all report crops"):
        ensemble(EnsembleConfig(members=tuple(others), weights="auto"), tmp_path / "ens2.zarr")
    assert not (tmp_path / "ens2.zarr").exists()


def test_auto_weights_are_scored_on_the_labels_grid_not_the_members(tiny_synth_root, tmp_path):
    """Members at twice the labels' voxel size: the fit counts truth voxels on the label grid (8× as many)."""
    members = []
    for name, flip in (("good", False), ("bad", True)):
        crops = {}
        for crop in ("crop2", "crop3"):
            grid, truth = crop_truth(tiny_synth_root, crop, ("er",))
            coarse = Grid.of(translation_nm=np.add(grid.translation_nm, np.multiply(grid.voxel_size_nm, 0.5)),
                             shape_vox=np.array(grid.shape_vox) // 2, voxel_size_nm=np.multiply(grid.voxel_size_nm, 2))
            p = truth["er"][::2, ::2, ::2][: coarse.shape_vox[0], : coarse.shape_vox[1], : coarse.shape_vox[2]]
            crops[crop] = (coarse, {"er": 1 - p if flip else p})
        members.append(write_store(tmp_path / f"{name}.zarr", crops, channels=("er",), instance=(),
                                   provenance={"data_root": str(tiny_synth_root)}))
    fits = {g: ensemble(EnsembleConfig(members=tuple(members), weights="auto", fit=FitConfig(score_grid=g)),
                        tmp_path / f"ens_{g}.zarr").weights.report for g in ("annotation", "ensemble")}
    labels = sum(int(crop_truth(tiny_synth_root, c, ("er",))[1]["er"].sum()) for c in ("crop2", "crop3"))
    assert fits["annotation"]["score_grid"] == "annotation"
    assert fits["annotation"]["classes"]["er"]["truth_voxels"] == labels
    assert fits["ensemble"]["classes"]["er"]["truth_voxels"] < labels / 4
    with pytest.raises(ValueError, match="score grid 'model' is not one of"):
        FitConfig(score_grid="model")


def test_a_class_no_tuning_crop_annotates_is_refused_before_fitting(tiny_synth_root, tmp_path):
    channels = ("mito", "mt")  # crop2 does not annotate microtubules
    a, b = (write_store(tmp_path / f"{n}.zarr", {"crop2": (GRID, random_channels(i, channels=channels))},
                        channels=channels, instance=("mito", "mt")) for i, n in enumerate("ab"))
    with pytest.raises(ValueError, match=r"no tuning crop annotates \['mt'\] \(tuning crops: \['crop2'\]\)"):
        fit = FitConfig(truth_root=str(tiny_synth_root), crops="2")
        ensemble(EnsembleConfig(members=(a, b), weights="auto", fit=fit), tmp_path / "ens.zarr")


def test_weights_restricted_to_the_members_in_use_give_the_same_ensemble(tmp_path):
    """A member of weight 0 for every channel can be left out (the report's stage 4 does not predict it with TTA):
    the restricted weights file over the others makes the same store, bit for bit."""
    stores = [write_store(tmp_path / f"{n}.zarr", {"crop1": (GRID, random_channels(seed))})
              for seed, n in enumerate("abc")]
    full = ensemble(EnsembleConfig(members=tuple(stores), weights=(1, 0, 3)), tmp_path / "full.zarr").store
    weights = tmp_path / "full.zarr" / "weights.json"
    assert members_in_use(weights) == [0, 2]
    restricted = restrict_weights_file(weights, [0, 2], tmp_path / "w02.json")
    doc = json.loads(restricted.read_text())
    assert doc["channels"]["er"] == [0.25, 0.75] and [m["path"] for m in doc["members"]] == [str(stores[0]),
                                                                                         str(stores[2])]
    part = ensemble(EnsembleConfig(members=(stores[0], stores[2]), weights=str(restricted)),
                    tmp_path / "part.zarr").store
    for c in CHANNELS:
        np.testing.assert_array_equal(part.read("crop1", c), full.read("crop1", c))
    with pytest.raises(ValueError, match=r"members \[2\] have positive weights"):
        restrict_weights_file(weights, [0, 1], tmp_path / "w01.json")
    assert not (tmp_path / "w01.json").exists()


def test_cli_prints_the_weights_and_reuses_a_weights_file(tiny_synth_root, tmp_path, capsys):
    good, bad = good_and_bad_members(tiny_synth_root, tmp_path)
    val = tmp_path / "ens_val.zarr"
    assert main(["ensemble", str(bad), str(good), "--out", str(val), "--weights", "auto", "--truth",
                 str(tiny_synth_root), "--metric", "2025", "--shrink", "0.2"]) == 0
    text = capsys.readouterr().out
    assert "fit on 2 validation crops, 2025 metric, shrink 0.2" in text and "mito" in text
    fitted = PredictionStore.open(val).provenance["ensemble"]["weights"]["channels"]
    assert main(["ensemble", str(bad), str(good), "--out", str(tmp_path / "ens_test.zarr"), "--weights",
                 str(val / "weights.json"), "--uint8"]) == 0
    applied = PredictionStore.open(tmp_path / "ens_test.zarr")
    assert applied.provenance["ensemble"]["weights"]["channels"] == fitted
    assert applied.provenance["data_root"] == str(tiny_synth_root)
    capsys.readouterr()
    assert main(["ensemble", str(bad), str(good), "--out", str(val)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["ensemble", "--help"])
    assert "--weights" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ pieces


def test_semantic_scores_from_counts_equal_the_official_scorers():
    rng = np.random.default_rng(0)
    for density in (0.0, 0.1, 0.5):
        pred, truth = rng.random(1000) < density, rng.random(1000) < density / 2
        tp = int(np.count_nonzero(pred & truth))
        fp, fn = int(np.count_nonzero(pred)) - tp, int(np.count_nonzero(truth)) - tp
        present = {"truth_voxels": tp + fn}  # the truth's foreground, which decisions read (`cellseg.eval.presence`)
        assert semantic_from_counts(tp, fp, fn, "2025") == {**score_semantic_2025(pred, truth), **present}
        assert semantic_from_counts(tp, fp, fn, "2026") == {**score_semantic_2026(pred, truth), **present}


def test_candidates_and_shrinkage_follow_the_documented_rules():
    for members, points in ((2, 11), (3, 37), (4, 35), (5, 6)):  # 3: the 1/7 grid misses uniform, added
        cands = candidate_weights(members)
        assert len(cands) == points and np.allclose(cands.sum(axis=1), 1) and (cands >= 0).all()
        assert np.allclose(cands[:members], np.eye(members)) and np.allclose(cands[members], 1 / members)
    assert shrinkage(0.5, 8, 10_000) == 0.5
    assert shrinkage(0.5, 0, 10_000) == 1.0
    assert shrinkage(0.5, 2, 10**6) == 0.875
    assert shrinkage(0.0, 8, 5_000) == 0.5


def test_ensemble_of_real_predictions_fits_on_the_runs_validation_crops(tiny_run, tmp_path, capsys):
    # Two `cellseg predict` stores of the smoke run (best and last checkpoints): the run directory in their
    # provenance gives the validation crops (its datasplit.csv) and the data root gives the labels.
    members = []
    for checkpoint in ("best", "last"):
        members.append(tmp_path / f"{checkpoint}.zarr")
        assert main(["-q", "predict", str(tiny_run), "--crops", "val", "--out", str(members[-1]), "--tta", "1",
                     "--checkpoint", checkpoint, "--device", "cpu"]) == 0
    out = tmp_path / "ens.zarr"
    assert main(["-q", "ensemble", *map(str, members), "--out", str(out), "--weights", "auto", "--device", "cpu"]) == 0
    store, first = PredictionStore.open(out), PredictionStore.open(members[0])
    validation = [e.crop_name for e in read_datasplit(tiny_run / "datasplit.csv") if e.split == "validate"
                  and e.role == "tuning"]  # the report crops are never fitted on
    report = json.loads((out / "weights.json").read_text())["fit"]
    assert report["validation_crops"] == validation and store.completed() == first.completed()
    assert store.channels == first.channels and store.instance_channels == first.instance_channels
    assert store.provenance["ensemble"]["members"][0]["run_dir"] == str(tiny_run.resolve())
    for channel, weights in store.provenance["ensemble"]["weights"]["channels"].items():
        assert sum(weights) == pytest.approx(1.0) and min(weights) > 0, channel
