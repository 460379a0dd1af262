"""Import → train (the written train_*.yaml, no data override) → predict the validation crops, tiny and on CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cellseg.cli import main
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.split import read_datasplit


def test_import_train_predict(tmp_path: Path, import_args) -> None:
    root, run = tmp_path / "root", tmp_path / "run"
    assert main(["-q", *import_args(root)]) == 0
    assert main(["-q", "train", str(root / "train_unet_2d.yaml"), f"run_dir={run}"]) == 0
    assert (run / "checkpoints" / "last.pt").is_file()
    split = read_datasplit(run / "datasplit.csv")
    imported = read_datasplit(root / "datasplit.csv")  # the imported split, not a catalogue split; the run adds
    assert [(e.crop_name, e.split) for e in split] == [(e.crop_name, e.split) for e in imported]  # roles
    assert all(e.role in ("tuning", "report") for e in split if e.split == "validate")
    out = tmp_path / "pred.zarr"
    assert main(["-q", "predict", str(run), "--crops", "val", "--out", str(out), "--tta", "1", "--overlap", "0"]) == 0
    store = PredictionStore.open(out)
    assert store.completed() == sorted(e.crop_name for e in split if e.split == "validate")
    grid = store.grid(store.completed()[0])
    assert grid.voxel_size_nm == (40.0, 5.0, 5.0)
    probabilities = store.read(store.completed()[0], "mito")
    assert probabilities.shape == grid.shape_vox and np.all((probabilities >= 0) & (probabilities <= 1))
