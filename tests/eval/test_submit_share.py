"""`cellseg submit` refuses a submission that is nearly all empty arrays, takes the data root's own test manifest
by default, and `validate-submission` reports the share of all-zero arrays."""

import zipfile

import numpy as np

from cellseg.cli import main
from cellseg.cli.submit import MIN_SHARE_TEXT
from cellseg.data.crops import Catalog
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.write import write_array
from cellseg.eval.submit import MIN_PREDICTED_SHARE

ROW = "[8.0;8.0;8.0],[0.0;0.0;0.0],[16;16;16]"


def _manifest(tmp_path, crops=(7, 8), labels=("er", "mito", "nuc", "ecs", "pm")):
    path = tmp_path / "m.csv"
    path.write_text("crop_name,dataset,class_label,voxel_size,translation,shape\n"
                    + "".join(f"{c},s,{label},{ROW}\n" for c in crops for label in labels))
    return path


def _predict(store, crops):
    """Binary masks of ones for {crop name: labels} on the manifest rows' grid."""
    for crop, labels in crops.items():
        for label in labels:
            write_array(store / crop / label, np.ones((16, 16, 16), np.uint8),
                        attrs={"voxel_size": [8, 8, 8], "translation": [0, 0, 0]})
    return store


def test_the_share_text_is_the_constant():
    assert MIN_SHARE_TEXT == f"{MIN_PREDICTED_SHARE * 100:g} %"


def test_predictions_of_other_crops_are_refused_unless_allowed(tmp_path, capsys):
    manifest, preds = _manifest(tmp_path), _predict(tmp_path / "pred.zarr", {"crop9": ["er", "mito"]})
    out = tmp_path / "s.zip"
    assert main(["submit", str(preds), "--manifest", str(manifest), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "only 0 of the manifest's 10 (crop, label) pairs (0.0%)" in err and "fewer than 10%" in err
    assert "--allow-empty" in err and "--manifest or --data-root" in err and "Traceback" not in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m.csv", "pred.zarr"]
    assert main(["submit", str(preds), "--manifest", str(manifest), "--out", str(out), "--allow-empty"]) == 0
    captured = capsys.readouterr()
    assert "0 arrays from the predictions (0.0% of 10 (crop, label) pairs)" in captured.out
    assert "warning: only 0 of 10 (crop, label) pairs come from the predictions" in captured.err
    assert main(["validate-submission", str(out), "--manifest", str(manifest)]) == 1
    text = capsys.readouterr().out
    assert "warning submission: arrays all zeros: 10 of 10 (100.0%): fewer than 10% hold a prediction" in text
    assert "error   submission: every one of its 10 arrays is all zeros: nothing was predicted" in text
    assert main(["validate-submission", str(out), "--manifest", str(manifest), "--allow-empty"]) == 0
    assert "0 error(s)" in capsys.readouterr().out


TEN = ("er", "mito", "nuc", "ecs", "pm", "ves", "endo", "lyso", "ld", "perox")


def test_a_share_at_the_bound_is_written_and_validated_as_info(tmp_path, capsys):
    manifest = _manifest(tmp_path, crops=(7,), labels=TEN)
    preds = _predict(tmp_path / "pred.zarr", {"crop7": ["er"]})  # 1 of 10
    out = tmp_path / "s.zip"
    assert main(["submit", str(preds), "--manifest", str(manifest), "--out", str(out)]) == 0
    assert "1 arrays from the predictions (10.0% of 10" in capsys.readouterr().out
    assert main(["validate-submission", str(out), "--manifest", str(manifest)]) == 0
    text = capsys.readouterr().out
    assert "arrays all zeros: 9 of 10 (90.0%)" in text and "fewer than" not in text


def _predict_test_crops(store, root):
    for crop in Catalog.from_dir(root).test().values():
        for label, g in crop.labels.items():
            write_array(store / crop.name / label, np.ones(g.shape_vox, np.uint8),
                        attrs={"voxel_size": list(g.voxel_size_nm), "translation": list(g.translation_nm)})
    return store


def test_the_data_roots_test_manifest_is_the_default(tiny_synth_root, tmp_path, capsys):
    store = PredictionStore.create(tmp_path / "seg.zarr", kind="segmentation", channels=["mito"],
                                   provenance={"data_root": str(tiny_synth_root)}).path
    _predict_test_crops(store, tiny_synth_root)
    out = tmp_path / "s.zip"
    assert main(["submit", str(store), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"manifest: {tiny_synth_root / 'test_crop_manifest.csv'} (the data root the predictions record)" in text
    assert "wrote" in text and "62 arrays from the predictions (100.0% of 62" in text
    names = {n.rsplit("/", 2)[0] for n in zipfile.ZipFile(out).namelist() if n.endswith(".zarray")}
    assert names == {"crop501", "crop502"}
    # validate-submission with its defaults checks against the manifest the zip records: 0 errors, not 432
    assert main(["validate-submission", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"manifest: the manifest {out} records it was written for ({tiny_synth_root}" in text
    assert "0 error(s)" in text
    plain = _predict_test_crops(tmp_path / "plain.zarr", tiny_synth_root)  # no provenance: --data-root says it
    assert main(["submit", str(plain), "--data-root", str(tiny_synth_root), "--out", str(out), "--overwrite"]) == 0
    assert "(--data-root)" in capsys.readouterr().out
    # without either, the packaged official manifest: none of its crops is predicted here
    assert main(["submit", str(plain), "--out", str(tmp_path / "o.zip")]) == 2
    err = capsys.readouterr().err
    assert "the packaged official 2026 test manifest" in err and "only 0 of the manifest's" in err


def test_a_data_root_without_a_test_manifest_is_named(tmp_path, capsys):
    preds = _predict(tmp_path / "pred.zarr", {"crop7": ["er"]})
    assert main(["submit", str(preds), "--data-root", str(tmp_path), "--out", str(tmp_path / "s.zip")]) == 2
    assert f"--data-root {tmp_path}: no test_crop_manifest.csv there" in capsys.readouterr().err


def _probabilities(store, crops, value):
    """float32 probabilities of `value` everywhere for {crop name: labels} on the manifest rows' grid."""
    for crop, labels in crops.items():
        for label in labels:
            write_array(store / crop / label, np.full((16, 16, 16), value, np.float32),
                        attrs={"voxel_size": [8, 8, 8], "translation": [0, 0, 0]})
    return store


def test_an_all_zero_submission_or_crop_is_refused_unless_allowed(tmp_path, capsys):
    manifest = _manifest(tmp_path, labels=("er", "ecs"))
    every = {"crop7": ["er", "ecs"], "crop8": ["er", "ecs"]}
    low = _probabilities(tmp_path / "low.zarr", every, 0.3)  # below the threshold everywhere: all zeros
    out = tmp_path / "s.zip"
    assert main(["submit", str(low), "--manifest", str(manifest), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "every one of the submission's 4 arrays is all zeros" in err and "--threshold 0.5" in err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".s.zip")]
    assert main(["submit", str(low), "--manifest", str(manifest), "--out", str(out), "--threshold", "0.2"]) == 0
    capsys.readouterr()
    # one crop all zeros (crop 8 predicted below the threshold), the other predicted: refused, the crop named
    mixed = _probabilities(_probabilities(tmp_path / "mixed.zarr", {"crop7": ["er", "ecs"]}, 0.9),
                           {"crop8": ["er", "ecs"]}, 0.1)
    assert main(["submit", str(mixed), "--manifest", str(manifest), "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "every array of 1 crop(s) is all zeros" in err and "crop8 (ecs, er)" in err
    assert main(["submit", str(mixed), "--manifest", str(manifest), "--out", str(out), "--overwrite",
                 "--allow-empty"]) == 0
    assert "2 arrays from the predictions are all zeros: crop8/ecs, crop8/er" in capsys.readouterr().err
    assert main(["validate-submission", str(out)]) == 1  # the recorded manifest, crop 8 an error
    text = capsys.readouterr().out
    assert "error   crop8: every one of its 2 arrays is all zeros (ecs, er)" in text
    assert main(["validate-submission", str(out), "--allow-empty"]) == 0
    assert "warning crop8: every one of its 2 arrays is all zeros" in capsys.readouterr().out


def test_a_class_all_zero_in_every_crop_is_named(tmp_path, capsys):
    manifest = _manifest(tmp_path, labels=("er", "ecs"))
    preds = _probabilities(_probabilities(tmp_path / "p.zarr", {"crop7": ["er"], "crop8": ["er"]}, 0.9),
                           {"crop7": ["ecs"], "crop8": ["ecs"]}, 0.1)
    out = tmp_path / "s.zip"
    assert main(["submit", str(preds), "--manifest", str(manifest), "--out", str(out)]) == 0
    assert "warning: 1 classes are all zeros in every crop: ecs" in capsys.readouterr().err
    assert main(["validate-submission", str(out)]) == 0
    assert "warning submission: 1 classes are all zeros in every crop that has them: ecs" in capsys.readouterr().out


def test_a_decided_submission_scored_under_another_era_says_so(tiny_synth_root, tmp_path, capsys):
    store = PredictionStore.create(tmp_path / "seg.zarr", kind="segmentation", channels=["mito"],
                                   provenance={"data_root": str(tiny_synth_root),
                                               "decisions": {"era": "2025", "file": "decide/decisions.json"}}).path
    _predict_test_crops(store, tiny_synth_root)
    out = tmp_path / "s.zip"
    assert main(["submit", str(store), "--out", str(out)]) == 0
    assert "decoded as decided for the 2025 metric (decide/decisions.json)" in capsys.readouterr().out
    truth = str(tiny_synth_root / "ground_truth.zarr")
    assert main(["evaluate", str(out), truth, "--metric", "2026-07"]) == 0
    assert ("note: this submission was decoded as decided for the 2025 metric (decide/decisions.json); it is "
            "scored here under 2026-07") in capsys.readouterr().out
    assert main(["evaluate", str(out), truth, "--metric", "2025"]) == 0
    assert "note:" not in capsys.readouterr().out
