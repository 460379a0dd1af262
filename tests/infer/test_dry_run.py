"""`--dry-run` of predict and predict-ensemble: the crops, the store's size against the free disk and the model
input, with nothing predicted or written; its sizes are those `check_store_disk` checks."""

from pathlib import Path

from cellseg.cli import main


def test_predict_dry_run_plans_without_writing(tiny_run, tmp_path, capsys):
    out = tmp_path / "val.zarr"
    assert main(["predict", str(tiny_run), "--crops", "val", "--out", str(out), "--device", "cpu", "--tta", "1",
                 "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "dry run: 2 crops of 'val' at 8×8×8 nm" in text and "nothing is predicted or written" in text
    assert "crop2" in text and "crop3" in text and "16×16×16" in text
    assert "total: 8,192 voxels" in text and "(fits)" in text
    assert "model input of unet_3d (unet_3d):" in text and "Gvoxels (TTA 1, overlap 0.5)" in text
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_ensemble_dry_run_counts_every_member(tiny_run, tiny_run_2d, tmp_path, capsys):
    out = tmp_path / "ens.zarr"
    assert main(["predict-ensemble", str(tiny_run), str(tiny_run_2d), "--crops", "val", "--out", str(out),
                 "--device", "cpu", "--uint8", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "(uint8, channels scored)" in text and text.count("model input of") == 2 and "TTA 8" in text
    assert not Path(out).exists()
