"""A partial download never reads as silent zeros: levels whose chunks were not fetched are skipped or refused."""

import json
import logging
import shutil

import numpy as np
import pytest

from cellseg.data import chunks
from cellseg.data.arrays import BACKENDS, MultiscaleImage
from cellseg.data.write import write_multiscale

BOX = {"translation_nm": (4.0, 4.0, 4.0), "shape_vox": (16, 16, 16), "voxel_size_nm": (8.0, 8.0, 8.0)}


@pytest.fixture
def em_path(tmp_path):
    """EM with s0 at 8 nm and s1 at 16 nm, 8³ chunks, every chunk written (values 1-255: never the fill value)."""
    volume = np.random.default_rng(3).integers(1, 256, size=(32, 32, 32), dtype=np.uint8)
    path = tmp_path / "ds.zarr" / "recon-1" / "em" / "fibsem-uint8"
    write_multiscale(path, volume, voxel_size_nm=(8, 8, 8), translation_nm=(4, 4, 4), kind="em", num_levels=2,
                     chunks=(8, 8, 8))
    chunks.forget()
    return path


def _drop_chunks(level_dir, keep=()):
    """Delete a level's chunk files (its metadata stays): what a download of other levels leaves behind."""
    for f in level_dir.iterdir():
        if not f.name.startswith(".") and f.name not in keep:
            f.unlink() if f.is_file() else shutil.rmtree(f)
    chunks.forget()


@pytest.mark.parametrize("backend", BACKENDS)
def test_level_without_chunks_is_skipped_with_a_warning(em_path, backend, caplog):
    _drop_chunks(em_path / "s0")
    img = MultiscaleImage(em_path, backend=backend)
    assert img.chunk_coverage(img.levels[0], **BOX) == 0.0
    with caplog.at_level(logging.WARNING, logger="cellseg.data.arrays"):
        out = img.read(**BOX, interpolation="linear", dtype="float32")
    # Read from s1 (16 nm) and up-sampled: real EM, not the zeros the empty s0 would give.
    assert out.min() > 0 and 60 < out.mean() < 200
    assert "never downloaded" in caplog.text and "reading level s1" in caplog.text


def test_no_level_with_data_is_an_error_naming_the_crop_and_the_fetch_option(em_path, caplog):
    _drop_chunks(em_path / "s0")
    _drop_chunks(em_path / "s1")
    img = MultiscaleImage(em_path)
    with pytest.raises(ValueError, match=r"crop7: .* level s0 \(8x8x8 nm\) has metadata.*--em-levels all"):
        img.require_data(**BOX, what="crop7")
    with caplog.at_level(logging.WARNING, logger="cellseg.data.arrays"):  # a plain read warns (training samples)
        assert not img.read(**BOX).any()
    assert "reads as the fill value" in caplog.text


def test_chunks_known_absent_at_the_source_count_as_data(em_path):
    """Chunks the server never stored (recorded in the fetch ledger) are legitimately the fill value."""
    level = em_path / "s0"
    keys = [str(f.relative_to(level)) for f in level.rglob("*") if f.is_file() and not f.name.startswith(".")]
    assert len(keys) == 4**3  # nested "z/y/x" keys (cellseg writes dimension_separator "/")
    _drop_chunks(em_path / "s0")
    (em_path / "s0" / chunks.LEDGER).write_text(json.dumps({"source": "http://x", "absent": keys}))
    chunks.forget()
    img = MultiscaleImage(em_path)
    assert img.chunk_coverage(img.levels[0], **BOX) == 1.0
    assert not img.read(**BOX).any()  # the fill value, read from s0 as asked


def test_a_box_at_the_edge_of_the_fetched_region_keeps_its_level(em_path):
    # Keep the s0 chunks of z < 16 (the key folders "0" and "1"): the box has 2 of its 3 chunk rows in z at s0.
    _drop_chunks(em_path / "s0", keep={"0", "1"})
    img = MultiscaleImage(em_path)
    box = {**BOX, "translation_nm": (4.0, 4.0, 4.0), "shape_vox": (24, 16, 16)}
    assert img.chunk_coverage(img.levels[0], **box) == pytest.approx(2 / 3)
    out = img.read(**box)
    assert out[:16].all() and not out[16:].any()  # s0 as asked; the part never fetched reads as the fill value
