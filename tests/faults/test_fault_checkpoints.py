"""Checkpoints: a crafted one runs no code, old ones still load, a corrupt `last.pt` does not end a run, the class
order is checked, and a full disk is one line naming the file."""

from __future__ import annotations

import contextlib
import errno
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from faultkit import SMOKE, config, file_size_limit, finish, losses, overrides, small_disk, start

from cellseg.cli import main
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore
from cellseg.runtime.checkpoint import CheckpointError, check_checkpoint_channels, load, save_atomic
from cellseg.train.run_checkpoints import rng_state, set_rng_state
from cellseg.train.trainer import train


class _Payload:
    """Unpickling this calls `Path.touch` on a marker: what a crafted checkpoint's payload would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def test_a_crafted_checkpoint_runs_no_code(tmp_path: Path) -> None:
    marker, path = tmp_path / "pwned", tmp_path / "best.pt"
    torch.save({"model": {"w": torch.zeros(1)}, "meta": _Payload(marker)}, path)
    with pytest.raises(CheckpointError, match=r"best.pt: refusing to load: it holds objects other than tensors"):
        load(path)
    assert not marker.exists()


def test_checkpoints_with_numpy_rng_state_still_load(tmp_path: Path) -> None:
    # Checkpoints written before the NumPy state was stored as a tensor hold NumPy's own tuple (an array).
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),  # noqa: NPY002
             "cuda": []}
    torch.save({"model": {"w": torch.ones(2)}, "rng": state, "step": 3}, tmp_path / "old.pt")
    expected = np.random.random(4)  # noqa: NPY002 - the legacy generator the state belongs to
    ckpt = load(tmp_path / "old.pt")
    set_rng_state(ckpt["rng"])
    np.testing.assert_array_equal(np.random.random(4), expected)  # noqa: NPY002


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rng_state_loaded_onto_the_gpu_restores(tmp_path: Path) -> None:
    # A resumed GPU run loads its checkpoint with map_location="cuda": the RNG states arrive as CUDA tensors.
    torch.save({"rng": rng_state()}, tmp_path / "last.pt")
    expected = (random.random(), np.random.random(3), torch.rand(3), torch.rand(3, device="cuda").cpu())  # noqa: NPY002
    set_rng_state(load(tmp_path / "last.pt", map_location="cuda")["rng"])
    got = (random.random(), np.random.random(3), torch.rand(3), torch.rand(3, device="cuda").cpu())  # noqa: NPY002
    assert got[0] == expected[0]
    np.testing.assert_array_equal(got[1], expected[1])
    assert torch.equal(got[2], expected[2]) and torch.equal(got[3], expected[3])


def test_class_order_is_checked(tmp_path: Path) -> None:
    ckpt = {"meta": {"channels": ["mito", "er", "mito_boundary"]}}
    check_checkpoint_channels(ckpt, ["mito", "er", "mito_boundary"], source="run/best.pt")
    with pytest.raises(ValueError, match=r"run/best.pt: trained for channels \['mito', 'er', 'mito_boundary'\], "
                                         r"but the run expects \['er', 'mito', 'mito_boundary'\]"):
        check_checkpoint_channels(ckpt, ["er", "mito", "mito_boundary"], source="run/best.pt")


@pytest.fixture(scope="module")
def reference(tiny_synth_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    run = tmp_path_factory.mktemp("ref") / "run"
    train(config(tiny_synth_root, run, "train.max_steps=6"))
    return losses(run)


@pytest.mark.parametrize("resume", [True, "auto"])
def test_resume_falls_back_past_a_corrupt_last_pt(tiny_synth_root: Path, tmp_path: Path, reference: dict[int, float],
                                                  resume: bool | str, caplog: pytest.LogCaptureFixture) -> None:
    run = tmp_path / "run"
    train(config(tiny_synth_root, run, "train.max_steps=4", "train.val_every=2"))  # last, step_2, step_4, best
    last = run / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # a copy cut short
    train(config(tiny_synth_root, run, "train.max_steps=6", "train.val_every=2"), resume=resume)
    assert f"{last}: truncated or corrupt checkpoint" in caplog.text
    assert "instead of the corrupt" in caplog.text and "step_4.pt" in caplog.text
    assert {s: losses(run)[s] for s in (5, 6)} == {s: reference[s] for s in (5, 6)}


def test_no_intact_checkpoint_is_one_line_naming_each(tiny_synth_root: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    train(config(tiny_synth_root, run, "train.max_steps=2", "train.val_every=2"))
    for path in (run / "checkpoints").glob("*.pt"):
        path.write_bytes(b"PK\x03\x04 not really a zip")
    assert main(["train", str(SMOKE), *overrides(tiny_synth_root, run), "train.max_steps=4", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "no intact checkpoint to resume from" in err and "last.pt" in err and "step_2.pt" in err
    assert "Traceback" not in err


def test_a_full_disk_during_a_checkpoint_names_the_file(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 512) as preexec:
        target = tmp_path / "disk" / "checkpoints" / "last.pt"
        save_atomic({"w": torch.zeros(10)}, target)
        full = contextlib.nullcontext() if preexec is None else file_size_limit(256 * 1024)
        with pytest.raises(OSError, match=r"cannot write checkpoint .*/last.pt") as err, full:
            save_atomic({"w": torch.randn(1_000_000)}, target)  # 4 MB
        assert err.value.errno in (errno.ENOSPC, errno.EFBIG)
        assert load(target)["w"].shape == (10,)  # the previous checkpoint is intact
        assert sorted(p.name for p in target.parent.iterdir()) == ["last.pt"]  # no temporary left


def test_a_full_disk_during_training_is_one_line(tiny_synth_root: Path, tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 200) as preexec:  # the first checkpoint (~330 kB) does not fit
        run = tmp_path / "disk" / "run"
        proc = start(["-m", "cellseg", "-q", "train", str(SMOKE), *overrides(tiny_synth_root, run),
                      "train.max_steps=4", "train.checkpoint_every=2"], log=tmp_path / "log", preexec=preexec)
        assert finish(proc) == 1
        lines = [line for line in (tmp_path / "log").read_text().splitlines() if line.startswith("cellseg")]
        assert "Traceback" not in (tmp_path / "log").read_text()
        assert lines[-1].startswith("cellseg train: error: [Errno") and "cannot write checkpoint" in lines[-1]
        assert f"{run}/checkpoints/last.pt" in lines[-1]
        assert not (run / "train.lock").exists()


def test_a_full_disk_while_writing_a_store_names_the_channel(tmp_path: Path) -> None:
    grid = Grid(translation_nm=(0.0, 0.0, 0.0), shape_vox=(64, 64, 64), voxel_size_nm=(8.0, 8.0, 8.0))
    store = PredictionStore.create(tmp_path / "pred.zarr", kind="probabilities", channels=["mito"])
    noise = np.random.default_rng(0).random((64, 64, 64), dtype=np.float32)  # incompressible: a 512 kB chunk
    with pytest.raises(OSError, match=r"\(writing .*pred.zarr/crop1/mito\)") as err, file_size_limit(64 * 1024):
        store.write_crop("crop1", grid, {"mito": noise})
    assert err.value.errno == errno.EFBIG
    assert "crop1" not in store


def test_an_os_error_in_a_command_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "disk" / "root"
    with small_disk(tmp_path / "disk", 64) as preexec:
        proc = start(["-m", "cellseg", "synth", "--out", str(out), "--preset", "tiny", "--workers", "1"],
                     log=tmp_path / "log", preexec=preexec)
        assert finish(proc) == 1
        text = (tmp_path / "log").read_text()
        assert "Traceback" not in text
        last = text.strip().splitlines()[-1]
        assert last.startswith("cellseg synth: error: [Errno") and f"(writing {out})" in last
        assert not any(p.name.startswith(".root.tmp-") for p in out.parent.iterdir())  # cleaned up
    assert not os.path.exists(out)
