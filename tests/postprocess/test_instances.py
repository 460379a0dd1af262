"""The instance algorithm on crafted volumes (CPU path; the torch path is held equal in test_agreement.py)."""

from __future__ import annotations

import numpy as np
import pytest
from blobs import ball, random_probabilities
from scipy import ndimage as ndi

from cellseg.postprocess.instances import segment_instances
from cellseg.postprocess.morphology import capped_sq_distance, components
from cellseg.postprocess.params import InstanceParams, SemanticParams
from cellseg.postprocess.semantic import segment_semantic
from cellseg.postprocess.spec import DistanceMetric

ISO = (8.0, 8.0, 8.0)


def two_spheres(voxel_size_nm=ISO, shape=(40, 40, 60), radius_nm=80.0, gap_nm=-16.0):
    """Two equal balls whose surfaces overlap by -gap_nm along x (touching, one foreground component)."""
    centre_a = (shape[0] * voxel_size_nm[0] / 2, shape[1] * voxel_size_nm[1] / 2, 2.2 * radius_nm)
    centre_b = (centre_a[0], centre_a[1], centre_a[2] + 2 * radius_nm + gap_nm)
    a = ball(shape, centre_a, radius_nm, voxel_size_nm)
    b = ball(shape, centre_b, radius_nm, voxel_size_nm)
    return a, b


def test_two_touching_spheres_become_exactly_two_objects():
    a, b = two_spheres()
    prob = np.where(a | b, 0.9, 0.05).astype(np.float32)
    assert components(a | b, 26)[1] == 1  # they touch: one foreground component
    ids = segment_instances(prob, voxel_size_nm=ISO, params=InstanceParams(seed_distance_nm=40.0))
    assert ids.max() == 2
    # each object is (almost) one ball: the split runs through the contact disc
    for truth in (a & ~b, b & ~a):
        _, counts = np.unique(ids[truth], return_counts=True)
        assert counts.max() / truth.sum() > 0.97
    assert set(np.unique(ids[a & ~b])) != set(np.unique(ids[b & ~a]))


def test_boundary_channel_alone_splits_touching_spheres():
    a, b = two_spheres()
    prob = np.where(a | b, 0.9, 0.05).astype(np.float32)
    contact = ndi.binary_dilation(a, iterations=1) & ndi.binary_dilation(b, iterations=1)
    boundary = np.where(contact, 0.8, 0.1).astype(np.float32)
    merged = segment_instances(prob, voxel_size_nm=ISO, params=InstanceParams())  # s = 0, no boundary
    split = segment_instances(prob, boundary, voxel_size_nm=ISO, params=InstanceParams())
    assert merged.max() == 1 and split.max() == 2
    assert np.array_equal(split > 0, a | b)  # boundary voxels are grown back into the objects


@pytest.mark.parametrize("seed_distance_nm", [0.0, 16.0, 40.0, 64.0, 200.0])
def test_single_sphere_stays_one_object(seed_distance_nm):
    sphere = ball((40, 40, 40), (160, 160, 160), 100.0, ISO)
    prob = np.where(sphere, 0.8, 0.1).astype(np.float32)
    ids = segment_instances(prob, voxel_size_nm=ISO, params=InstanceParams(seed_distance_nm=seed_distance_nm))
    assert ids.max() == 1
    assert np.array_equal(ids > 0, sphere)  # a seed distance above the radius never deletes the object


def test_anisotropic_voxels_spheres_in_nm():
    vs = (10.0, 4.0, 4.0)  # z voxels 2.5× longer: the balls are 16 voxels across in z, 40 in y/x
    a, b = two_spheres(vs, shape=(24, 60, 110), radius_nm=80.0, gap_nm=-12.0)
    prob = np.where(a | b, 0.9, 0.05).astype(np.float32)
    ids = segment_instances(prob, voxel_size_nm=vs, params=InstanceParams(seed_distance_nm=40.0))
    assert ids.max() == 2
    sizes = np.bincount(ids.ravel())[1:]
    assert abs(int(sizes[0]) - int(sizes[1])) / sizes.max() < 0.05  # a symmetric split
    assert DistanceMetric.of(vs).weights == (80, 32, 32)
    # Read as 4 nm isotropic voxels, the balls would be 2.5× flatter (32 nm half-height): a 40 nm seed
    # distance then erodes them away and they stay merged. The physical metric is what splits them.
    flat = segment_instances(prob, voxel_size_nm=(4.0, 4.0, 4.0), params=InstanceParams(seed_distance_nm=40.0))
    assert flat.max() == 1


def test_small_objects_removed_and_ids_consecutive_uint32():
    big = ball((30, 30, 30), (120, 120, 120), 64.0, ISO)
    prob = np.where(big, 0.9, 0.0).astype(np.float32)
    prob[2:4, 2:4, 2:4] = 0.9  # 8 voxels
    prob[25:28, 2:5, 2:5] = 0.9  # 27 voxels
    voxel = float(np.prod(ISO))
    kept = segment_instances(prob, voxel_size_nm=ISO, params=InstanceParams(min_size_nm3=10 * voxel))
    assert kept.dtype == np.uint32
    assert kept.max() == 2 and np.array_equal(np.unique(kept), [0, 1, 2])
    assert not kept[2:4, 2:4, 2:4].any() and kept[25:28, 2:5, 2:5].all()
    all_kept = segment_instances(prob, voxel_size_nm=ISO, params=InstanceParams())
    assert all_kept.max() == 3


def test_ids_consecutive_on_random_blobs():
    prob = random_probabilities(np.random.default_rng(0), (32, 36, 40), sigma=1.5)
    ids = segment_instances(prob, voxel_size_nm=(5.24, 4.0, 4.0),
                            params=InstanceParams(threshold=0.55, seed_distance_nm=6.0, min_size_nm3=400.0))
    n = int(ids.max())
    assert ids.dtype == np.uint32 and n > 3
    assert np.array_equal(np.unique(ids), np.arange(n + 1))
    for k in range(1, n + 1):  # every object is one 26-connected piece (the evaluator relabels by components)
        assert components(ids == k, 26)[1] == 1


def test_every_foreground_component_keeps_an_object():
    prob = random_probabilities(np.random.default_rng(1), (30, 30, 30), sigma=1.2)
    fg = prob > 0.5
    for s in (0.0, 8.0, 24.0, 80.0):
        ids = segment_instances(prob, voxel_size_nm=ISO, params=InstanceParams(seed_distance_nm=s, fill_holes=False))
        assert np.array_equal(ids > 0, fg)
        assert ids.max() >= components(fg, 26)[1]


def test_holes_are_filled():
    shell = ball((30, 30, 30), (120, 120, 120), 90.0, ISO) & ~ball((30, 30, 30), (120, 120, 120), 50.0, ISO)
    prob = np.where(shell, 0.9, 0.1).astype(np.float32)
    filled = segment_instances(prob, voxel_size_nm=ISO, params=InstanceParams())
    hollow = segment_instances(prob, voxel_size_nm=ISO, params=InstanceParams(fill_holes=False))
    assert filled[15, 15, 15] == 1 and hollow[15, 15, 15] == 0
    assert np.array_equal(filled > 0, ball((30, 30, 30), (120, 120, 120), 90.0, ISO))


@pytest.mark.parametrize("vs", [(8.0, 8.0, 8.0), (2.62, 2.0, 2.0), (1.74, 2.0, 2.0), (16.0, 4.0, 8.0)])
def test_capped_distance_is_exact(vs):
    """Below the cap, the integer distance equals scipy's exact transform with the integer weights."""
    core = random_probabilities(np.random.default_rng(2), (20, 24, 28), sigma=1.5) > 0.4
    metric = DistanceMetric.of(vs)
    threshold = metric.threshold_sq(5 * min(vs))
    exact = np.rint(ndi.distance_transform_edt(core, sampling=metric.weights) ** 2).astype(np.int64)
    capped = capped_sq_distance(core, metric, threshold)
    assert capped.dtype == np.int32
    assert np.array_equal(capped, np.minimum(exact, threshold + 1))


def test_semantic_threshold_holes_and_small_components():
    prob = np.zeros((20, 20, 20), dtype=np.float32)
    prob[2:12, 2:12, 2:12] = 0.7
    prob[6:8, 6:8, 6:8] = 0.2  # a hole
    prob[15:17, 15:17, 15:17] = 0.6  # 8 voxels
    voxel = float(np.prod(ISO))
    plain = segment_semantic(prob, voxel_size_nm=ISO, params=SemanticParams())
    assert plain.dtype == bool and plain.sum() == 1000 - 8 + 8
    cleaned = segment_semantic(prob, voxel_size_nm=ISO,
                               params=SemanticParams(fill_holes=True, min_size_nm3=9 * voxel))
    assert cleaned.sum() == 1000 and cleaned[7, 7, 7] and not cleaned[16, 16, 16]
    high = segment_semantic(prob, voxel_size_nm=ISO, params=SemanticParams(threshold=0.65))
    assert high.sum() == 1000 - 8


def test_bad_inputs_are_clear_errors():
    prob = np.zeros((8, 8, 8), dtype=np.float64)
    with pytest.raises(ValueError, match="float32"):
        segment_instances(prob, voxel_size_nm=ISO, params=InstanceParams())
    with pytest.raises(ValueError, match="seed_distance_nm"):
        InstanceParams(seed_distance_nm=-1.0)
    with pytest.raises(ValueError, match="threshold"):
        SemanticParams(threshold=1.5)
    with pytest.raises(ValueError, match="voxel size"):
        segment_instances(prob.astype(np.float32), voxel_size_nm=(8.0, 0.0, 8.0), params=InstanceParams())
