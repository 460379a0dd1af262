"""Decoding on another grid than the model's (`cellseg.postprocess.native`): hand-made probabilities."""

from __future__ import annotations

import numpy as np
import pytest
from blobs import random_probabilities

from cellseg.data.grid import Grid
from cellseg.postprocess.native import (
    axis_maps,
    decode_coarse,
    decode_on_grid,
    drop_small_pieces,
    iter_decode,
    keep_every_object,
    linear_probability,
    piece_limit,
    plain_params,
    refine,
    segment_class,
)
from cellseg.postprocess.params import InstanceParams, SemanticParams

MODEL = Grid.of(translation_nm=(4, 4, 4), shape_vox=(24, 24, 24), voxel_size_nm=(8, 8, 8))
FINE = Grid.of(translation_nm=(1, 1, 1), shape_vox=(96, 96, 96), voxel_size_nm=(2, 2, 2))
CENTRE_NM, RADIUS_NM = np.array([97.3, 95.1, 98.7]), 52.0


def _distance(grid: Grid) -> np.ndarray:
    z, y, x = (t + v * np.arange(n) for t, v, n in zip(grid.translation_nm, grid.voxel_size_nm, grid.shape_vox,
                                                          strict=True))
    return np.sqrt((z[:, None, None] - CENTRE_NM[0]) ** 2 + (y[None, :, None] - CENTRE_NM[1]) ** 2
                   + (x[None, None, :] - CENTRE_NM[2]) ** 2)


def _sphere_probability(grid: Grid) -> np.ndarray:
    """A sphere's probability, soft over a few nm (what a model at `grid` would predict)."""
    return (1 / (1 + np.exp((_distance(grid) - RADIUS_NM) / 4.0))).astype(np.float32)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / (a | b).sum())


def _nearest_upsampled(labels: np.ndarray, factor: int) -> np.ndarray:
    return labels.repeat(factor, 0).repeat(factor, 1).repeat(factor, 2)


@pytest.mark.parametrize("name,params", [("er", SemanticParams()), ("mito", InstanceParams())])
def test_a_sphere_at_8nm_decoded_at_2nm_beats_nearest_upsampling(name, params):
    prob = _sphere_probability(MODEL)
    truth = _distance(FINE) < RADIUS_NM
    fine = decode_on_grid(name, prob, source=MODEL, target=FINE, params=params) > 0
    nearest = _nearest_upsampled(segment_class(name, prob, None, voxel_size_nm=MODEL.voxel_size_nm, params=params),
                                 4) > 0
    assert _iou(fine, truth) > 0.985 > _iou(nearest, truth) + 0.04
    if name == "mito":
        assert decode_on_grid(name, prob, source=MODEL, target=FINE, params=params).max() == 1


def test_semantic_without_post_ops_is_exactly_the_thresholded_interpolation():
    rng = np.random.default_rng(0)
    prob = random_probabilities(rng, MODEL.shape_vox, sigma=1.5)
    target = Grid.of(translation_nm=(-3.0, 7.5, 2.0), shape_vox=(70, 41, 103), voxel_size_nm=(2.62, 4.0, 1.74))
    mask = decode_on_grid("er", prob, source=MODEL, target=target, params=SemanticParams(threshold=0.45))
    lin = linear_probability(prob, axis_maps(MODEL, target))
    assert mask.dtype == bool and np.array_equal(mask, lin > np.float32(0.45))
    # linear interpolation by hand at one voxel inside the source box
    z, y, x = 20, 17, 50
    u = [(t + i * v - s) / sv for t, i, v, s, sv in zip(target.translation_nm, (z, y, x), target.voxel_size_nm,
                                                        MODEL.translation_nm, MODEL.voxel_size_nm, strict=True)]
    lo = [int(np.floor(a)) for a in u]
    f = [a - b for a, b in zip(u, lo, strict=True)]
    value = sum(prob[lo[0] + dz, lo[1] + dy, lo[2] + dx] * (f[0] if dz else 1 - f[0]) * (f[1] if dy else 1 - f[1])
                * (f[2] if dx else 1 - f[2]) for dz in (0, 1) for dy in (0, 1) for dx in (0, 1))
    assert lin[z, y, x] == pytest.approx(value, abs=1e-6)


def _cases():
    rng = np.random.default_rng(3)
    prob = random_probabilities(rng, (20, 22, 26), sigma=1.6)
    boundary = random_probabilities(rng, (20, 22, 26), sigma=1.0)
    return prob, boundary, [
        ("er", SemanticParams(threshold=0.5)),
        ("er", SemanticParams(threshold=0.4, fill_holes=True, min_size_nm3=20 * 512.0)),
        ("mito", InstanceParams(threshold=0.5, seed_distance_nm=8.0, min_size_nm3=10 * 512.0)),
        ("mito", plain_params("mito")),
        ("mito", InstanceParams(threshold=0.45, use_boundary=True, fill_holes=True)),
    ]


@pytest.mark.parametrize("index", range(5))
def test_on_the_model_grid_it_equals_segment_class(index):
    prob, boundary, cases = _cases()
    name, params = cases[index]
    grid = Grid.of(translation_nm=(12, -4, 100), shape_vox=prob.shape, voxel_size_nm=(8, 8, 8))
    expected = segment_class(name, prob, boundary, voxel_size_nm=grid.voxel_size_nm, params=params)
    got = decode_on_grid(name, prob, boundary, source=grid, target=grid, params=params)
    assert got.dtype == expected.dtype and np.array_equal(got, expected)


@pytest.mark.parametrize("index", range(5))
def test_slabs_equal_the_one_shot_result_and_never_merge_ids(index):
    prob, boundary, cases = _cases()
    name, params = cases[index]
    source = Grid.of(translation_nm=(4, 4, 4), shape_vox=prob.shape, voxel_size_nm=(8, 8, 8))
    target = Grid.of(translation_nm=(6.5, 3, 9), shape_vox=(61, 45, 70), voxel_size_nm=(2.62, 3.0, 2.0))
    coarse = decode_coarse(name, prob, boundary, voxel_size_nm=source.voxel_size_nm, params=params)
    whole = decode_on_grid(name, prob, boundary, source=source, target=target, params=params)
    for planes in (1, 7, 64):
        slabs = list(iter_decode(coarse, source, target, planes=planes))
        assert [z for z, _ in slabs] == list(range(0, 61, planes))
        joined = np.concatenate([s for _, s in slabs])
        if coarse.instance:  # step 5 works on the whole crop
            joined = drop_small_pieces(joined, piece_limit(source, target))
        assert np.array_equal(joined, whole)
    if name == "mito":  # every id comes from the source decoding, each at its own source voxels
        ids = segment_class(name, prob, boundary, voxel_size_nm=source.voxel_size_nm, params=params)
        maps = axis_maps(source, target)
        nearest = ids[np.ix_(maps[0].nearest, maps[1].nearest, maps[2].nearest)]
        assert set(np.unique(whole)) <= set(np.unique(ids))
        inside = (whole > 0) & (nearest > 0)
        assert np.array_equal(whole[inside], nearest[inside])


def test_removed_voxels_stay_removed_and_added_ones_stay_added():
    prob = np.zeros((12, 12, 12), np.float32)
    prob[2:9, 2:9, 2:9] = 0.9
    prob[5, 5, 5] = 0.1  # a hole, filled on the model grid
    prob[10, 10, 10] = 0.95  # a lone voxel, removed by the size filter
    source = Grid.of(translation_nm=(4, 4, 4), shape_vox=prob.shape, voxel_size_nm=(8, 8, 8))
    target = Grid.of(translation_nm=(1, 1, 1), shape_vox=(48, 48, 48), voxel_size_nm=(2, 2, 2))
    params = SemanticParams(fill_holes=True, min_size_nm3=2 * 512.0)
    mask = decode_on_grid("er", prob, source=source, target=target, params=params)
    assert mask[20:24, 20:24, 20:24].all()  # the filled hole's target voxels
    assert not mask[38:, 38:, 38:].any()  # the removed voxel and its surroundings
    ids = decode_on_grid("mito", prob, source=source, target=target,
                         params=InstanceParams(fill_holes=True, min_size_nm3=2 * 512.0))
    assert ids[20:24, 20:24, 20:24].min() == 1 and not ids[38:, 38:, 38:].any() and ids.max() == 1


def test_a_target_outside_the_source_box_repeats_the_edge():
    prob = np.full((4, 4, 4), 0.8, np.float32)
    source = Grid.of(translation_nm=(4, 4, 4), shape_vox=(4, 4, 4), voxel_size_nm=(8, 8, 8))
    target = Grid.of(translation_nm=(-5, -5, -5), shape_vox=(20, 20, 20), voxel_size_nm=(2, 2, 2))
    assert decode_on_grid("er", prob, source=source, target=target, params=SemanticParams()).all()


def test_an_object_the_interpolation_would_lose_keeps_its_nearest_upsampled_voxels():
    prob = np.zeros((10, 10, 10), np.float32)
    prob[2, 2, 2] = 0.55  # a lone voxel barely above t: every interpolated value around it stays under 0.5
    prob[5:9, 5:9, 5:9] = 0.9  # a sure object
    source = Grid.of(translation_nm=(4, 4, 4), shape_vox=prob.shape, voxel_size_nm=(8, 8, 8))
    target = Grid.of(translation_nm=(1, 1, 1), shape_vox=(40, 40, 40), voxel_size_nm=(2, 2, 2))
    params = InstanceParams(fill_holes=False)
    coarse = decode_coarse("mito", prob, voxel_size_nm=source.voxel_size_nm, params=params)
    maps = axis_maps(source, target)
    assert coarse.num_objects == 2 and set(np.unique(refine(coarse, maps))) == {0, 2}  # step 3 alone loses id 1
    kept = keep_every_object(coarse, maps)
    assert kept.added is not None and kept.added.sum() == 1 and kept.added[2, 2, 2]
    ids = decode_on_grid("mito", prob, source=source, target=target, params=params)
    assert set(np.unique(ids)) == {0, 1, 2} and (ids == 1).sum() == 4**3 and ids[8:12, 8:12, 8:12].min() == 1
    assert np.array_equal(np.concatenate([s for _, s in iter_decode(coarse, source, target, planes=3)]), ids)
    prob[2, 2, 2] = 0.45  # not an object at all: nothing to keep
    assert decode_on_grid("mito", prob, source=source, target=target, params=params).max() == 1


def test_small_pieces_of_an_id_are_dropped_when_it_keeps_a_larger_one():
    """Step 5: a piece under the limit goes only when its id has a larger piece; an id's only piece, however
    small, and pieces at or above the limit stay."""
    ids = np.zeros((12, 12, 12), np.uint32)
    ids[0:4, 0:4, 0:4] = 1  # id 1: 64 voxels and a detached voxel
    ids[8, 8, 8] = 1
    ids[0:2, 8:10, 0:2] = 2  # id 2: two pieces of 8 voxels
    ids[6:8, 8:10, 0:2] = 2
    ids[10, 0, 10] = 3  # id 3: one voxel, alone
    ids[5, 5, 11] = ids[7, 5, 11] = 4  # id 4: two single voxels: the first in raster order stays
    out = drop_small_pieces(ids.copy(), 8)
    assert out[8, 8, 8] == 0 and (out[0:4, 0:4, 0:4] == 1).all()
    assert (out == 2).sum() == 16 and out[10, 0, 10] == 3
    assert out[5, 5, 11] == 4 and out[7, 5, 11] == 0
    assert set(np.unique(out)) == set(np.unique(ids))  # no object lost
    assert np.array_equal(drop_small_pieces(ids.copy(), 1), ids)


def test_piece_limit_is_one_source_voxel_on_finer_grids_only():
    def grid(vs):
        return Grid.of(translation_nm=(0, 0, 0), shape_vox=(4, 4, 4), voxel_size_nm=vs)

    assert piece_limit(grid((8, 8, 8)), grid((4, 4, 4))) == 8
    assert piece_limit(grid((8, 8, 8)), grid((2, 2, 2))) == 64
    assert piece_limit(grid((8, 8, 8)), grid((1.74, 2, 2))) == 73  # 4.6 x 4 x 4, rounded down
    assert piece_limit(grid((8, 8, 8)), grid((8, 8, 8))) == 0
    assert piece_limit(grid((8, 8, 8)), grid((16, 16, 16))) == 0
