"""`--overwrite` replaces only a cellseg artifact of the same kind, and a killed writer's temporary
directories are removed by the next writer of the same target."""

from __future__ import annotations

import os
import shutil
import signal
import socket
from pathlib import Path

import numpy as np
import pytest
from faultkit import dead_pid, finish, start, wait_for

from cellseg.cli import main
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.write import artifact_kind, write_array
from cellseg.synth import generate
from cellseg.synth.presets import CropSpec, DatasetSpec, Preset, SceneStyle

MICRO = Preset(name="micro", style=SceneStyle(cell_diameter_u=60, organelle_scale=0.7), block_vox=48, datasets=(
    DatasetSpec(name="synth-micro", voxel_size_nm=(4.0, 4.0, 4.0), shape_vox=(48, 48, 48),
                crops=(CropSpec(role="train", scale=1, shape_vox=(16, 16, 16)),)),))
GRID = Grid(translation_nm=(0.0, 0.0, 0.0), shape_vox=(4, 4, 4), voxel_size_nm=(8.0, 8.0, 8.0))


def _run_dir(path: Path) -> Path:
    (path / "checkpoints").mkdir(parents=True)
    (path / "checkpoints" / "last.pt").write_bytes(b"weights")
    (path / "config.yaml").write_text("run_dir: x\n")
    (path / "meta.json").write_text("{}")
    return path


def _data_root(path: Path) -> Path:
    (path / "jrc_cos7-1" / "jrc_cos7-1.zarr").mkdir(parents=True)
    (path / "jrc_cos7-1" / "jrc_cos7-1.zarr" / ".zgroup").write_text('{"zarr_format": 2}')
    (path / "datasplit.csv").write_text("train,a,b,c,d\n")
    return path


def _foreign(path: Path) -> Path:
    path.mkdir()
    (path / "thesis.tex").write_text("precious")
    return path


@pytest.mark.parametrize(("make", "what"), [(_run_dir, "training run directory"), (_data_root, "data root"),
                                            (_foreign, r"that cellseg did not write \(thesis.tex\)")])
def test_store_overwrite_refuses_what_cellseg_did_not_write(tmp_path: Path, make, what: str) -> None:
    target = make(tmp_path / "target")
    before = sorted(p.relative_to(target) for p in target.rglob("*"))
    with pytest.raises(FileExistsError, match=what) as err:
        PredictionStore.create(target, kind="probabilities", channels=["mito"], overwrite=True)
    assert str(target) in str(err.value) and "probabilities store" in str(err.value)
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == before  # nothing deleted
    assert [p.name for p in tmp_path.iterdir()] == ["target"]  # and nothing left beside it


def test_store_overwrite_replaces_a_store_of_the_same_kind_only(tmp_path: Path) -> None:
    out = tmp_path / "pred.zarr"
    PredictionStore.create(out, kind="probabilities", channels=["mito"])
    PredictionStore.create(out, kind="probabilities", channels=["mito", "er"], overwrite=True)
    assert PredictionStore.open(out).channels == ("mito", "er")
    with pytest.raises(FileExistsError, match=r"is a cellseg probabilities store.*only a segmentation store"):
        PredictionStore.create(out, kind="segmentation", channels=["mito"], overwrite=True)
    assert artifact_kind(out) == "probabilities store"


def test_predict_into_its_own_run_directory_keeps_the_checkpoints(tiny_synth_root: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from faultkit import config

    from cellseg.train.trainer import train

    run = tmp_path / "run"
    train(config(tiny_synth_root, run, "train.max_steps=1"))
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    code = main(["predict", str(run), "--out", str(run), "--crops", "val", "--tta", "1", "--overwrite"])
    assert code == 2
    assert "is a training run directory" in capsys.readouterr().err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before


@pytest.mark.parametrize(("make", "what"), [(_run_dir, "training run directory"), (_data_root, "data root"),
                                            (_foreign, "did not write")])
def test_synth_overwrite_refuses_what_synth_did_not_make(tmp_path: Path, make, what: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    target = make(tmp_path / "target")
    before = sorted(p.relative_to(target) for p in target.rglob("*"))
    assert main(["synth", "--out", str(target), "--preset", "tiny", "--overwrite", "--workers", "1"]) == 2
    assert what in capsys.readouterr().err
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == before


def test_synth_overwrite_keeps_a_root_that_holds_more(tmp_path: Path) -> None:
    out = tmp_path / "root"
    generate(out, preset=MICRO, seed=1)
    (out / "runs").mkdir()  # a user's runs inside the data root
    with pytest.raises(FileExistsError, match="also holds what `cellseg synth` did not write \\(runs\\)"):
        generate(out, preset=MICRO, seed=2, overwrite=True)
    assert (out / "runs").is_dir() and '"seed": 1' in (out / "synth.json").read_text()


def _stale_names(target: Path, pid: int, host: str | None = None) -> Path:
    return target.with_name(f".{target.name}.tmp-{host or socket.gethostname()}-{pid}-0123abcd")


def test_the_next_writer_removes_a_dead_writers_temporary_directory(tmp_path: Path) -> None:
    out = tmp_path / "pred.zarr"
    dead, alive, elsewhere = (_stale_names(out, dead_pid()), _stale_names(out, os.getpid()),
                              _stale_names(out, dead_pid(), host="another-node"))
    for path in (dead, alive, elsewhere):
        (path / "crop1").mkdir(parents=True)
    PredictionStore.create(out, kind="probabilities", channels=["mito"])
    assert not dead.exists()  # a process of this host that no longer runs: removed
    assert alive.exists() and elsewhere.exists()  # a live writer, or one whose liveness cannot be checked: kept


def test_a_killed_synth_leaves_nothing_for_ever(tmp_path: Path) -> None:
    out = tmp_path / "root"
    proc = start(["-m", "cellseg", "synth", "--out", str(out), "--preset", "small", "--workers", "1"],
                 log=tmp_path / "synth.log")
    wait_for(lambda: any(p.name.startswith(".root.tmp-") for p in tmp_path.iterdir()), proc=proc)
    os.killpg(proc.pid, signal.SIGKILL)  # no chance to clean up
    finish(proc)
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".root.tmp-")]
    assert left and f"-{proc.pid}-" in left[0].name  # its temporary directory names its host and pid
    generate(out, preset=MICRO, seed=0)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".root.tmp-")]


def test_write_array_overwrite_replaces_an_array_not_a_folder(tmp_path: Path) -> None:
    array = tmp_path / "x.zarr" / "a"
    write_array(array, np.zeros((2, 2, 2), np.uint8))
    write_array(array, np.ones((2, 2, 2), np.uint8), overwrite=True)  # a zarr array: replaced
    folder = _foreign(tmp_path / "notes")
    with pytest.raises(FileExistsError, match="did not write"):
        write_array(folder, np.ones((2, 2, 2), np.uint8), overwrite=True)
    assert (folder / "thesis.tex").read_text() == "precious"


def test_submission_temp_of_a_killed_writer_is_removed(tmp_path: Path) -> None:
    from cellseg.data.crops import Crop, Geometry
    from cellseg.eval.submit import write_submission

    store = PredictionStore.create(tmp_path / "pred.zarr", kind="segmentation", channels=["er"])
    store.write_crop("crop1", GRID, {"er": np.ones((4, 4, 4), np.uint8)})
    crop = Crop(id=1, dataset="d", labels={"er": Geometry(voxel_size_nm=(8.0, 8.0, 8.0), translation_nm=(0.0, 0.0, 0.0),
                                                            shape_vox=(4, 4, 4))})
    out = tmp_path / "sub.zip"
    stale = _stale_names(out, dead_pid())
    stale.mkdir()
    write_submission(store.path, {1: crop}, out)
    assert out.is_file() and not stale.exists()
    shutil.rmtree(store.path)
