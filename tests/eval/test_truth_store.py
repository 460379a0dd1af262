"""`cellseg truth` writes the evaluator-layout truth of a data root's validation crops, which `evaluate` scores
a submission against; bad inputs are one-line errors."""

import json

import numpy as np
import zarr

from cellseg.cli import main
from cellseg.data.crops import Catalog
from cellseg.data.grid import Grid
from cellseg.data.split import read_datasplit
from cellseg.eval.rules import is_scored_as_instance
from cellseg.eval.truth import read_class_truth


def test_validation_truth_scores_a_submission(tiny_synth_root, tmp_path, capsys):
    truth = tmp_path / "val_truth.zarr"
    assert main(["truth", str(tiny_synth_root), "--out", str(truth), "--classes", "mito,er,nuc,ecs"]) == 0
    text = capsys.readouterr().out
    val = sorted(e.crop_name for e in read_datasplit(tiny_synth_root / "datasplit.csv") if e.split == "validate")
    assert f"label arrays of {len(val)} crops ({', '.join(val)})" in text
    catalog = Catalog.from_dir(tiny_synth_root)
    entries = {e.crop_name: e for e in read_datasplit(tiny_synth_root / "datasplit.csv")}
    for crop in val:
        for label in ("mito", "er", "nuc", "ecs"):
            array = zarr.open_array(str(truth / crop / label), mode="r")
            g = catalog.train[int(crop[4:])].labels[label]
            assert array.attrs["voxel_size"] == list(g.voxel_size_nm) and array.attrs["shape"] == list(g.shape_vox)
            assert array.dtype == (np.uint16 if is_scored_as_instance(label) else np.uint8)
            expected, _ = read_class_truth(entries[crop], label, Grid.of(
                translation_nm=g.translation_nm, shape_vox=g.shape_vox, voxel_size_nm=g.voxel_size_nm))
            np.testing.assert_array_equal(array[...], expected)
    # the truth itself, submitted at its own crops' grids, scores 1; a submission lacking mito scores less
    sub = tmp_path / "sub.zip"
    assert main(["submit", str(truth), "--truth", str(truth), "--out", str(sub)]) == 0
    assert "manifest: the crops of the truth store" in capsys.readouterr().out
    scores = tmp_path / "s.json"
    assert main(["evaluate", str(sub), str(truth), "--metric", "2026", "--json", str(scores)]) == 0
    doc = json.loads(scores.read_text())
    assert doc["overall_score"] == 1.0 and doc["total_evals"] == 4 * len(val)
    assert main(["submit", str(truth), "--truth", str(truth), "--out", str(sub), "--overwrite", "--labels", "er",
                 "nuc", "ecs"]) == 0
    assert main(["evaluate", str(sub), str(truth), "--metric", "2025", "--json", str(scores), "--overwrite"]) == 0
    assert json.loads(scores.read_text())["label_scores"]["mito"]["combined_score"] == 0


def test_truth_refuses_what_it_cannot_build(tiny_synth_root, tmp_path, capsys):
    out = tmp_path / "t.zarr"
    assert main(["truth", str(tiny_synth_root), "--out", str(out), "--crops", "test"]) == 2
    assert "is a test crop: its labels are not in" in capsys.readouterr().err and not out.exists()
    assert main(["truth", str(tiny_synth_root), "--out", str(out), "--crops", "999"]) == 2
    assert "crop '999' is neither a training nor a test crop" in capsys.readouterr().err
    assert main(["truth", str(tiny_synth_root), "--out", str(out), "--classes", "mitochondria"]) == 2
    assert "error:" in capsys.readouterr().err
    assert main(["truth", str(tiny_synth_root), "--out", str(out), "--crops", "2", "--classes", "mito"]) == 0
    assert main(["truth", str(tiny_synth_root), "--out", str(out), "--crops", "2", "--classes", "mito"]) == 2
    assert "pass overwrite=True (--overwrite)" in capsys.readouterr().err
    assert main(["truth", str(tiny_synth_root), "--out", str(out), "--crops", "3", "--classes", "er",
                 "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["crop3"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert main(["truth", str(tiny_synth_root), "--out", str(other), "--crops", "2", "--overwrite"]) == 2
    assert "replaces only a truth store" in capsys.readouterr().err and (other / "notes.txt").exists()


def _partly_annotated(root, tmp_path):
    """A copy of `root` whose crop2 annotates `cyto` in its first half of planes only (the rest at the "unknown"
    value 255, declared in the array's CellMap metadata); returns (copy, the class, the crop's known mask)."""
    import shutil

    copy = tmp_path / "root"
    shutil.copytree(root, copy)
    group = copy / "synth-iso4-1" / "synth-iso4-1.zarr" / "recon-1" / "labels" / "groundtruth" / "crop2" / "cyto"
    s0 = zarr.open_array(str(group / "s0"), mode="r+")
    data = s0[...]
    assert data.any()  # the class is there: a prediction of it can be right or wrong
    known = np.zeros(data.shape, bool)
    known[: data.shape[0] // 2] = True
    s0[...] = np.where(known, data, 255).astype(data.dtype)
    attrs = json.loads((group / ".zattrs").read_text()) if (group / ".zattrs").is_file() else {}
    attrs["cellmap"] = {"annotation": {"class_name": "cyto", "annotation_type": {
        "type": "semantic_segmentation", "encoding": {"absent": 0, "unknown": 255, "present": 1}}}}
    (group / ".zattrs").write_text(json.dumps(attrs))
    return copy, "cyto", known


def test_a_partly_annotated_class_is_refused_or_masked_never_silently_background(tiny_synth_root, tmp_path, capsys):
    from cellseg.data.write import write_array

    root, label, known = _partly_annotated(tiny_synth_root, tmp_path)
    out = tmp_path / "truth.zarr"
    args = ["truth", str(root), "--out", str(out), "--crops", "2", "--classes", label]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"crop2/{label} ({(~known).sum()} of {known.size} voxels)" in err and "--unannotated mask" in err
    assert not out.exists()
    assert main([*args, "--unannotated", "mask"]) == 0
    assert "masked (cyto_mask)" in capsys.readouterr().out
    np.testing.assert_array_equal(zarr.open_array(str(out / "crop2" / f"{label}_mask"), mode="r")[...], known)
    truth = zarr.open_array(str(out / "crop2" / label), mode="r")
    # a prediction right where the crop is annotated, and foreground everywhere it is not
    pred = tmp_path / "pred.zarr"
    write_array(pred / "crop2" / label, np.where(known, truth[...], 1).astype(np.uint8),
                attrs={k: truth.attrs[k] for k in ("voxel_size", "translation")})
    sub = tmp_path / "sub.zip"
    assert main(["submit", str(pred), "--truth", str(out), "--out", str(sub)]) == 0
    scores = tmp_path / "s.json"
    assert main(["evaluate", str(sub), str(out), "--metric", "2026-07", "--json", str(scores)]) == 0
    assert "mask their class and are not scored as classes" in capsys.readouterr().out
    doc = json.loads(scores.read_text())
    assert doc["label_scores"][label]["iou"] == 1.0 and set(doc["label_scores"]) == {label}
    # written as background instead, the same prediction loses what it predicted where nobody annotated
    assert main([*args, "--unannotated", "background", "--overwrite"]) == 0
    assert main(["evaluate", str(sub), str(out), "--metric", "2026-07", "--json", str(scores), "--overwrite"]) == 0
    assert json.loads(scores.read_text())["label_scores"][label]["iou"] < 1.0
