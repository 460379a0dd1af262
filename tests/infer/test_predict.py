"""`cellseg predict` on the tiny trained runs: the store it writes, resume, errors, 2D slicing, the engine
shared with validation, and crops shared among two processes."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cellseg.cli import main as cli
from cellseg.config.inference import InferConfig
from cellseg.data.crops import Catalog
from cellseg.data.loader import open_crops
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.split import read_datasplit
from cellseg.infer.crop_plan import crop_grid
from cellseg.infer.engine import Window, predict_volume
from cellseg.infer.predict import predict_run
from cellseg.infer.run import load_run
from cellseg.infer.selection import select_targets
from cellseg.infer.tiling import count_tiles

INSTANCE = ("mito", "nuc", "ld")


def _val_names(run: Path) -> list[str]:
    return sorted(e.crop_name for e in read_datasplit(run / "datasplit.csv") if e.split == "validate")


def _test_crops(root: Path) -> dict:
    return Catalog.from_dir(root).test("2026")


def test_predict_val_and_test_writes_the_store(tiny_run, tiny_synth_root, tmp_path, capsys, caplog):
    out = tmp_path / "pred.zarr"
    fast = ["--overlap", "0", "--batch-size", "8"]  # fewer tiles; TTA 8 as by default
    caplog.set_level("INFO", logger="cellseg")
    assert cli(["predict", str(tiny_run), "--crops", "val", "--out", str(out), *fast]) == 0
    assert "on the CPU with 8x test-time augmentation" in caplog.text and "--tta 1" in caplog.text  # the hint
    assert cli(["predict", str(tiny_run), "--crops", "test", "--out", str(out), *fast]) == 0
    printed = capsys.readouterr().out
    store = PredictionStore.open(out)
    meta = json.loads((tiny_run / "meta.json").read_text())
    assert store.kind == "probabilities"
    assert store.channels == tuple(meta["channels"]) and "mito_boundary" in store.channels
    assert store.instance_channels == INSTANCE
    tests = _test_crops(tiny_synth_root)
    assert store.completed() == sorted(_val_names(tiny_run) + [c.name for c in tests.values()])
    for name in store.completed():
        assert f"{name} (" in printed and "Mvox/s" in printed
    prov = store.provenance
    assert prov["tta"] == 8 and len(set(prov["tta_transforms"])) == 8 and prov["checkpoint_step"] == 4
    assert prov["run_dir"] == str(tiny_run.resolve()) and prov["checkpoint"].endswith("best.pt")
    for key in ("overlap", "blend", "model", "voxel_size_nm", "cellseg_version", "date"):
        assert key in prov
    # Test crops: their manifest box on the model's 8 nm grid, read from the full EM.
    for crop in tests.values():
        geometry = crop.geometry
        grid = store.grid(crop.name)
        assert grid.voxel_size_nm == (8.0, 8.0, 8.0)
        extent = np.multiply(grid.shape_vox, grid.voxel_size_nm)
        np.testing.assert_allclose(extent, geometry.extent_nm, atol=8)
        start = np.subtract(grid.translation_nm, 4.0)
        assert np.all(np.abs(start - geometry.start_nm) <= 4.0 + 1e-6)
        assert store.crop_attrs(crop.name)["split"] == "test"
    # Validation crops: exactly the grid validation during training uses.
    run = load_run(tiny_run)
    for source in open_crops([e for e in read_datasplit(tiny_run / "datasplit.csv") if e.split == "validate"],
                             run.cfg.data):
        assert store.grid(source.name) == crop_grid(source, run.cfg.data.voxel_size_nm)
    data = store.read(store.completed()[0], "mito")
    assert data.dtype == np.float32 and 0.0 <= data.min() and data.max() <= 1.0
    raw = store.image(store.completed()[0], "mito").read_level("s0")
    assert raw.dtype == np.float16


def test_uint8_store_and_ids(tiny_run, tiny_synth_root, tmp_path, caplog):
    test_ids = sorted(_test_crops(tiny_synth_root))
    out = tmp_path / "u8.zarr"
    caplog.set_level("INFO", logger="cellseg")
    assert cli(["predict", str(tiny_run), "--crops", f"{test_ids[0]},crop1", "--out", str(out), "--tta", "1",
                "--uint8", "--checkpoint", "last", "--overlap", "0"]) == 0
    assert "test-time augmentation" not in caplog.text  # no hint without TTA
    store = PredictionStore.open(out)
    assert store.completed() == sorted([f"crop{test_ids[0]}", "crop1"])
    assert store.image("crop1", "er").read_level("s0").dtype == np.uint8
    assert store.provenance["dtype"] == "uint8" and store.provenance["tta_transforms"] == ["identity"]
    assert store.crop_attrs("crop1")["split"] == "train"


def test_resume_skips_finished_crops_and_ignores_temporary_ones(tiny_run, tiny_synth_root, tmp_path):
    out = tmp_path / "pred.zarr"
    opts = InferConfig(tta=1, overlap=0.0, progress=False)
    first = predict_run(tiny_run, "val", out, opts)
    assert [s["crop"] for s in first] == _val_names(tiny_run)
    store = PredictionStore.open(out)
    written = {c: store.crop_attrs(c)["date"] for c in store.completed()}
    # A killed writer leaves a hidden partial crop folder: it is not counted, and without a progress record
    # it cannot be resumed, so it is replaced.
    test_names = [c.name for c in _test_crops(tiny_synth_root).values()]
    stale = out / f".{test_names[0]}.partial"
    (stale / "mito" / "junk").mkdir(parents=True)
    assert store.completed() == _val_names(tiny_run) and test_names[0] not in store
    again = predict_run(tiny_run, ",".join(_val_names(tiny_run) + test_names), out, opts)
    assert sorted(s["crop"] for s in again) == sorted(test_names)  # only the missing ones
    assert not stale.exists() and not any(store.path.glob(".*partial"))
    assert {c: store.crop_attrs(c)["date"] for c in written} == written  # finished crops untouched
    assert predict_run(tiny_run, "val", out, opts) == []
    # Other settings than the store's: refused (named), unless --overwrite replaces the store.
    with pytest.raises(ValueError, match="tta_transforms"):
        predict_run(tiny_run, "val", out, InferConfig(tta=8, overlap=0.0, progress=False))
    redo = predict_run(tiny_run, "val", out, InferConfig(tta=8, overlap=0.0, overwrite=True, progress=False))
    assert [s["crop"] for s in redo] == _val_names(tiny_run)
    assert PredictionStore.open(out).completed() == _val_names(tiny_run)


def test_run_without_checkpoint_is_a_clear_error(tiny_run, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.yaml", "meta.json", "datasplit.csv"):
        shutil.copy(tiny_run / name, bare / name)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint best\.pt .*present: none"):
        load_run(bare)
    (bare / "checkpoints").mkdir()
    shutil.copy(tiny_run / "checkpoints" / "last.pt", bare / "checkpoints" / "last.pt")
    with pytest.raises(FileNotFoundError, match="--checkpoint last"):
        load_run(bare)
    assert load_run(bare, "last").step == 4
    (bare / "checkpoints" / "best.pt").write_bytes(b"truncated")
    with pytest.raises(ValueError, match=r"best\.pt: not a readable checkpoint"):
        load_run(bare)
    assert cli(["predict", str(tmp_path / "nowhere"), "--crops", "val", "--out", str(tmp_path / "p.zarr")]) == 2
    assert "config.yaml: missing" in capsys.readouterr().err


def test_unknown_crop_id_is_named(tiny_run, tmp_path, capsys):
    run = load_run(tiny_run)
    with pytest.raises(ValueError, match="crop 999 is in neither"):
        select_targets("1,999", run.cfg, tiny_run)
    with pytest.raises(ValueError, match="'mito' is not a crop id"):
        select_targets("mito", run.cfg, tiny_run)
    assert cli(["predict", str(tiny_run), "--crops", "999", "--out", str(tmp_path / "p.zarr")]) == 2
    assert "crop 999" in capsys.readouterr().err
    assert not (tmp_path / "p.zarr").exists()


def test_data_root_override_reads_the_other_root(tiny_run, tiny_synth_root, tmp_path):
    other = tmp_path / "moved_root"
    shutil.copytree(tiny_synth_root, other)  # 3 MiB
    out = tmp_path / "pred.zarr"
    predict_run(tiny_run, "val", out, InferConfig(tta=1, overlap=0.0, data_root=str(other), progress=False))
    store = PredictionStore.open(out)
    assert all(store.crop_attrs(c)["em_url"].startswith(str(other)) for c in store.completed())
    assert store.provenance["data_root"] == str(other)


def test_validation_and_predict_share_the_engine(tiny_run, tmp_path):
    # `cellseg predict --tta 1` with validation's overlap equals what validation computes (as float16).
    run = load_run(tiny_run)
    cfg = run.cfg
    out = tmp_path / "pred.zarr"
    predict_run(tiny_run, "val", out, InferConfig(tta=1, overlap=cfg.val.overlap, progress=False))
    store = PredictionStore.open(out)
    entries = [e for e in read_datasplit(tiny_run / "datasplit.csv") if e.split == "validate"]
    source = open_crops(entries, cfg.data)[0]
    grid = crop_grid(source, cfg.data.voxel_size_nm)
    window = Window(patch_vox=cfg.data.patch_shape_vox, device=torch.device("cpu"), precision="fp32",
                    overlap=cfg.val.overlap, batch_size=cfg.val.batch_size)
    probs = predict_volume(run.model, source.em(), grid, window, num_outputs=cfg.data.num_target_channels)
    for k, channel in enumerate(store.channels):
        np.testing.assert_array_equal(store.read(source.name, channel), probs[k].astype(np.float16))


def test_2d_model_slices_across_three_axes(tiny_run_2d, tiny_synth_root, tmp_path):
    out = tmp_path / "pred2d.zarr"
    test_ids = sorted(_test_crops(tiny_synth_root))
    opts = InferConfig(tta=8, axes_2d="zyx", batch_size=64, progress=False)
    summaries = predict_run(tiny_run_2d, str(test_ids[0]), out, opts)
    assert [s["crop"] for s in summaries] == [f"crop{test_ids[0]}"]
    store = PredictionStore.open(out)
    assert store.provenance["axes_2d"] == "zyx" and len(store.provenance["tta_transforms"]) == 8
    assert any("transpose_yx" in t for t in store.provenance["tta_transforms"])
    zyx = np.stack([store.read(f"crop{test_ids[0]}", c) for c in store.channels])
    # Slicing across z only gives another (but valid) answer on the same grid.
    out_z = tmp_path / "pred2d_z.zarr"
    predict_run(tiny_run_2d, str(test_ids[0]), out_z, InferConfig(tta=8, batch_size=64, progress=False))
    z_only = PredictionStore.open(out_z)
    assert z_only.grid(f"crop{test_ids[0]}") == store.grid(f"crop{test_ids[0]}")
    z = np.stack([z_only.read(f"crop{test_ids[0]}", c) for c in store.channels])
    assert zyx.shape == z.shape and not np.array_equal(zyx, z)
    assert np.all((zyx >= 0) & (zyx <= 1))


def test_two_processes_share_the_crops(tiny_run, tiny_synth_root, tmp_path):
    out = tmp_path / "ddp.zarr"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",  # a free port
           "-m", "cellseg", "-q", "predict", str(tiny_run), "--crops", "test", "--out", str(out), "--tta", "1",
           "--device", "cpu", "--overlap", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = PredictionStore.open(out)
    names = sorted(c.name for c in _test_crops(tiny_synth_root).values())
    assert store.completed() == names
    assert sorted(store.crop_attrs(c)["rank"] for c in names) == [0, 1]  # one crop each
    # The same as one process writes (up to a float16 step: CPU convolutions round differently with
    # another number of threads).
    single = tmp_path / "single.zarr"
    predict_run(tiny_run, "test", single, InferConfig(tta=1, overlap=0.0, device="cpu", progress=False))
    for c in names:
        for ch in store.crop_channels(c):
            np.testing.assert_allclose(store.read(c, ch), PredictionStore.open(single).read(c, ch), atol=2**-10)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_bf16_matches_cpu(tiny_run, tmp_path):
    cpu, gpu = tmp_path / "cpu.zarr", tmp_path / "gpu.zarr"
    predict_run(tiny_run, "val", cpu, InferConfig(tta=8, device="cpu", progress=False))
    predict_run(tiny_run, "val", gpu, InferConfig(tta=8, device="cuda", progress=False))
    a, b = PredictionStore.open(cpu), PredictionStore.open(gpu)
    assert b.provenance["precision"] == "bf16"
    for c in a.completed():
        assert a.grid(c) == b.grid(c)
        for ch in a.channels:
            np.testing.assert_allclose(b.read(c, ch), a.read(c, ch), atol=0.03)


def test_ema_weights_are_used_when_the_checkpoint_has_them(tiny_run, tmp_path):
    # The trainer validates with the EMA weights when it keeps them (`Setup.eval_model`): so must predict.
    run_dir = tmp_path / "ema_run"
    shutil.copytree(tiny_run, run_dir)
    path = run_dir / "checkpoints" / "best.pt"
    ckpt = torch.load(path, weights_only=False)
    ckpt["ema"] = {k: (v.float() * 0.5 if v.dtype.is_floating_point else v.clone()) for k, v in ckpt["model"].items()}
    torch.save(ckpt, path)
    run = load_run(run_dir)
    assert run.weights == "ema"
    for key, value in run.model.state_dict().items():
        torch.testing.assert_close(value, ckpt["ema"][key].to(value.dtype), rtol=0, atol=0, msg=key)
    assert load_run(tiny_run).weights == "model"


@pytest.mark.parametrize("patch, axes", [((16, 16, 16), ("z",)), ((1, 16, 16), ("z",)), ((1, 16, 16), ("z", "y", "x"))])
def test_progress_counts_every_tile(tiny_run, patch, axes):
    run = load_run(tiny_run)
    entries = [e for e in read_datasplit(tiny_run / "datasplit.csv") if e.split == "validate"]
    source = open_crops(entries, run.cfg.data)[0]
    grid = crop_grid(source, run.cfg.data.voxel_size_nm)
    seen = []

    def model(batch):  # a stand-in network of any dimensionality: one constant output channel
        return torch.zeros((batch.shape[0], 1, *batch.shape[2:]))

    window = Window(patch_vox=patch, device=torch.device("cpu"), precision="fp32", overlap=0.5, batch_size=5)
    probs = predict_volume(model, source.em(), grid, window, num_outputs=1, slice_axes=axes, on_tiles=seen.append)
    assert sum(seen) == count_tiles(grid.shape_vox, patch, 0.5, axes)
    assert probs.shape == (1, *grid.shape_vox)
    assert np.all(probs == 0.5)  # sigmoid(0), blended exactly
