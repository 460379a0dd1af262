"""The `evaluate`, `submit` and `validate-submission` sub-commands."""

import json

import numpy as np

from cellseg.cli import main
from cellseg.data.write import write_array


def test_evaluate_prints_the_era_and_writes_json(stores, three_balls, tmp_path, capsys):
    er = (three_balls > 0).astype(np.uint8)
    truth = stores.truth({"crop1": {"mito": three_balls, "er": er}, "crop2": {"er": er}})
    sub = stores.zip(stores.submission({"crop1": {"mito": three_balls, "er": er}}))
    out = tmp_path / "scores.json"
    assert main(["-v", "evaluate", str(sub), str(truth), "--metric", "2025", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2025 challenge-era metric" in text and "crop2 (missing)" in text
    doc = json.loads(out.read_text())
    assert doc["metric"] == "2025"
    assert {"overall_score", "overall_instance_score", "overall_semantic_score", "label_scores", "crop_scores",
            "missing"} <= set(doc)
    assert doc["label_scores"]["er"] == {"iou": 0.5, "dice_score": 0.5}
    assert doc["crop_scores"]["crop2"]["er"]["is_missing"] is True
    assert main(["evaluate", str(sub), str(truth), "--metric", "2026", "--json", str(out), "--overwrite"]) == 0
    assert "2026 metric (official code at 6b9ad68)" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert set(doc["label_scores"]["mito"]) == {"f1", "normalized_hausdorff_distance", "combined_score", "tp", "fp",
                                                "fn"}


def test_infinite_hausdorff_is_null_in_json(stores, three_balls, tmp_path):
    truth = stores.truth({"crop1": {"mito": three_balls}})
    sub = stores.submission({"crop1": {"mito": np.where(three_balls == 3, 0, three_balls)}})
    out = tmp_path / "s.json"
    assert main(["evaluate", str(sub), str(truth), "--metric", "2025", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["crop_scores"]["crop1"]["mito"]["hausdorff_distance"] is None
    assert doc["overall_semantic_score"] is None  # no semantic class: NaN in the 2025 code


def test_parallel_workers_give_the_same_numbers(stores, three_balls):
    from cellseg.eval import evaluate

    er = (three_balls > 0).astype(np.uint8)
    crops = {f"crop{i}": {"mito": np.roll(three_balls, i, axis=0), "er": er, "nuc": three_balls} for i in range(3)}
    truth = stores.truth(crops)
    sub = stores.submission({c: {"mito": three_balls, "er": np.roll(er, 1, axis=1)} for c in crops})
    for era in ("2025", "2026"):
        one = evaluate(sub, truth, metric=era, workers=1)
        two = evaluate(sub, truth, metric=era, workers=2)
        assert one.crop_scores == two.crop_scores and one.overall_score == two.overall_score


def test_bad_input_is_one_line_with_exit_2(tmp_path, capsys):
    (tmp_path / "bad.zip").write_bytes(b"PK\x03\x04 not really")
    assert main(["evaluate", str(tmp_path / "bad.zip"), str(tmp_path), "--metric", "2025"]) == 2
    assert main(["evaluate", str(tmp_path / "none.zip"), str(tmp_path), "--metric", "2026"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_submit_and_validate(tmp_path, capsys):
    manifest = tmp_path / "m.csv"
    manifest.write_text("crop_name,dataset,class_label,voxel_size,translation,shape\n"
                        "7,s,er,[8.0;8.0;8.0],[0.0;0.0;0.0],[16;16;16]\n7,s,mito,[8.0;8.0;8.0],[0.0;0.0;0.0],[16;16;16]\n")
    preds = tmp_path / "pred.zarr"
    write_array(preds / "crop7" / "er", np.ones((8, 8, 8), np.float32),
                attrs={"voxel_size": [16, 16, 16], "translation": [4, 4, 4]})
    out = tmp_path / "s.zip"
    assert main(["submit", str(preds), "--manifest", str(manifest), "--out", str(out)]) == 0
    assert "wrote 1 empty arrays for labels the prediction lacks: crop7/mito" in capsys.readouterr().out
    assert main(["submit", str(preds), "--manifest", str(manifest), "--out", str(out)]) == 2
    assert main(["validate-submission", str(out), "--manifest", str(manifest)]) == 0  # mito written empty
    assert "0 error(s)" in capsys.readouterr().out
    assert main(["submit", str(preds), "--manifest", str(manifest), "--out", str(out), "--overwrite",
                 "--allow-missing"]) == 0
    assert "left out 1 labels the prediction lacks, each scored as missing" in capsys.readouterr().out
    assert main(["validate-submission", str(out), "--manifest", str(manifest)]) == 1  # mito missing
    text = capsys.readouterr().out
    assert "crop7/mito: label absent" in text and "1 error(s)" in text
    assert "2025: scores 0 on a crop holding 100.0% of mito's volume weight" in text
    assert main(["validate-submission", str(out), "--manifest", str(manifest), "--allow-missing"]) == 0
    text = capsys.readouterr().out
    assert "warning crop7/mito: label absent; scored as missing (allowed by --allow-missing)" in text
    assert "0 error(s)" in text


def test_the_same_evaluation_again_replaces_its_own_json_only(stores, three_balls, tmp_path, capsys):
    """A re-run (the demo run again) refreshes the score file it wrote; another evaluation's file is kept."""
    truth = stores.truth({"crop1": {"mito": three_balls}})
    sub = stores.zip(stores.submission({"crop1": {"mito": three_balls}}))
    out = tmp_path / "scores.json"
    command = ["evaluate", str(sub), str(truth), "--metric", "2026", "--json", str(out)]
    assert main(command) == 0
    first = out.read_text()
    assert json.loads(first)["inputs"] == {"submission": str(sub.resolve()), "truth": str(truth.resolve()),
                                           "metric": "2026"}
    assert main(command) == 0 and out.read_text() == first
    capsys.readouterr()
    assert main([*command[:4], "2025", *command[5:]]) == 2  # another metric's scores are not replaced silently
    assert "is not this evaluation's score file" in capsys.readouterr().err and out.read_text() == first
