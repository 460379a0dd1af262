"""`cellseg predict-volume` on the tiny trained run over a world ROI of the 8 nm synthetic dataset, on daisy with
2 CPU workers started through the worker entry point: small blocks equal one block over the same ROI, the
pyramid, a run killed mid-way and resumed, a failing block reported with its ROI, and errors before compute."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from cellseg.cli import main as cli
from cellseg.config.jobs import PredictVolumeJob, load_job
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.write import downsample_2x
from cellseg.volume.driver import prepare
from cellseg.volume.plan import DiskEstimate, check_disk
from cellseg.volume.predict import BlockPredictor
from cellseg.volume.store import VolumeStore

REPO = Path(__file__).resolve().parents[2]
DATASET = "synth-iso8-1"  # the 8 nm dataset of the tiny synthetic root (80³ voxels), as the smoke run
ROI_NM = "796:1052,396:780,1196:1708"  # 32 × 48 × 64 voxels from the volume's corner (796, 396, 1196) nm


def _args(run: Path, out: Path, *extra: str, workers: int = 2) -> list[str]:
    return ["predict-volume", str(run), "--dataset", DATASET, "--out", str(out), "--device", "cpu", "--tta", "1",
            "--workers", str(workers), "--block-vox", "32", "--roi-nm", ROI_NM, "--classes", "mito,er",
            "volume.chunk_vox=32", "infer.overlap=0", "volume.cpu_workers=1", *extra]


def _s0(out: Path, channel: str, level: int = 0) -> np.ndarray:
    return VolumeStore.open(out).array("probabilities", channel, level)[:]


@pytest.fixture(scope="module")
def blocked(volume_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ROI predicted in 32³ blocks (2 × 2 in y and x, the last y block 16 voxels) by 2 workers, with
    instances."""
    out = tmp_path_factory.mktemp("volume") / "blocked.zarr"
    assert cli(_args(volume_run, out, "--instances")) == 0
    return out


def test_small_blocks_equal_one_block(blocked: Path) -> None:
    store = VolumeStore.open(blocked)
    assert store.grid.shape_vox == (32, 48, 64) and store.channels == ("mito", "er", "mito_boundary")
    whole = BlockPredictor.of(store, "cpu").predict(((0, 0, 0), store.grid.shape_vox))  # one block, in-process
    for k, channel in enumerate(store.channels):
        got = _s0(blocked, channel)
        diff = np.abs(got.astype(np.int16) - whole[k])
        assert diff.max() <= 1, channel  # within the store's quantisation
        assert (diff == 0).mean() > 0.999, channel
        assert 0 < got.mean() < 255  # a real prediction, not the fill value
        np.testing.assert_array_equal(_s0(blocked, channel, 1), downsample_2x(got, "em"))  # the mean pyramid
    summary = json.loads((blocked / "summary.json").read_text())
    assert summary["ok"] and summary["failed_blocks"] == []
    assert summary["tasks"]["predict"] == {"total": 4, "completed": 4, "skipped": 0, "failed": 0, "orphaned": 0}
    assert summary["workers"]["predict"] == 2
    assert summary["tasks"]["merge"]["completed"] == 1 and summary["tasks"]["pyramid-labels-1"]["completed"] == 1
    ids = VolumeStore.open(blocked).array("labels", "mito", 0)[:]
    assert ids.dtype == np.uint64 and 0 < ids.max() < 2**32  # final ids (no provisional bit left)
    mask = VolumeStore.open(blocked).array("labels", "er", 0)[:]
    assert mask.dtype == np.uint8 and set(np.unique(mask)) <= {0, 1}
    attrs = json.loads((blocked / ".zattrs").read_text())["cellseg"]
    assert attrs["kind"] == "volume-prediction" and attrs["members"][0]["architecture"] == "unet_3d"
    assert attrs["roi_nm"] == {"offset": [796.0, 396.0, 1196.0], "shape": [256.0, 384.0, 512.0]}


def test_column_blocks_stream_in_z_and_equal_one_block(volume_run: Path, tmp_path: Path) -> None:
    # Whole-depth columns 16 voxels wide, written a 16-plane chunk row at a time, at overlap 0.5 (tiles straddle
    # every face): the same probabilities as one block over the ROI.
    out = tmp_path / "columns.zarr"
    assert cli(_args(volume_run, out, "infer.overlap=0.5", "volume.chunk_vox=16", "--block-vox", "16",
                     "--block-z-vox", "0", workers=1)) == 0
    store = VolumeStore.open(out)
    assert store.block_vox == (32, 16, 16) and store.chunk_vox == (16, 16, 16)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"]["predict"]["completed"] == 1 * 3 * 4
    whole = BlockPredictor.of(store, "cpu").predict(((0, 0, 0), store.grid.shape_vox))
    for k, channel in enumerate(store.channels):
        diff = np.abs(_s0(out, channel).astype(np.int16) - whole[k])
        assert diff.max() <= 1 and (diff == 0).mean() > 0.999, channel
        assert 0 < whole[k].mean() < 255


def _done_markers(out: Path, task: str = "predict") -> int:
    """Blocks daisy marked done (its tracking array: one uncompressed byte per block)."""
    chunks = (out / ".blocks" / task / "done" / "c").rglob("*")
    return sum(int(np.count_nonzero(np.fromfile(p, np.uint8))) for p in chunks if p.is_file())


def _kill_after_first_block(volume_run: Path, out: Path) -> int:
    """Start a one-worker run, freeze its whole process group as soon as daisy marks a block done, kill it; returns
    the blocks marked done (4: every block finished before the freeze, a machine faster than the polling)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "cellseg", *_args(volume_run, out, workers=1)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    while (out / ".blocks").is_dir() is False or _done_markers(out) < 1:
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGSTOP)  # the driver, daisy and the worker stop where they are
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return _done_markers(out)


def test_killed_run_resumes_identically(volume_run: Path, blocked: Path, tmp_path: Path) -> None:
    for attempt in range(3):  # a kill that came after the last block tests nothing: kill another run
        out = tmp_path / f"killed{attempt}.zarr"
        done = _kill_after_first_block(volume_run, out)
        if done < 4:
            break
    assert 1 <= done < 4
    assert cli(_args(volume_run, out, "--resume", workers=1)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"]["predict"]["skipped"] == done  # no finished block predicted again
    assert summary["tasks"]["predict"]["completed"] == 4
    for channel in ("mito", "er", "mito_boundary"):
        np.testing.assert_array_equal(_s0(out, channel), _s0(blocked, channel))
        np.testing.assert_array_equal(_s0(out, channel, 1), _s0(blocked, channel, 1))


def test_failing_block_is_retried_then_reported(volume_run: Path, blocked: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "failing.zarr"
    job = load_job(PredictVolumeJob, None, [f"dataset={DATASET}", f"out={out}", f"ensemble.members=[{volume_run}]",
                                            "infer.device=cpu", "infer.tta=1", "infer.overlap=0",
                                            "volume.block_vox=32", "volume.chunk_vox=32", f"volume.roi_nm='{ROI_NM}'",
                                            "volume.classes=[mito,er]"])
    prepare(job)  # the store, empty
    (out / "probabilities" / "er" / "s0" / "0").mkdir(parents=True)
    (out / "probabilities" / "er" / "s0" / "0" / "1").write_text("")  # a file where chunks (0, 1, *) must go
    code = cli(_args(volume_run, out, "--resume", "volume.max_retries=1"))
    assert code == 1
    summary = json.loads((out / "summary.json").read_text())
    failed = sorted((f for f in summary["failed_blocks"] if f["task"] == "predict"), key=lambda f: f["offset_vox"])
    assert [f["offset_vox"] for f in failed] == [[0, 32, 0], [0, 32, 32]]
    assert failed[1]["roi_nm"] == "796:1052,652:780,1452:1708"  # the block's world ROI: y 32..48, x 32..64 vox
    assert summary["tasks"]["predict"]["completed"] == 2 and not summary["ok"]
    assert "failed: predict block" in capsys.readouterr().out
    np.testing.assert_array_equal(_s0(out, "mito")[:, :32], _s0(blocked, "mito")[:, :32])  # the others completed


def _job(run: Path, out: Path, *overrides: str) -> PredictVolumeJob:
    return load_job(PredictVolumeJob, None, [f"dataset={DATASET}", f"out={out}", f"ensemble.members=[{run}]",
                                             "infer.device=cpu", *overrides])


def test_errors_before_compute(volume_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.zarr"
    with pytest.raises(ValueError, match="reaches outside the volume"):
        prepare(_job(volume_run, out, "volume.roi_nm='4:260,396:780,1196:1708'"))
    with pytest.raises(ValueError, match="no EM level at the members' voxel size 8×8×8 nm"):
        prepare(_job(volume_run, out, "dataset=synth-aniso-1"))
    PredictionStore.create(out, kind="probabilities", channels=["mito"])
    with pytest.raises(ValueError, match="probabilities store, not a volume prediction store"):
        prepare(_job(volume_run, out, "volume.resume=true"))
    with pytest.raises(FileExistsError, match="--resume"):
        prepare(_job(volume_run, out))
    other = tmp_path / "run_4nm"
    shutil.copytree(volume_run, other)
    cfg = yaml.safe_load((other / "config.yaml").read_text())
    cfg["data"]["voxel_size_nm"] = [4.0, 4.0, 4.0]
    (other / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ValueError, match="one voxel size"):
        prepare(load_job(PredictVolumeJob, None, [f"dataset={DATASET}", f"out={tmp_path / 'x.zarr'}",
                                                  f"ensemble.members=[{volume_run}, {other}]"]))
    with pytest.raises(ValueError, match=r"volume\.block_z_vox=40 .* multiple of volume\.chunk_vox=32"):
        _job(volume_run, out, "volume.chunk_vox=32", "volume.block_z_vox=40")
    with pytest.raises(OSError, match="the output needs about"):
        check_disk(tmp_path / "big.zarr", DiskEstimate(probabilities=2**62, labels=0), compression=1.0)
    assert not (tmp_path / "x.zarr").exists() and not (tmp_path / "big.zarr").exists()


def test_dry_run_plans_the_volume_without_writing(volume_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan.zarr"
    assert cli([*_args(volume_run, out, "--instances"), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "dry run: synth-iso8-1 at 8×8×8 nm, 32×48×64 voxels" in text and "nothing is predicted or written" in text
    assert "blocks: 4 blocks of 32×32×32 voxels, 2 prediction worker(s) on the CPU" in text  # 1 × 2 × 2
    assert "3 probability channels" in text and "2 label arrays" in text and "(fits)" in text  # + mito_boundary
    assert f"member {volume_run.name} (unet_3d, TTA 1): reads" in text and "no recorded rate" in text
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_blocks_are_narrowed_to_fit_the_gpu_and_halves_equal_the_whole(volume_run: Path, blocked: Path,
                                                                        tmp_path: Path, capsys, caplog) -> None:
    from cellseg.infer.tiling import GPU_FUSED_FRACTION
    from cellseg.volume.plan import block_sums_bytes, fit_block_edge
    from cellseg.volume.predict import halves

    streams = [(3, (32, 32, 32), 0.0)]  # the smoke run: 3 channels, 32³ patches
    one_chunk = block_sums_bytes(32, streams)
    assert block_sums_bytes(64, streams) > one_chunk and fit_block_edge(64, 32, streams, 10**12) == 64
    assert fit_block_edge(64, 32, streams, int(one_chunk / GPU_FUSED_FRACTION)) == 32  # room for 32 wide only
    # a GPU too small for 64-wide blocks: the plan narrows them, and says so
    assert cli([*_args(volume_run, tmp_path / "n.zarr", workers=1), "--block-vox", "64", "--dry-run",
                "volume.gpu_memory_gb=0.0002"]) == 0
    assert "blocks: 4 blocks of 32×32×32 voxels" in capsys.readouterr().out
    assert "blocks 64 voxels wide" in caplog.text and "blocks 32 wide instead" in caplog.text
    # a block out of GPU memory is predicted in halves along y and x: the lattice makes them equal the whole
    assert halves(((0, 0, 0), (32, 48, 64)), (32, 32, 32)) == [((0, 0, 0), (32, 32, 32)), ((0, 0, 32), (32, 32, 32)),
                                                              ((0, 32, 0), (32, 16, 32)), ((0, 32, 32), (32, 16, 32))]
    assert halves(((0, 0, 0), (32, 32, 32)), (32, 32, 32)) == []  # one chunk wide: nothing left to halve
    predictor = BlockPredictor.of(VolumeStore.open(blocked), "cpu")
    whole = ((0, 0, 0), (32, 48, 64))
    parts = np.zeros_like(predictor.predict(whole))
    for (z, y, x), (nz, ny, nx) in halves(whole, (32, 32, 32)):
        parts[:, z:z + nz, y:y + ny, x:x + nx] = predictor.predict(((z, y, x), (nz, ny, nx)))
    np.testing.assert_array_equal(parts, predictor.predict(whole))
