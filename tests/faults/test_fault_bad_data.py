"""Malformed data in a training set stops training naming the crop; crops that merely cannot give a sample are
skipped, and meta.json and result.json say how many and why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from faultkit import SMOKE, overrides

from cellseg.cli import main

EM = "synth-iso8-1/synth-iso8-1.zarr/recon-1/em/fibsem-uint8"  # the EM of training crops crop5 and crop6
CROP1 = "synth-iso4-1/synth-iso4-1.zarr/recon-1/labels/groundtruth/crop1"  # a training crop


@pytest.fixture
def root(tiny_synth_root: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny synthetic root, to break."""
    return Path(shutil.copytree(tiny_synth_root, tmp_path / "root"))


def _float_em(root: Path) -> None:
    """Rewrite every level of one dataset's EM as float32 (values kept)."""
    for level in sorted(p for p in (root / EM).iterdir() if p.is_dir()):
        data = zarr.open(str(level), mode="r")
        values, chunks = data[:].astype(np.float32), data.chunks
        zarr.open(str(level), mode="w", shape=values.shape, dtype="f4", chunks=chunks)[:] = values


def _no_em_metadata(root: Path) -> None:
    (root / EM / ".zattrs").unlink()


@pytest.mark.parametrize(("spoil", "message"), [(_float_em, "dtype is float32, expected uint8"),
                                                (_no_em_metadata, "no OME-NGFF 'multiscales' in its .zattrs")],
                         ids=["float32-em", "em-without-zattrs"])
def test_malformed_em_stops_training_naming_the_crop(root: Path, tmp_path: Path, spoil, message: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    spoil(root)
    run = tmp_path / "run"
    assert main(["train", str(SMOKE), *overrides(root, run), "train.max_steps=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("cellseg train: error: crop5 (train crop of the split): ") and message in err[-1]
    assert str(root / EM) in err[-1] and "Traceback" not in "\n".join(err)
    assert not (run / "result.json").exists() and not (run / "train.lock").exists()


def test_skipped_crops_are_counted_in_meta_and_result(root: Path, tmp_path: Path) -> None:
    for group in (p for p in (root / CROP1).iterdir() if p.is_dir()):  # crop1 then annotates no class trained
        shutil.rmtree(group)
    run = tmp_path / "run"
    assert main(["train", str(SMOKE), *overrides(root, run), "train.max_steps=2"]) == 0
    for name in ("meta.json", "result.json"):
        record = json.loads((run / name).read_text())["skipped_crops"]
        assert record["count"] == 1 and list(record["crops"]) == ["crop1"], name
        assert "annotates none of the requested classes" in record["crops"]["crop1"]
