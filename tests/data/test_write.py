"""Atomic writers: nothing half-written, nothing overwritten without consent, valid zarr hierarchy."""

import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from cellseg.data.write import default_num_levels, downsample_2x, process_alive, write_array, write_multiscale


def _leftovers(directory):
    return [p.name for p in directory.rglob("*") if ".tmp-" in p.name or ".old-" in p.name]


def test_write_array_attrs_and_parent_groups(tmp_path):
    path = tmp_path / "submission.zarr" / "crop7" / "mito"
    data = np.arange(24, dtype=np.uint32).reshape(2, 3, 4)
    write_array(path, data, attrs={"voxel_size": [8, 8, 8], "translation": [4, 4, 4]})
    root = zarr.open_group(str(tmp_path / "submission.zarr"), mode="r")
    np.testing.assert_array_equal(root["crop7/mito"][...], data)
    assert root["crop7/mito"].attrs["voxel_size"] == [8, 8, 8]
    assert json.loads((tmp_path / "submission.zarr" / "crop7" / ".zgroup").read_text()) == {"zarr_format": 2}


def test_never_overwrite_without_flag(tmp_path):
    path = tmp_path / "x.zarr" / "a"
    write_array(path, np.zeros((2, 2, 2), np.uint8))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_array(path, np.ones((2, 2, 2), np.uint8))
    write_array(path, np.ones((2, 2, 2), np.uint8), overwrite=True)
    assert zarr.open_array(str(path), mode="r")[...].all()
    assert not _leftovers(tmp_path)


def test_failed_write_leaves_nothing(tmp_path):
    path = tmp_path / "x.zarr" / "labels" / "mito"
    with pytest.raises(ValueError, match="kind must be"):  # fails after s0 was written to the temp dir
        write_multiscale(path, np.zeros((8, 8, 8), np.uint8), voxel_size_nm=(8, 8, 8), translation_nm=(0, 0, 0),
                         kind="bogus", num_levels=2)
    assert not path.exists()
    assert not _leftovers(tmp_path)


def test_failed_overwrite_keeps_the_old_data(tmp_path):
    path = tmp_path / "g"
    write_multiscale(path, np.full((8, 8, 8), 5, np.uint8), voxel_size_nm=(8, 8, 8), translation_nm=(0, 0, 0),
                     kind="em", num_levels=1)
    with pytest.raises(ValueError):
        write_multiscale(path, np.zeros((8, 8, 8), np.uint8), voxel_size_nm=(8, 8, 8), translation_nm=(0, 0, 0),
                         kind="bogus", num_levels=2, overwrite=True)
    assert (zarr.open_array(str(path / "s0"), mode="r")[...] == 5).all()
    assert not _leftovers(tmp_path)


def test_downsample_labels_mode_keeps_thin_structures():
    vol = np.zeros((4, 4, 4), np.uint16)
    vol[:, :, 1] = 9  # a one-voxel-thick sheet: 4 of every 8 voxels in its blocks
    out = downsample_2x(vol, "labels")
    assert (out[:, :, 0] == 9).all() and (out[:, :, 1] == 0).all()
    odd = downsample_2x(np.ones((5, 3, 1), np.uint8), "labels")
    assert odd.shape == (3, 2, 1)


def test_downsample_em_rounds_explicitly():
    vol = np.zeros((2, 2, 2), np.uint8)
    vol[0, 0, 0] = 3  # mean 0.375 -> 0; 5 -> 0.625 -> 1
    assert downsample_2x(vol, "em")[0, 0, 0] == 0
    vol[0, 0, 0] = 5
    assert downsample_2x(vol, "em")[0, 0, 0] == 1


def test_default_num_levels():
    assert default_num_levels((16, 64, 64)) == 1
    assert default_num_levels((64, 64, 64)) == 3


def test_a_zombie_writer_is_not_alive(tmp_path):
    # A writer killed with its parent may stay a zombie for good where nothing reaps orphans (a container's
    # init): its partial crops must still be taken over, not refused as "being written".
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert process_alive(socket.gethostname(), pid) is False
        assert process_alive(socket.gethostname(), os.getpid()) is True
        assert process_alive("another-host", pid) is None
    finally:
        os.waitpid(pid, 0)
    assert process_alive(socket.gethostname(), pid) is False
