"""Multiscale levels built block by block (`cellseg.volume.pyramid`) equal down-sampling the whole array."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from cellseg.data.ngff import parse_multiscales, pyramid_levels
from cellseg.data.write import downsample_2x
from cellseg.volume.pyramid import (
    create_levels,
    downsample,
    downsample_block,
    downsample_store_block,
    level_positions,
    level_shapes,
    method_for,
    multiscale_attrs,
)

SHAPE = (45, 38, 51)  # odd sizes: the last voxel of an axis stands alone at every level


def whole(data: np.ndarray, method: str, levels: int) -> list[np.ndarray]:
    """Down-sampling of the whole array, level after level (the reference)."""
    out = [data]
    for _ in range(1, levels):
        prev = out[-1]
        out.append(prev[::2, ::2, ::2] if method == "stride" else downsample_2x(prev, "em" if method == "mean"
                                                                                  else "labels"))
    return out


def volumes() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    probs = rng.integers(0, 256, SHAPE, dtype=np.uint8)
    ids = rng.integers(0, 40, SHAPE).astype(np.uint64) * np.uint64(2**33)  # large ids: no float rounding
    masks = (rng.random(SHAPE) < 0.4).astype(np.uint8)
    return {"mean": probs, "stride": ids, "mode": masks}


@pytest.mark.parametrize("method", ["mean", "stride", "mode"])
@pytest.mark.parametrize("block", [4, 8, 16])
def test_blockwise_levels_equal_whole_array_downsampling(method, block):
    data = volumes()[method]
    expected = whole(data, method, 4)
    levels = [data]
    for shape in level_shapes(SHAPE, 4)[1:]:
        dst = np.zeros(shape, data.dtype)
        for pos in level_positions(shape, (block,) * 3):
            downsample_block(levels[-1], dst, pos, block_vox=(block,) * 3, method=method)  # reads only level k
        levels.append(dst)
    for got, want in zip(levels, expected, strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_store_levels_and_multiscale_attributes(tmp_path):
    group = tmp_path / "out.zarr" / "labels" / "mito"
    group.mkdir(parents=True)
    (group / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    attrs = multiscale_attrs((8.0, 8.0, 8.0), (4.0, 104.0, 4.0), 1, name="mito", label=True)
    (group / ".zattrs").write_text(json.dumps(attrs))
    data = volumes()["stride"]
    s0 = zarr.open_array(str(group / "s0"), mode="w-", shape=SHAPE, chunks=(8, 8, 8), dtype=np.uint64,
                         dimension_separator="/")
    s0[...] = data
    shapes = create_levels(group, 3)
    assert shapes == level_shapes(SHAPE, 3) == [SHAPE, (23, 19, 26), (12, 10, 13)]
    for level, shape in enumerate(shapes[1:], start=1):
        for pos in level_positions(shape, (8, 8, 8)):
            downsample_store_block(group, level, [p * 8 for p in pos], block_vox=(8, 8, 8))  # "image-label": stride
    for level, want in enumerate(whole(data, "stride", 3)):
        assert np.array_equal(zarr.open_array(str(group / f"s{level}"), mode="r")[...], want)
    meta = json.loads((group / ".zattrs").read_text())
    assert meta["image-label"]["version"] == "0.4"
    parsed = parse_multiscales(meta, source=str(group))
    assert parsed == pyramid_levels((8.0, 8.0, 8.0), (4.0, 104.0, 4.0), 3)
    assert create_levels(group, 3) == shapes  # a resumed run keeps the levels
    with pytest.raises(ValueError, match="not on the"):
        downsample_store_block(group, 1, (4, 0, 0), block_vox=(8, 8, 8))
    with pytest.raises(ValueError, match="level 0"):
        downsample_store_block(group, 0, (0, 0, 0), block_vox=(8, 8, 8))


def test_default_methods_and_bad_input():
    assert method_for(np.uint8, label=False) == "mean"
    assert method_for(np.uint8, label=True) == "mode"
    assert method_for(np.uint64, label=True) == "stride"
    with pytest.raises(ValueError, match="method must be"):
        downsample(np.zeros((2, 2, 2), np.uint8), "max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="halved"):
        downsample_block(np.zeros((8, 8, 8)), np.zeros((3, 4, 4)), (0, 0, 0), block_vox=(4, 4, 4), method="mean")
