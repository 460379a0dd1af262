"""Block-wise prediction and the streaming crop writer: blocks tile the crop once, a crop cut into columns
matches the one-column prediction, a killed run resumes after the last planes it wrote with exactly the values
of an uninterrupted run, and the writer refuses bad regions, dtypes and incomplete crops."""

import numpy as np
import pytest
import torch

from cellseg.config.inference import InferConfig
from cellseg.data.crops import Catalog
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore
from cellseg.infer.predict import predict_run
from cellseg.infer.tiling import HOST_BLOCK_BYTES, auto_block_vox, plan_blocks

GRID = Grid(translation_nm=(4.0, 4.0, 4.0), shape_vox=(10, 12, 7), voxel_size_nm=(8.0, 8.0, 8.0))


def _first_test_crop(root) -> str:
    crops = Catalog.from_dir(root).test("2026")
    return max(crops.values(), key=lambda c: c.geometry.extent_nm[0]).name  # the largest, for several blocks


def test_blocks_tile_the_grid_exactly_once():
    for shape, edge in (((10, 12, 7), 4), ((64, 64, 64), 64), ((130, 5, 200), 64), ((1, 1, 1), 8)):
        covered = np.zeros(shape, dtype=np.int32)
        for offset, size in plan_blocks(shape, edge):
            assert all(0 < n <= edge for n in size)
            covered[tuple(slice(o, o + n) for o, n in zip(offset, size, strict=True))] += 1
        assert (covered == 1).all()


def test_auto_block_is_chunk_aligned_and_respects_host_memory():
    cpu = torch.device("cpu")
    for channels in (1, 58, 400):
        edge = auto_block_vox(channels, (64, 64, 64), cpu)
        assert edge % 64 == 0 and edge >= 64
        if edge > 64:  # the smallest block is used whatever the budget
            sums = (channels + 3) * (edge + 128) ** 3 * 4
            assert channels * edge ** 3 * 2 + sums <= HOST_BLOCK_BYTES
    assert auto_block_vox(58, (64, 64, 64), cpu) < auto_block_vox(1, (64, 64, 64), cpu)
    with pytest.raises(ValueError, match="--block 0"):
        InferConfig(block_vox=0)


def test_blockwise_crop_matches_one_block(tiny_run, tiny_synth_root, tmp_path):
    crop = _first_test_crop(tiny_synth_root)
    one, blocks = tmp_path / "one.zarr", tmp_path / "blocks.zarr"
    opts = dict(tta=1, overlap=0.5, progress=False)
    predict_run(tiny_run, crop.removeprefix("crop"), one, InferConfig(**opts))
    [summary] = predict_run(tiny_run, crop.removeprefix("crop"), blocks, InferConfig(block_vox=16, **opts))
    a, b = PredictionStore.open(one), PredictionStore.open(blocks)
    assert summary["blocks"] > 1 and b.crop_attrs(crop)["block_vox"] == 16
    assert a.crop_attrs(crop)["blocks"] == 1
    assert a.grid(crop) == b.grid(crop)
    assert a.crop_channels(crop) == b.crop_channels(crop)
    for channel in a.crop_channels(crop):
        x, y = a.read(crop, channel), b.read(crop, channel)
        # Every block has its full context margin: only the tile placement differs.
        assert np.abs(x - y).mean() < 0.02 and np.abs(x - y).max() < 0.25, channel
    assert sorted(p.name for p in b.path.glob(".*")) == [".zattrs", ".zgroup"]  # no partial crop left behind


def test_killed_run_resumes_after_the_planes_it_wrote(tiny_run, tiny_synth_root, tmp_path):
    crop = _first_test_crop(tiny_synth_root)
    ids = crop.removeprefix("crop")
    opts = InferConfig(tta=1, overlap=0.0, block_vox=16, progress=False)
    predict_run(tiny_run, ids, tmp_path / "ref.zarr", opts)
    reference = PredictionStore.open(tmp_path / "ref.zarr")
    grid = reference.grid(crop)

    def killed_run(out, key: str) -> PredictionStore:
        """The state a run killed after writing planes 0-15 of its first column leaves: a partial crop."""
        store = PredictionStore.create(out, kind="probabilities", channels=reference.channels,
                                       instance_channels=reference.instance_channels,
                                       provenance=reference.provenance)
        writer = store.crop_writer(crop, grid, key=key, channels=reference.crop_channels(crop))
        for channel in reference.crop_channels(crop):
            writer.write(channel, np.full((16, 16, 16), 0.25, dtype=np.float32))  # column (0, 0, 0), z 0-15
        writer.mark_done("0_0_0:16")
        assert crop not in store and store.completed() == []
        return store

    resumed = killed_run(tmp_path / "resumed.zarr", "column16")
    predict_run(tiny_run, ids, resumed.path, opts)
    first = (slice(0, 16),) * 3
    for channel in reference.crop_channels(crop):
        got, want = resumed.read(crop, channel), reference.read(crop, channel)
        assert (got[first] == 0.25).all(), "the planes written were predicted again"
        rest = np.ones(got.shape, dtype=bool)
        rest[first] = False
        np.testing.assert_array_equal(got[rest], want[rest])
    # A partial crop written with other columns is not resumed: it is predicted again from scratch.
    other = killed_run(tmp_path / "other.zarr", "column32")
    predict_run(tiny_run, ids, other.path, opts)
    for channel in reference.crop_channels(crop):
        np.testing.assert_array_equal(other.read(crop, channel), reference.read(crop, channel))


def test_crop_writer_streams_channels_and_refuses_bad_writes(tmp_path):
    store = PredictionStore.create(tmp_path / "seg.zarr", kind="segmentation", channels=["mito", "er"],
                                   instance_channels=["mito"])
    writer = store.crop_writer("crop1", GRID)
    ids = np.arange(10 * 12 * 7, dtype=np.uint32).reshape(GRID.shape_vox)
    writer.write("mito", ids[:5], (0, 0, 0))
    writer.write("mito", ids[5:], (5, 0, 0))
    with pytest.raises(ValueError, match=r"crop1/mito: region \(6, 12, 7\) at \(5, 0, 0\) is not inside"):
        writer.write("mito", ids[4:], (5, 0, 0))
    with pytest.raises(ValueError, match="crop1/er: a semantic mask must be bool"):
        writer.write("er", np.full(GRID.shape_vox, 2, dtype=np.uint8))
    with pytest.raises(ValueError, match="crop1/mito: instance ids must be non-negative"):
        writer.write("mito", -np.ones((1, 1, 1), dtype=np.int64))
    with pytest.raises(ValueError, match=r"channels never written: \['er'\]"):
        writer.commit()
    writer.write("er", ids % 2 == 0)
    writer.commit({"dataset": "synth"})
    assert store.completed() == ["crop1"] and store.crop_attrs("crop1")["dataset"] == "synth"
    np.testing.assert_array_equal(store.read("crop1", "mito"), ids)
    assert store.read("crop1", "er").dtype == np.uint8
    with pytest.raises(FileExistsError, match="crop1 already exists"):
        store.crop_writer("crop1", GRID)
    again = store.crop_writer("crop1", GRID, overwrite=True)
    again.write("mito", np.zeros(GRID.shape_vox, dtype=np.uint32))
    again.write("er", np.zeros(GRID.shape_vox, dtype=bool))
    again.commit()
    assert store.read("crop1", "mito").max() == 0
    assert sorted(p.name for p in store.path.iterdir()) == [".zattrs", ".zgroup", "crop1"]


def test_probability_writer_keeps_one_dtype_per_channel(tmp_path):
    store = PredictionStore.create(tmp_path / "p.zarr", kind="probabilities", channels=["mito"])
    writer = store.crop_writer("crop2", GRID)
    writer.write("mito", np.zeros((2, 12, 7), dtype=np.uint8))
    with pytest.raises(ValueError, match="writing float16 into a uint8 array"):
        writer.write("mito", np.zeros((2, 12, 7), dtype=np.float32), (2, 0, 0))
