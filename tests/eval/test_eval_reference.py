"""Per-crop scores equal a straightforward implementation of the official algorithms (bench/reference_scoring.py)."""


import numpy as np
import pytest
from crop_scores import score_instance_2025, score_instance_2026
from scipy.ndimage import distance_transform_edt
from scipy.spatial import cKDTree

from bench import reference_scoring as ref
from cellseg.eval.distance import Boxes, pair_hausdorff
from cellseg.eval.semantic import confusion

VOXEL_SIZES = [(8.0, 8.0, 8.0), (1.74, 2.0, 2.0), (13.92, 16.0, 16.0), (3.0, 5.0, 7.0)]


def _blobs(rng, shape, n, ids):
    out = np.zeros(shape, dtype=np.uint32)
    for label in ids[:n]:
        c = [rng.integers(0, s) for s in shape]
        r = rng.integers(1, 5, size=3)
        out[tuple(slice(max(0, ci - ri), ci + ri) for ci, ri in zip(c, r, strict=True))] = label
    return out


def _case(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(s) for s in rng.integers(12, 28, 3))
    ids = rng.permutation(np.arange(1, 40))[:8] if seed % 3 == 0 else np.arange(1, 9)  # non-contiguous ids too
    truth = _blobs(rng, shape, int(rng.integers(0, 7)), list(ids))
    kind = seed % 5
    if kind == 0:
        pred = np.roll(truth, int(rng.integers(-2, 3)), axis=int(rng.integers(0, 3)))
    elif kind == 1:
        pred = _blobs(rng, shape, int(rng.integers(0, 9)), list(range(1, 10)))
    elif kind == 2:
        pred = np.where(rng.random(shape) < 0.9, truth, 0).astype(np.uint32)  # holes split objects
    elif kind == 3:
        pred = (truth > 0).astype(np.uint8)  # binary: touching objects merge
    else:
        pred = truth + _blobs(rng, shape, 3, [50, 51, 52]) * (truth == 0)
    return truth, pred, VOXEL_SIZES[seed % len(VOXEL_SIZES)]


@pytest.mark.parametrize("seed", range(60))
def test_instance_2025_equals_reference(seed):
    truth, pred, vs = _case(seed)
    got = score_instance_2025(pred.copy(), truth, list(vs))
    want = ref.instance_2025(pred.copy(), truth, vs)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-13, abs=0), (key, got, want)


@pytest.mark.parametrize("seed", range(60))
def test_instance_2026_equals_reference(seed):
    truth, pred, vs = _case(seed)
    got = score_instance_2026(pred.copy(), truth, list(vs))
    want = ref.instance_2026(pred.copy(), truth, vs)
    assert {k: got[k] for k in ("tp", "fp", "fn", "n_hausdorff", "status")} == \
        {k: want[k] for k in ("tp", "fp", "fn", "n_hausdorff", "status")}
    assert got["hausdorff_norm_sum"] == pytest.approx(want["hausdorff_norm_sum"], rel=1e-13)


@pytest.mark.parametrize("seed", range(40))
def test_pair_hausdorff_equals_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    shape = tuple(int(s) for s in rng.integers(6, 22, 3))
    truth = _blobs(rng, shape, 2, [3, 3])
    pred = _blobs(rng, shape, 2, [7, 7])
    if not truth.any() or not pred.any():
        return
    vs = np.array(VOXEL_SIZES[seed % len(VOXEL_SIZES)])
    a, b = truth == 3, pred == 7
    boxes = Boxes.of(truth).slices[3], Boxes.of(pred).slices[7]
    kd = max(cKDTree(np.argwhere(a) * vs).query(np.argwhere(b) * vs)[0].max(),
             cKDTree(np.argwhere(b) * vs).query(np.argwhere(a) * vs)[0].max())
    edt = max(distance_transform_edt(~b, sampling=vs)[a].max(), distance_transform_edt(~a, sampling=vs)[b].max())
    assert pair_hausdorff(truth, pred, *boxes, 3, (7,), vs, formula="kd") == kd
    assert pair_hausdorff(truth, pred, *boxes, 3, (7,), vs, formula="edt") == edt
    cap = float(edt) / 2
    assert pair_hausdorff(truth, pred, *boxes, 3, (7,), vs, formula="edt", cap_nm=cap) == cap


@pytest.mark.parametrize("seed", range(36))
def test_both_hausdorff_paths_equal_brute_force_on_irregular_objects(seed):
    # Smoothed noise (objects with holes, several pieces, near-ties) or a shifted box (ties over whole faces,
    # the many-candidates fallback); voxel sizes whose distances pass 1000 nm too (no integer shortcut); each
    # path forced, both formulas.
    from scipy.ndimage import gaussian_filter

    from cellseg.eval.distance import _hausdorff_edt, _hausdorff_kd

    rng = np.random.default_rng(300 + seed)
    shape = tuple(int(s) for s in rng.integers(10, 30, 3))
    if seed % 3 == 2:
        a = np.zeros(shape, dtype=bool)
        a[2:-4, 3:-3, 1:-5] = True
    else:
        field = gaussian_filter(rng.random(shape), 1.5)
        a = field > np.quantile(field, 0.7)
    b = np.roll(a if seed % 3 == 2 else gaussian_filter(rng.random(shape), 1.5) > 0.5, int(rng.integers(1, 4)),
                axis=int(rng.integers(0, 3)))
    vs = np.array([*VOXEL_SIZES, (40.0, 48.0, 48.0), (55.7, 64.0, 64.0)][seed % (len(VOXEL_SIZES) + 2)])
    box = tuple(slice(0, n) for n in shape)
    origin = np.zeros(3, dtype=np.int64)
    want = {"kd": max(cKDTree(np.argwhere(a) * vs).query(np.argwhere(b) * vs)[0].max(),
                      cKDTree(np.argwhere(b) * vs).query(np.argwhere(a) * vs)[0].max()),
            "edt": max(distance_transform_edt(~b, sampling=vs)[a].max(), distance_transform_edt(~a, sampling=vs)[b].max())}
    for formula, value in want.items():
        assert _hausdorff_edt(a, b, origin, vs, formula) == value
        assert _hausdorff_kd(a, box, b, box, b & a, a & b, vs, formula) == value


def test_semantic_counts_equal_reference():
    rng = np.random.default_rng(0)
    pred = rng.random((30, 31, 32)).astype(np.float32) - 0.5
    truth = (rng.random((30, 31, 32)) < 0.3).astype(np.uint8)
    assert confusion(pred, truth) == ref.semantic(pred, truth)
