"""The CPU path and the torch path give the same arrays, voxel for voxel (torch on CPU here; CUDA marked gpu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from blobs import random_probabilities

from cellseg.postprocess import gpu
from cellseg.postprocess.instances import segment_instances
from cellseg.postprocess.morphology import capped_sq_distance, components, fill_holes
from cellseg.postprocess.params import InstanceParams, SemanticParams
from cellseg.postprocess.semantic import segment_semantic
from cellseg.postprocess.spec import DistanceMetric

VOXEL_SIZES = [(8.0, 8.0, 8.0), (5.24, 4.0, 4.0), (1.74, 2.0, 2.0), (16.0, 8.0, 4.0)]


def _case(seed: int):
    """Random smooth probabilities and boundary probabilities, shape, voxel size and parameters."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(6, 26, size=3))
    prob = random_probabilities(rng, shape, sigma=float(rng.uniform(1.0, 2.5)))
    boundary = random_probabilities(rng, shape, sigma=1.0)
    vs = VOXEL_SIZES[seed % len(VOXEL_SIZES)]
    params = InstanceParams(threshold=float(rng.uniform(0.35, 0.65)), boundary_threshold=float(rng.uniform(0.5, 0.7)),
                            seed_distance_nm=float(rng.uniform(0, 4)) * min(vs),
                            min_size_nm3=float(rng.integers(0, 12)) * float(np.prod(vs)),
                            fill_holes=bool(seed % 3), use_boundary=bool(seed % 2))
    return prob, boundary, vs, params


@pytest.mark.parametrize("connectivity", [6, 26])
def test_components_number_like_cc3d(connectivity):
    rng = np.random.default_rng(connectivity)
    for _ in range(4):
        mask = random_probabilities(rng, (17, 23, 29), sigma=1.0) > rng.uniform(0.3, 0.7)
        expected, n = components(mask, connectivity)
        labels, count = gpu.components(torch.from_numpy(mask), connectivity)
        assert count == n
        assert np.array_equal(labels.numpy(), expected)


def test_capped_distance_and_holes_agree():
    rng = np.random.default_rng(3)
    for vs in VOXEL_SIZES:
        core = random_probabilities(rng, (15, 19, 21), sigma=1.3) > 0.45
        metric = DistanceMetric.of(vs)
        threshold = metric.threshold_sq(3.5 * max(vs))
        cpu = capped_sq_distance(core, metric, threshold)
        assert np.array_equal(gpu.capped_sq_distance(torch.from_numpy(core), metric, threshold).numpy(), cpu)
        assert np.array_equal(gpu.fill_holes(torch.from_numpy(core)).numpy(), fill_holes(core))


@pytest.mark.parametrize("seed", range(24))
def test_instances_identical_on_random_blobs(seed):
    prob, boundary, vs, params = _case(seed)
    expected = segment_instances(prob, boundary, voxel_size_nm=vs, params=params)
    got = gpu.to_numpy_ids(gpu.segment_instances_torch(prob, boundary, voxel_size_nm=vs, params=params, device="cpu"))
    assert got.dtype == expected.dtype == np.uint32
    assert np.array_equal(got, expected), f"{int((got != expected).sum())} voxels differ ({params})"


@pytest.mark.parametrize("seed", range(4))
def test_semantic_identical_on_random_blobs(seed):
    prob, _, vs, p = _case(seed)
    params = SemanticParams(threshold=p.threshold, min_size_nm3=p.min_size_nm3, fill_holes=p.fill_holes)
    expected = segment_semantic(prob, voxel_size_nm=vs, params=params)
    got = gpu.segment_semantic_torch(prob, voxel_size_nm=vs, params=params, device="cpu").numpy()
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("shape", [(5, 6, 7), (1, 30, 30), (1, 1, 40), (1, 1, 1)])
@pytest.mark.parametrize("fill", ["zeros", "ones", "random"])
def test_edge_cases_agree(shape, fill):
    """Empty, full, single-slice (2D) and single-voxel volumes."""
    prob = {"zeros": np.zeros(shape, np.float32), "ones": np.ones(shape, np.float32),
            "random": np.random.default_rng(0).random(shape).astype(np.float32)}[fill]
    boundary = np.ascontiguousarray(prob[::-1])
    for params in (InstanceParams(), InstanceParams(seed_distance_nm=8.0, min_size_nm3=3 * 64.0),
                   InstanceParams(fill_holes=False, seed_distance_nm=3.0)):
        expected = segment_instances(prob, boundary, voxel_size_nm=(4.0, 4.0, 4.0), params=params)
        got = gpu.segment_instances_torch(prob, boundary, voxel_size_nm=(4.0, 4.0, 4.0), params=params, device="cpu")
        assert np.array_equal(gpu.to_numpy_ids(got), expected)
    if fill == "ones":
        assert expected.max() == 1


def test_many_seeds_use_the_integer_growth():
    """More ids than float32 holds exactly would switch the growth to int32; the rule stays the same."""
    labels = torch.zeros((4, 4, 8), dtype=torch.int64)
    labels[:, :, 0] = gpu.FLOAT_EXACT_IDS + 5
    labels[:, :, 7] = gpu.FLOAT_EXACT_IDS + 9
    allowed = torch.ones_like(labels, dtype=torch.bool)
    grown = gpu.grow(labels, allowed, gpu.FLOAT_EXACT_IDS + 10)
    assert grown.dtype == torch.int64
    assert (grown[:, :, :4] == gpu.FLOAT_EXACT_IDS + 5).all() and (grown[:, :, 4:] == gpu.FLOAT_EXACT_IDS + 9).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_identical_to_cpu():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bench_postprocess", Path(__file__).parents[2] / "bench" / "postprocess.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    make_volume = bench.make_volume

    for seed in range(12):
        prob, boundary, vs, params = _case(seed)
        expected = segment_instances(prob, boundary, voxel_size_nm=vs, params=params)
        got = gpu.to_numpy_ids(gpu.segment_instances_torch(prob, boundary, voxel_size_nm=vs, params=params,
                                                           device="cuda"))
        assert np.array_equal(got, expected), f"seed {seed}: {int((got != expected).sum())} voxels differ"
    _, prob, boundary = make_volume(160, (6.0, 14.0), seed=1)  # the benchmark's kind of volume
    params = InstanceParams(seed_distance_nm=16.0, min_size_nm3=27 * 512.0)
    expected = segment_instances(prob, boundary, voxel_size_nm=(8.0, 8.0, 8.0), params=params)
    got = gpu.segment_instances_torch(prob, boundary, voxel_size_nm=(8.0, 8.0, 8.0), params=params, device="cuda")
    assert np.array_equal(gpu.to_numpy_ids(got), expected)
    sem = SemanticParams(threshold=0.4, min_size_nm3=64 * 512.0, fill_holes=True)
    assert np.array_equal(gpu.segment_semantic_torch(prob, voxel_size_nm=(8.0,) * 3, params=sem, device="cuda").cpu().numpy(),
                          segment_semantic(prob, voxel_size_nm=(8.0,) * 3, params=sem))
