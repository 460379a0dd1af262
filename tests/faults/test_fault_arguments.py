"""Bad arguments and broken surroundings end a command in one clear line: an existing `models --json` file,
fetch's out-of-range numbers (offline), a full disk under `submit`, a broken install in a worker process, a
resume with another architecture, an empty `train.lock`."""

from __future__ import annotations

import errno
import json
import logging
import os
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from faultkit import SMOKE, file_size_limit, finish, overrides, start

from cellseg.cli import main
from cellseg.data.crops import Crop, Geometry
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.write import write_array
from cellseg.eval.submit import write_submission
from cellseg.train.lock import LOCK_FILE, WRITE_GRACE_S, RunLock


def test_models_json_keeps_an_existing_file_without_overwrite(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "models.json"
    out.write_text("precious")
    command = ["models", "--names", "unet_3d", "--preset", "tiny", "--json", str(out)]
    assert main(command) == 2
    assert f"--json {out} already exists; pass --overwrite" in capsys.readouterr().err and out.read_text() == "precious"
    assert main([*command, "--overwrite"]) == 0
    assert [row["name"] for row in json.loads(out.read_text())] == ["unet_3d"]


@pytest.mark.parametrize(("args", "message"), [
    (["--padding-vox", "-5"], "--padding-vox must be 0 or more voxels of context, got -5"),
    (["--workers", "0"], "--workers must be at least 1, got 0"),
])
def test_fetch_refuses_bad_numbers_before_any_request(tmp_path: Path, args: list[str], message: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    unreachable = "http://127.0.0.1:9/none"  # nothing listens there: a request would be a network failure
    assert main(["fetch", "--dest", str(tmp_path / "d"), "--catalog", unreachable, "--crops", "1", *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_a_full_disk_under_submit_names_the_submission(tmp_path: Path) -> None:
    grid = Grid(translation_nm=(4.0, 4.0, 4.0), shape_vox=(64, 64, 64), voxel_size_nm=(8.0, 8.0, 8.0))
    store = PredictionStore.create(tmp_path / "pred.zarr", kind="probabilities", channels=["er"])
    store.write_crop("crop1", grid, {"er": np.random.default_rng(0).random(grid.shape_vox, dtype=np.float32)})
    geometry = Geometry(voxel_size_nm=(8.0, 8.0, 8.0), translation_nm=(4.0, 4.0, 4.0), shape_vox=(64, 64, 64))
    out = tmp_path / "sub.zip"
    with pytest.raises(OSError, match=rf"\(writing {out}\)") as err, file_size_limit(16 * 1024):
        write_submission(store.path, {1: Crop(id=1, dataset="d", labels={"er": geometry})}, out, workers=1,
                         progress=False)
    assert err.value.errno == errno.EFBIG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pred.zarr"]  # no zip, no temporary


BROKEN_POOL = textwrap.dedent('''\
    """`cellseg ARGS` whose pool processes fail in their initializer (a library missing on the workers' side)."""
    import sys


    def broken():
        raise ImportError("numcodecs cannot be imported here (simulated broken install)")


    if __name__ == "__main__":
        import cellseg.pool
        from brokenpool import broken as importable  # pickled by a module name the workers can import
        from cellseg.cli import main

        cellseg.pool.one_thread_per_process = importable
        sys.exit(main(sys.argv[1:]))
''')


def test_a_broken_install_in_pool_processes_is_one_line(tmp_path: Path) -> None:
    labels = np.zeros((8, 8, 8), np.uint8)
    labels[2:6, 2:6, 2:6] = 1
    attrs = {"voxel_size": [8.0, 8.0, 8.0], "translation": [0.0, 0.0, 0.0], "shape": [8, 8, 8]}
    for root in ("truth.zarr", "sub.zarr"):
        for crop in ("crop1", "crop2"):
            write_array(tmp_path / root / crop / "er", labels, attrs=attrs)
    (tmp_path / "brokenpool.py").write_text(BROKEN_POOL)
    proc = start([str(tmp_path / "brokenpool.py"), "evaluate", str(tmp_path / "sub.zarr"), str(tmp_path / "truth.zarr"),
                  "--metric", "2026", "--workers", "2"], log=tmp_path / "log",
                 extra_env={"PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[2]}"})
    assert finish(proc, timeout=120) == 1
    text = (tmp_path / "log").read_text()
    assert "Traceback" not in text and text.count("simulated broken install") == 1
    last = text.strip().splitlines()[-1]
    assert last.startswith("cellseg evaluate: error: numcodecs cannot be imported here") and "initializer" in last


def test_a_resume_with_another_architecture_is_one_line(tiny_synth_root: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["train", str(SMOKE), *overrides(tiny_synth_root, run), "train.max_steps=2"]) == 0
    capsys.readouterr()
    other = SMOKE.with_name("resnet_3d.yaml")
    assert main(["train", str(other), *overrides(tiny_synth_root, run), "train.max_steps=4", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"cellseg train: error: {run}/checkpoints/last.pt: written by unet_3d (tiny), but the "
                              "config builds resnet_3d (tiny)") and "Traceback" not in "\n".join(err)
    assert not (run / LOCK_FILE).exists()


@pytest.mark.parametrize("content", ["", "{\"host\": \"n1\""], ids=["empty", "truncated"])
def test_an_empty_or_corrupt_lock_is_taken_over_as_stale(tmp_path: Path, content: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    lock = tmp_path / LOCK_FILE
    lock.write_text(content)
    old = time.time() - 2 * WRITE_GRACE_S  # left by a crash, not a lock being written now
    os.utime(lock, (old, old))
    with caplog.at_level(logging.WARNING, logger="cellseg"):
        held = RunLock(tmp_path).acquire()
    what = "empty" if not content else "not a lock record"
    assert f"taking over {lock} as stale: the lock file is {what}" in caplog.text and "pid ?" not in caplog.text
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    held.release()
    assert not lock.exists()
