"""Reading multiscale groups over HTTP (and s3:// through its HTTPS endpoint) from a loopback server."""

import functools
import http.server
import threading

import numpy as np
import pytest

from cellseg.data.arrays import BACKENDS, MultiscaleImage
from cellseg.data.stores import resolve
from cellseg.data.write import write_multiscale


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("bucket")
    vol = np.random.default_rng(3).integers(0, 255, (24, 24, 24), dtype=np.uint8)
    write_multiscale(root / "bucket" / "ds" / "ds.zarr" / "recon-1" / "em" / "fibsem-uint8", vol, voxel_size_nm=(8, 8, 8),
                     translation_nm=(0, 0, 0), kind="em", num_levels=2, chunks=(8, 8, 8))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", vol
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize("backend", BACKENDS)
def test_http_and_s3_reads(served, backend, monkeypatch):
    base, vol = served
    monkeypatch.setenv("CELLSEG_S3_ENDPOINT", base + "/{bucket}")  # path-style endpoint on the loopback server
    for url in (f"{base}/bucket/ds/ds.zarr/recon-1/em/fibsem-uint8", "s3://bucket/ds/ds.zarr/recon-1/em/fibsem-uint8"):
        img = MultiscaleImage(url, backend=backend)
        assert [lv.path for lv in img.levels] == ["s0", "s1"]
        out = img.read(translation_nm=(-8, 0, 0), shape_vox=(4, 4, 4), voxel_size_nm=(8, 8, 8))
        np.testing.assert_array_equal(out[1:], vol[:3, :4, :4])
        assert not out[0].any()


def test_url_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("CELLSEG_S3_ENDPOINT", raising=False)
    assert resolve("s3://janelia-cosem-datasets/a/b.zarr").url == "https://janelia-cosem-datasets.s3.amazonaws.com/a/b.zarr"
    assert resolve(f"file://{tmp_path}").url == str(tmp_path)
    assert resolve("http://host/x/").url == "http://host/x"
    with pytest.raises(ValueError, match="unsupported URL scheme 'gs'"):
        resolve("gs://bucket/x")


def test_missing_remote_group(served):
    base, _ = served
    with pytest.raises(FileNotFoundError):
        MultiscaleImage(f"{base}/bucket/ds/ds.zarr/recon-1/em/nothing-here").levels  # noqa: B018
