"""An imported test box gets its truth from the user's held-out labels (`cellseg truth --crops test --label`),
given at the EM's shape or the box's; `evaluate` then scores a submission of the box against it."""

import json

import numpy as np
import zarr

from cellseg.cli import main
from cellseg.data.write import write_array


def _import(inputs, tmp_path, root):
    """Labels of z 0-15 only (the rest is held out) and a test box at z 20-23."""
    return ["import", inputs["em"], "--voxel-size", "40,5,5", "--out", str(root), "--label",
            f"mito={tmp_path / 'train_mito.npy'}", "--labels-voxel-size", "40,5,5", "--gap-nm", "40",
            "--crop-nm", "200", "--test-box", "20:24,0:96,0:96"]


def test_an_imported_test_box_is_scored_against_held_out_labels(tmp_path, inputs, arrays, capsys):
    np.save(tmp_path / "train_mito.npy", arrays["mito_ids"][:16])
    root = tmp_path / "root"
    assert main(_import(inputs, tmp_path, root)) == 0
    capsys.readouterr()
    truth = tmp_path / "test_truth.zarr"
    assert main(["truth", str(root), "--crops", "test", "--label", f"mito={inputs['mito']}",  # the EM's shape
                 "--out", str(truth)]) == 0
    crop = next(p.name for p in truth.iterdir() if p.name.startswith("crop"))
    array = zarr.open_array(str(truth / crop / "mito"), mode="r")
    assert array.attrs["voxel_size"] == [40, 5, 5] and array.attrs["translation"] == [800, 0, 0]
    np.testing.assert_array_equal(array[...], arrays["mito_ids"][20:24])  # the box, cut where it lies
    np.save(tmp_path / "box.npy", arrays["mito_ids"][20:24])  # the box's own shape gives the same truth
    again = tmp_path / "again.zarr"
    assert main(["truth", str(root), "--crops", "test", "--label", f"mito={tmp_path / 'box.npy'}",
                 "--out", str(again)]) == 0
    np.testing.assert_array_equal(zarr.open_array(str(again / crop / "mito"), mode="r")[...], array[...])
    # a submission of the held-out ids themselves scores 1 against it
    preds = tmp_path / "pred.zarr"
    write_array(preds / crop / "mito", arrays["mito_ids"][20:24], attrs={"voxel_size": [40, 5, 5],
                                                                          "translation": [800, 0, 0]})
    sub, scores = tmp_path / "sub.zip", tmp_path / "s.json"
    assert main(["submit", str(preds), "--data-root", str(root), "--out", str(sub)]) == 0
    assert main(["evaluate", str(sub), str(truth), "--metric", "2026", "--json", str(scores)]) == 0
    assert json.loads(scores.read_text())["label_scores"]["mito"]["combined_score"] == 1.0


def test_a_label_volume_of_another_shape_is_refused(tmp_path, inputs, arrays, capsys):
    np.save(tmp_path / "train_mito.npy", arrays["mito_ids"][:16])
    root = tmp_path / "root"
    assert main(_import(inputs, tmp_path, root)) == 0
    np.save(tmp_path / "odd.npy", arrays["mito_ids"][:5])
    out = tmp_path / "t.zarr"
    assert main(["truth", str(root), "--crops", "test", "--label", f"mito={tmp_path / 'odd.npy'}",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "shape (5, 96, 96) is neither the crop's (4, 96, 96) nor the EM's (24, 96, 96)" in err
    assert not out.exists()
