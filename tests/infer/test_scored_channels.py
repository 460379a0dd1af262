"""Test crops carry only the channels they are scored on: predict writes those labels and their boundary
channels, ensemble and postprocess keep each crop's subset, and the submission of either era is the same as
from every channel."""

import zipfile

import numpy as np

from cellseg.cli import main as cli
from cellseg.data.crops import Catalog
from cellseg.data.prediction_store import PredictionStore
from cellseg.decide.scoring import plain_segmentation
from cellseg.infer.crop_plan import scored_channels
from cellseg.viz.slices import load_prediction_slice


def test_scored_channels_keep_labels_and_their_boundaries():
    channels = ("mito", "er", "nuc", "mito_boundary", "nuc_boundary")
    assert scored_channels(channels, ("nuc", "er")) == ("er", "nuc", "nuc_boundary")
    assert scored_channels(channels, ()) == channels  # labels unknown (validation crops): everything
    assert scored_channels(channels, ("ves",)) == ()  # a label the model lacks gives no channel


def test_test_crops_hold_their_scored_channels_through_to_the_submission(tiny_run, tiny_synth_root, tmp_path):
    fast = ["--overlap", "0", "--tta", "1", "--device", "cpu"]
    scored, other, every = tmp_path / "a.zarr", tmp_path / "b.zarr", tmp_path / "all.zarr"
    assert cli(["predict", str(tiny_run), "--crops", "test", "--out", str(scored), *fast]) == 0
    assert cli(["predict", str(tiny_run), "--crops", "test", "--out", str(other), "--checkpoint", "last", *fast]) == 0
    assert cli(["predict", str(tiny_run), "--crops", "test", "--out", str(every), "--channels", "all", *fast]) == 0
    catalog = Catalog.from_dir(tiny_synth_root)
    labels = {f"crop{i}": {label for era in catalog.tests.values() if i in era for label in era[i].labels}
              for era in catalog.tests.values() for i in era}
    a, full = PredictionStore.open(scored), PredictionStore.open(every)
    subset_seen = False
    for crop in a.completed():
        held = a.crop_channels(crop)
        assert held == scored_channels(a.channels, sorted(labels[crop]))
        assert {c for c in held if c in a.classes} == labels[crop] & set(a.classes)
        assert full.crop_channels(crop) == full.channels
        subset_seen |= len(held) < len(a.channels)
        for channel in held:  # the same numbers as predicting every channel
            np.testing.assert_array_equal(a.read(crop, channel), full.read(crop, channel))
    assert subset_seen, "the tiny set should have a test crop scored on fewer classes than the model predicts"
    # The report's plain thresholding and the figures read a test crop's own channels.
    plain = plain_segmentation(a, tmp_path / "plain.zarr", a.completed())
    for crop in a.completed():
        assert plain.crop_channels(crop) == tuple(c for c in a.crop_channels(crop) if c in a.classes)
        shown = load_prediction_slice(scored, crop, truth_root=tiny_synth_root)
        assert set(shown.prediction) <= set(a.crop_channels(crop))

    ensemble, seg = tmp_path / "ens.zarr", tmp_path / "seg.zarr"
    assert cli(["ensemble", str(scored), str(other), "--out", str(ensemble), "--weights", "uniform"]) == 0
    assert cli(["postprocess", str(ensemble), "--out", str(seg), "--device", "cpu"]) == 0
    e, s = PredictionStore.open(ensemble), PredictionStore.open(seg)
    for crop in a.completed():
        assert e.crop_channels(crop) == a.crop_channels(crop)
        assert s.crop_channels(crop) == tuple(c for c in a.crop_channels(crop) if c in s.channels)
    # The submission (either era) is the same as from every channel: nothing it needs was left out.
    manifest = tiny_synth_root / "test_crop_manifest.csv"
    for era in ("2025", "2026"):
        zips = []
        for name, pred in (("scored", scored), ("all", every)):
            seg_dir, zip_path = tmp_path / f"seg_{name}_{era}.zarr", tmp_path / f"{name}_{era}.zip"
            assert cli(["postprocess", str(pred), "--out", str(seg_dir), "--device", "cpu"]) == 0
            assert cli(["submit", str(seg_dir), "--manifest", str(manifest), "--metric", era, "--out", str(zip_path)]) == 0
            zips.append(zipfile.ZipFile(zip_path))
        names = sorted(n for n in zips[0].namelist() if not n.endswith("/"))
        assert names and names == sorted(n for n in zips[1].namelist() if not n.endswith("/"))
        assert all(zips[0].read(n) == zips[1].read(n) for n in names)
