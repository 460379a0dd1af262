"""`cellseg predict-ensemble` on the tiny trained runs (a 3D and a 2D unet): the same numbers as `cellseg predict`
per member + `cellseg ensemble`, weights (explicit, from a fit file, zero), uint8, the lockstep average of uneven
slab streams, resume after a kill, column planning and errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from cellseg.cli import main as cli
from cellseg.config.inference import EnsembleConfig, InferConfig
from cellseg.data.prediction_store import QUANTUM, PredictionStore
from cellseg.infer.ensemble import ensemble
from cellseg.infer.fused import AVERAGE_PLANES, Contribution, averaged_slabs, predict_ensemble
from cellseg.infer.predict import predict_run
from cellseg.infer.tiling import context_margin, fused_column_vox
from cellseg.infer.weights import WEIGHTS_FILE

OPTS = InferConfig(tta=8, overlap=0.0, batch_size=8, checkpoint="last", progress=False)
GIB = 2**30


def assert_same_stores(got: Path, want: Path) -> None:
    a, b = PredictionStore.open(got), PredictionStore.open(want)
    assert a.channels == b.channels and a.instance_channels == b.instance_channels
    assert a.completed() == b.completed() and a.completed()
    for crop in a.completed():
        assert a.grid(crop) == b.grid(crop) and a.crop_channels(crop) == b.crop_channels(crop)
        for channel in a.crop_channels(crop):
            np.testing.assert_array_equal(a.read(crop, channel), b.read(crop, channel), err_msg=f"{crop}/{channel}")


@pytest.fixture(scope="module")
def members(tiny_run, tiny_run_2d, tmp_path_factory) -> tuple[Path, Path]:
    """Each run's own `cellseg predict` of the test crops (the two-step path's members)."""
    out = tmp_path_factory.mktemp("members")
    predict_run(tiny_run, "test", out / "unet_3d.zarr", OPTS)
    predict_run(tiny_run_2d, "test", out / "unet_2d.zarr", OPTS)
    return out / "unet_3d.zarr", out / "unet_2d.zarr"


def test_fused_equals_predict_then_ensemble(tiny_run, tiny_run_2d, members, tmp_path, capsys):
    ensemble(EnsembleConfig(members=tuple(members), weights=(3.0, 1.0)), tmp_path / "two_step.zarr")
    out = tmp_path / "fused.zarr"
    assert cli(["predict-ensemble", str(tiny_run), str(tiny_run_2d), "--crops", "test", "--out", str(out),
                "--weights", "3,1", "--tta", "8", "--overlap", "0", "--batch-size", "8", "--checkpoint", "last"]) == 0
    assert_same_stores(out, tmp_path / "two_step.zarr")
    printed = capsys.readouterr().out
    store = PredictionStore.open(out)
    for crop in store.completed():
        assert f"{crop} (" in printed and "2 members" in printed
        assert store.crop_attrs(crop)["members"] == 2
    saved = json.loads((out / WEIGHTS_FILE).read_text())
    assert saved["method"] == "explicit" and saved["channels"]["mito"] == [0.75, 0.25]
    assert [m["run_dir"] for m in saved["members"]] == [str(tiny_run.resolve()), str(tiny_run_2d.resolve())]
    prov = store.provenance
    assert prov["ensemble"]["fused"] and [p["model"] for p in prov["member_provenance"]] == ["unet_3d", "unet_2d"]
    assert prov["data_root"]  # `postprocess --tune-on` and `submit` find the data again


def test_weights_file_and_uint8_match_the_two_step_path(tiny_run, tiny_run_2d, members, tmp_path):
    fit = ensemble(EnsembleConfig(members=tuple(members), weights=(1.0, 2.0)), tmp_path / "fit.zarr")
    fitted = fit.store.path / WEIGHTS_FILE  # as a fit saves it
    ensemble(EnsembleConfig(members=tuple(members), weights=str(fitted)), tmp_path / "two_step.zarr", uint8=True)
    predict_ensemble([tiny_run, tiny_run_2d], "test", tmp_path / "fused.zarr", weights=str(fitted),
                     opts=InferConfig(**{**OPTS.__dict__, "uint8": True}))
    assert_same_stores(tmp_path / "fused.zarr", tmp_path / "two_step.zarr")
    assert json.loads((tmp_path / "fused.zarr" / WEIGHTS_FILE).read_text())["method"] == "file"


def test_a_member_with_zero_weight_is_not_run(tiny_run, tiny_run_2d, members, tmp_path):
    summaries = predict_ensemble([tiny_run, tiny_run_2d], "test", tmp_path / "fused.zarr", weights=[1.0, 0.0],
                                 opts=OPTS)
    assert all(s["members"] == 1 for s in summaries)
    assert all(s["tiles"] < 20 for s in summaries)  # the 3D model's tiles only (the 2D model runs 64-128 a crop)
    assert_same_stores(tmp_path / "fused.zarr", members[0])  # p·1 / 1 = p: the member's own prediction


def test_lockstep_average_of_uneven_slab_streams():
    """Members finishing planes at different rates (a 3D model's thick slabs, a 2D model's single planes) give
    the weighted mean of each plane, `AVERAGE_PLANES` at a time, whatever the interleaving."""
    depth, shape = 2 * AVERAGE_PLANES + 5, (6, 7)
    rng = np.random.default_rng(0)
    probs = [torch.from_numpy(rng.random((k, depth, *shape), dtype=np.float32)).half() for k in (3, 2)]

    def stream(p: torch.Tensor, sizes: list[int]):
        z = 0
        for n in sizes:
            yield z, p[:, z:z + n]
            z += n
        assert z == depth

    parts = [Contribution(member=None, keep=(0, 1, 2), rows=torch.tensor([0, 1, 2]),  # type: ignore[arg-type]
                          weight=torch.tensor([0.5, 0.25, 1.0])),
             Contribution(member=None, keep=(0, 1), rows=torch.tensor([2, 0]),  # type: ignore[arg-type]
                          weight=torch.tensor([0.5, 0.75]))]
    total = torch.tensor([1.25, 0.25, 1.5])
    streams = [stream(probs[0], [13, 13, depth - 26]), stream(probs[1], [1] * depth)]
    got = list(averaged_slabs(streams, parts, total, start=0, depth=depth, device=torch.device("cpu")))
    assert [(z, s.shape[1]) for z, s in got] == [(0, AVERAGE_PLANES), (AVERAGE_PLANES, AVERAGE_PLANES),
                                                  (2 * AVERAGE_PLANES, 5)]
    assert all(s.dtype == np.float16 and s.shape[0] == 3 for _, s in got)
    mean = np.concatenate([s for _, s in got], axis=1).astype(np.float32)
    p0, p1 = (p.float().numpy() for p in probs)
    totals = np.float32([1.25, 0.25, 1.5])[:, None, None, None]
    want = np.stack([p0[0] * 0.5 + p1[1] * 0.75, p0[1] * 0.25, p0[2] * 1.0 + p1[0] * 0.5]) / totals
    np.testing.assert_allclose(mean, want, rtol=1e-3)
    # uint8: round(255 p) of the same mean
    streams = [stream(probs[0], [depth]), stream(probs[1], [2] * (depth // 2) + [depth % 2] * (depth % 2))]
    q = np.concatenate([s for _, s in averaged_slabs(streams, parts, total, start=0, depth=depth,
                                                     device=torch.device("cpu"), uint8=True)], axis=1)
    assert q.dtype == np.uint8 and np.abs(q.astype(np.float32) - want * QUANTUM).max() <= 0.51


def test_killed_run_resumes_after_the_planes_it_wrote(tiny_run, tiny_run_2d, tmp_path):
    opts = InferConfig(**{**OPTS.__dict__, "block_vox": 16})  # 16² columns: the 32³ crop has four
    reference = tmp_path / "ref.zarr"
    predict_ensemble([tiny_run, tiny_run_2d], "test", reference, opts=opts)
    ref = PredictionStore.open(reference)
    crop = max(ref.completed(), key=lambda c: np.prod(ref.grid(c).shape_vox))
    # The state a run killed after writing planes 0-15 of the crop's first column leaves: a partial crop.
    resumed = tmp_path / "resumed.zarr"
    shutil.copytree(reference, resumed)
    shutil.rmtree(resumed / crop)
    store = PredictionStore.open(resumed)
    writer = store.crop_writer(crop, ref.grid(crop), key="fused_column16", channels=ref.crop_channels(crop))
    for channel in ref.crop_channels(crop):
        writer.write(channel, np.full((16, 16, 16), 0.25, dtype=np.float32))
    writer.mark_done("0_0_0:16")
    summaries = predict_ensemble([tiny_run, tiny_run_2d], "test", resumed, opts=opts)
    assert [s["crop"] for s in summaries] == [crop]  # the complete crop is skipped
    first = (slice(0, 16),) * 3
    for channel in ref.crop_channels(crop):
        got, want = store.read(crop, channel), ref.read(crop, channel)
        assert (got[first] == 0.25).all(), "the planes written were predicted again"
        rest = np.ones(got.shape, dtype=bool)
        rest[first] = False
        np.testing.assert_array_equal(got[rest], want[rest])
    # Other weights: the store is not extended without --overwrite.
    with pytest.raises(ValueError, match="weights"):
        predict_ensemble([tiny_run, tiny_run_2d], "test", resumed, weights=[2.0, 1.0], opts=opts)


def test_columns_fit_every_member_on_the_gpu():
    """The 8-model ensemble (four 3D members with 128³ patches, four 2D with 256²) on crop 983's 25 channels: one
    1000² column on an H200 (141 GiB), cut on an 80 GiB H100; the sums of all members fit half the GPU."""
    cuda = torch.device("cuda")
    streams = [(25, (128, 128, 128), context_margin((128, 128, 128)))] * 4 + [(25, (1, 256, 256), context_margin((1, 256, 256)))] * 4
    h200, h100 = fused_column_vox(streams, 25, cuda, 141 * GIB), fused_column_vox(streams, 25, cuda, 80 * GIB)
    assert h200 >= 1000 > h100
    sums = sum(4 * (k + 1) * p[0] * (h200 + 2 * m[1]) ** 2 for k, p, m in streams)
    assert sums <= 0.5 * 141 * GIB


def test_errors_are_clear(tiny_run, tiny_run_2d, tmp_path):
    with pytest.raises(ValueError, match="at least 2 runs"):
        predict_ensemble([tiny_run], "test", tmp_path / "a.zarr", opts=OPTS)
    with pytest.raises(ValueError, match="more than once"):
        predict_ensemble([tiny_run, tiny_run], "test", tmp_path / "a.zarr", opts=OPTS)
    with pytest.raises(ValueError, match="--weights auto fits on member predictions"):
        predict_ensemble([tiny_run, tiny_run_2d], "test", tmp_path / "a.zarr", weights="auto", opts=OPTS)
    with pytest.raises(ValueError, match="3 values for 2 member"):
        predict_ensemble([tiny_run, tiny_run_2d], "test", tmp_path / "a.zarr", weights=[1, 2, 3], opts=OPTS)
    with pytest.raises(ValueError, match="slices 2D members across z only"):
        predict_ensemble([tiny_run, tiny_run_2d], "test", tmp_path / "a.zarr",
                         opts=InferConfig(**{**OPTS.__dict__, "axes_2d": "zyx"}))
    coarse = tmp_path / "coarse"
    shutil.copytree(tiny_run_2d, coarse)
    cfg = yaml.safe_load((coarse / "config.yaml").read_text())
    cfg["data"]["voxel_size_nm"] = [16, 16, 16]
    (coarse / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ValueError, match=r"one voxel size.*\[16\.0, 16\.0, 16\.0\] nm"):
        predict_ensemble([tiny_run, coarse], "test", tmp_path / "a.zarr", opts=OPTS)
    bare = tmp_path / "bare"
    shutil.copytree(tiny_run_2d, bare)
    shutil.rmtree(bare / "checkpoints")
    with pytest.raises(FileNotFoundError, match=r"no checkpoint last\.pt"):
        predict_ensemble([tiny_run, bare], "test", tmp_path / "a.zarr", opts=OPTS)
    assert not (tmp_path / "a.zarr").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_equals_two_step_on_cuda(tiny_run, tiny_run_2d, tmp_path):
    """On the GPU (bf16, compiled members, sums and the mean on the device) the numbers are still those of
    `cellseg predict` per member + `cellseg ensemble` on the host."""
    opts = InferConfig(**{**OPTS.__dict__, "device": "cuda", "compile": "on"})
    for run, name in ((tiny_run, "a.zarr"), (tiny_run_2d, "b.zarr")):
        predict_run(run, "test", tmp_path / name, opts)
    ensemble(EnsembleConfig(members=(tmp_path / "a.zarr", tmp_path / "b.zarr"), weights=(0.7, 0.3)),
             tmp_path / "two_step.zarr")
    predict_ensemble([tiny_run, tiny_run_2d], "test", tmp_path / "fused.zarr", weights=[0.7, 0.3], opts=opts)
    assert_same_stores(tmp_path / "fused.zarr", tmp_path / "two_step.zarr")
