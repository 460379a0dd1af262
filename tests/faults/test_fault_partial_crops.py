"""A crop being written is never left half-written for ever: a refused input removes its partial crop, and a
second command writing the same crop of a store while the first runs is refused before it touches it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from faultkit import env

from cellseg.cli import main
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore

GRID = Grid(translation_nm=(0.0, 0.0, 0.0), shape_vox=(4, 4, 4), voxel_size_nm=(8.0, 8.0, 8.0))


def _hidden(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir() if p.name.startswith(".") and p.is_dir())


def test_a_refused_postprocess_leaves_no_partial_crop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    probs = np.full(GRID.shape_vox, 0.9, np.float32)
    probs[1, 2, 3] = np.nan
    store = PredictionStore.create(tmp_path / "pred.zarr", kind="probabilities", channels=["er", "mito"])
    store.write_crop("crop1", GRID, {"er": probs, "mito": np.full(GRID.shape_vox, 0.2, np.float32)})
    out = tmp_path / "seg.zarr"
    assert main(["postprocess", str(store.path), "--out", str(out), "--device", "cpu", "--grid", "model"]) == 2
    assert "NaN or infinite probabilities" in capsys.readouterr().err
    assert _hidden(out) == [] and PredictionStore.open(out).completed() == []


HOLDER = textwrap.dedent('''\
    """Open a writer of crop1 of the store given and wait (a long prediction in progress)."""
    import sys

    from cellseg.data.grid import Grid
    from cellseg.data.prediction_store import PredictionStore

    grid = Grid(translation_nm=(0.0, 0.0, 0.0), shape_vox=(4, 4, 4), voxel_size_nm=(8.0, 8.0, 8.0))
    PredictionStore.open(sys.argv[1]).crop_writer("crop1", grid, key="column4")
    print("writing", flush=True)
    sys.stdin.read()
''')


def test_a_crop_another_live_command_writes_is_refused(tmp_path: Path) -> None:
    store = PredictionStore.create(tmp_path / "pred.zarr", kind="probabilities", channels=["er"])
    with subprocess.Popen([sys.executable, "-c", HOLDER, str(store.path)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, env=env(), text=True) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "writing"
            with pytest.raises(FileExistsError, match=rf"\.crop1\.partial: being written by process {holder.pid} "):
                store.crop_writer("crop1", GRID, key="column4")
            assert _hidden(store.path) == [".crop1.partial"]  # the holder's, untouched
        finally:
            os.kill(holder.pid, signal.SIGKILL)  # a writer killed outright
    # Its partial crop is no one's now: the next writer of the crop takes it over and commits.
    store.write_crop("crop1", GRID, {"er": np.full(GRID.shape_vox, 0.5, np.float32)})
    assert store.completed() == ["crop1"] and _hidden(store.path) == []
