"""Prediction never reads data that is not there: a level downloaded as metadata only is skipped for one with
data or refused naming the crop, the level and the fetch option; tiles mostly at the padding value are reported
once per crop."""

import logging
import shutil

import numpy as np
import pytest
import torch

from cellseg.config.inference import InferConfig
from cellseg.data import chunks
from cellseg.data.arrays import MultiscaleImage
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore
from cellseg.infer.engine import Window, predict_volume, require_em
from cellseg.infer.fused import predict_ensemble
from cellseg.infer.predict import predict_run

EM = "synth-iso8-1/synth-iso8-1.zarr/recon-1/em/fibsem-uint8"  # s0 8 nm, s1 16 nm, s2 32 nm
OPTS = dict(tta=1, overlap=0.0, progress=False)


def _root_without_chunks(src, dst, levels):
    """A copy of a data root whose EM levels `levels` of synth-iso8-1 keep their metadata only (a partial fetch)."""
    shutil.copytree(src, dst)
    for level in levels:
        for f in (dst / EM / level).iterdir():
            if not f.name.startswith("."):
                shutil.rmtree(f) if f.is_dir() else f.unlink()
    chunks.forget()
    return dst


def test_a_coarse_test_crop_reads_the_level_with_data(tiny_run, tiny_synth_root, tmp_path, caplog):
    """Crop 502 (16 nm) predicted by the 8 nm model whose 8 nm EM was never downloaded: read from 16 nm."""
    root = _root_without_chunks(tiny_synth_root, tmp_path / "root", ["s0"])
    with caplog.at_level(logging.WARNING, logger="cellseg.data.arrays"):
        predict_run(tiny_run, "502", tmp_path / "p.zarr", InferConfig(data_root=str(root), **OPTS))
    assert "never downloaded" in caplog.text and "reading level s1" in caplog.text
    assert PredictionStore.open(tmp_path / "p.zarr").completed() == ["crop502"]


def test_no_level_with_data_is_an_error_naming_crop_level_and_fetch_option(tiny_run, tiny_run_2d, tiny_synth_root,
                                                                           tmp_path):
    root = _root_without_chunks(tiny_synth_root, tmp_path / "root", ["s0", "s1", "s2"])
    message = r"crop502 \(synth-iso8-1\): .*level s0 \(8x8x8 nm\) has metadata but its chunks were never " \
              r"downloaded.*`cellseg fetch .*--em-levels all"
    with pytest.raises(ValueError, match=message):
        predict_run(tiny_run, "502", tmp_path / "p.zarr", InferConfig(data_root=str(root), **OPTS))
    with pytest.raises(ValueError, match=message):
        predict_ensemble([tiny_run, tiny_run_2d], "502", tmp_path / "e.zarr",
                         opts=InferConfig(data_root=str(root), checkpoint="last", **OPTS))


def test_tiles_mostly_at_the_padding_value_are_reported_once_per_crop(tiny_synth_root, caplog):
    em = MultiscaleImage(tiny_synth_root / EM)  # 80³ voxels of 8 nm from (800, 400, 1200) nm
    # A box whose last 8 x-planes of 16 are inside the volume. With 4 voxels of context, 3³ tiles of 8³: the first
    # column of 9 tiles along x lies outside, the second half outside (not "mostly"), the third inside.
    grid = Grid(translation_nm=(1204.0, 804.0, 1204.0 - 8 * 8), shape_vox=(16, 16, 16), voxel_size_nm=(8.0,) * 3)

    def model(batch):  # a stand-in network: one constant output channel
        return torch.zeros((batch.shape[0], 1, *batch.shape[2:]))

    window = Window(patch_vox=(8, 8, 8), device=torch.device("cpu"), precision="fp32", overlap=0.0)
    require_em(em, grid, (8, 8, 8), what="crop9 (synth-iso8-1)")
    with caplog.at_level(logging.WARNING, logger="cellseg.infer.engine"):
        probs = predict_volume(model, em, grid, window, num_outputs=1)
        predict_volume(model, em, grid, window, num_outputs=1)  # the same crop again: no second warning
    assert np.all(probs == 0.5)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("crop9 (synth-iso8-1): 9 of 27 tiles (33%) read EM mostly")


def test_a_routed_plan_refuses_em_levels_its_members_would_read_upsampled(tiny_run, tiny_synth_root, tmp_path):
    """The 16 nm test crop routed to an 8 nm member, fetched with the matched levels only (no 8 nm chunks): the
    plan names the crop, the level and the fetch command before anything is predicted."""
    from cellseg.config.inference import RouteConfig
    from cellseg.config.load import from_dict
    from cellseg.infer.routing import predict_routed

    root = _root_without_chunks(tiny_synth_root, tmp_path / "root", ["s0"])
    routes = [from_dict(RouteConfig, {"band_nm": [0, 32], "members": [str(tiny_run)]})]
    message = (r"crop502 \(synth-iso8-1\): level s0 \(8x8x8 nm\) has no chunks under the crop, which would be read "
               r"from s1 \(16x16x16 nm\) upsampled(.|\n)*cellseg fetch --crops [0-9,]*502[0-9,]* --em-levels 8`")
    with pytest.raises(ValueError, match=message):
        predict_routed(routes, "test", tmp_path / "r.zarr",
                       opts=InferConfig(data_root=str(root), checkpoint="last", **OPTS))
    assert not (tmp_path / "r.zarr").exists()


def test_fetch_em_levels_by_voxel_size_bring_the_members_level():
    """`--em-levels 8` for a 16 nm crop: the 8 nm level and every coarser one; matched alone starts at 16 nm."""
    from types import SimpleNamespace

    from cellseg.fetch.fetch_plan import choose_em_levels

    levels = [SimpleNamespace(meta=SimpleNamespace(voxel_size_nm=(v, v, v)), name=f"s{i}")
              for i, v in enumerate((4.0, 8.0, 16.0, 32.0))]
    pick = lambda mode, gt=(16.0, 16.0, 16.0): [lv.name for lv in choose_em_levels(levels, gt, mode)]  # noqa: E731
    assert pick("matched") == ["s2", "s3"] and pick("8") == ["s1", "s2", "s3"] and pick("32") == ["s2", "s3"]
    assert pick("all") == ["s0", "s1", "s2", "s3"]
    with pytest.raises(ValueError, match=r"em_levels must be one of \('matched', 'all'\) or a voxel size in nm"):
        pick("fine")
    with pytest.raises(ValueError, match="or a voxel size in nm"):
        pick("-8")
