"""`cellseg predict` and `predict-ensemble` size the store they will write and refuse, before the first tile and
with nothing written, crops that do not fit the free disk, naming the size and the settings that would fit."""

import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from cellseg.cli import main
from cellseg.config.inference import InferConfig
from cellseg.infer.predict import predict_run

Usage = namedtuple("Usage", "total used free")


def _disk_of(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    """The filesystem reports `free` bytes (stdlib's `shutil.disk_usage`: no disk can be filled in a test)."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**15, 10**15 - free, free))


def _store_bytes(tiny_run: Path, tmp_path: Path, **settings) -> int:
    """The store's size as written: predict the validation crops once, with room to spare."""
    out = tmp_path / "sized.zarr"
    predict_run(tiny_run, "val", out, InferConfig(tta=1, overlap=0.0, device="cpu", progress=False, **settings))
    from cellseg.infer.crop_plan import crop_voxels, store_bytes  # what the check computes
    from cellseg.infer.run import load_run
    from cellseg.infer.selection import select_targets

    run = load_run(tiny_run, "best", device="cpu")
    targets = select_targets("val", run.cfg, run.run_dir)
    voxels = crop_voxels(targets, run.cfg.data.voxel_size_nm)
    return sum(store_bytes(targets, run.channels, voxels, scored=True, uint8=settings.get("uint8", False)).values())


def test_crops_that_do_not_fit_are_refused_before_any_tile(tiny_run, tmp_path, monkeypatch, capsys):
    need = _store_bytes(tiny_run, tmp_path)
    assert need > 0
    _disk_of(monkeypatch, need - 1)
    out = tmp_path / "val.zarr"
    code = main(["predict", str(tiny_run), "--crops", "val", "--out", str(out), "--device", "cpu", "--tta", "1"])
    err = capsys.readouterr().err
    assert code != 0 and "Nothing was predicted" in err and "float16" in err and "--uint8 would fit" in err
    assert not out.exists()  # nothing half-written
    _disk_of(monkeypatch, need)  # exactly enough: predicted
    assert main(["predict", str(tiny_run), "--crops", "val", "--out", str(out), "--device", "cpu", "--tta", "1",
                 "--overlap", "0"]) == 0
    assert out.is_dir()


def test_a_resumed_store_counts_only_the_missing_crops(tiny_run, tmp_path, monkeypatch):
    need = _store_bytes(tiny_run, tmp_path, uint8=True)
    out = tmp_path / "sized.zarr"  # complete: nothing left to write, so no space is needed
    _disk_of(monkeypatch, 0)
    opts = InferConfig(tta=1, overlap=0.0, device="cpu", progress=False, uint8=True)
    assert predict_run(tiny_run, "val", out, opts) == []
    shutil.rmtree(out / "crop3")  # one crop missing: its bytes are needed, not the whole store's
    _disk_of(monkeypatch, need // 4)
    with pytest.raises(OSError, match="the 1 crops need about"):
        predict_run(tiny_run, "val", out, opts)
