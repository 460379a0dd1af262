"""Building blocks: relabelling numbered like cc3d, compact reads, the contingency table, big ids."""

import cc3d
import numpy as np
import pytest
import zarr
from crop_scores import score_instance_2026
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from cellseg.eval import evaluate, instance_2026, overlaps
from cellseg.eval.io import read_compact
from cellseg.eval.relabel import relabel_26


@settings(max_examples=150, deadline=None)
@given(arrays(np.int32, st.tuples(st.integers(1, 9), st.integers(1, 9), st.integers(1, 9)),
              elements=st.sampled_from([0, 0, 0, 1, 2, 3, -4, 70_000])))
def test_relabel_numbers_components_like_cc3d(volume):
    got, n = relabel_26(volume)
    want, m = cc3d.connected_components(volume, connectivity=26, return_N=True)
    assert n == m
    np.testing.assert_array_equal(got, want)


def test_relabel_uses_two_bytes_for_few_objects():
    volume = np.zeros((80, 80, 80), np.uint64)
    volume[10:20, 10:20, 10:20] = 2**40
    volume[50:60, 50:60, 50:60] = 7
    out, n = relabel_26(volume)
    assert (n, out.dtype) == (2, np.uint16) and out[15, 15, 15] == 1


def test_read_compact_keeps_values(tmp_path):
    data = np.zeros((70, 9, 9), np.uint64)
    data[5] = 3
    data[65] = 2**33  # beyond uint32, met in the last slab: the buffer is widened
    array = zarr.open_array(str(tmp_path / "a"), mode="w", shape=data.shape, chunks=(4, 9, 9), dtype=data.dtype)
    array[...] = data
    out = read_compact(array)
    assert out.dtype == np.uint64 and np.array_equal(out, data)
    array[65] = 0
    assert read_compact(array).dtype == np.uint8
    negative = zarr.open_array(str(tmp_path / "n"), mode="w", shape=(4, 4, 4), chunks=(2, 4, 4), dtype=np.int32)
    negative[0] = -5
    assert read_compact(negative).dtype == np.int32


def test_sparse_contingency_equals_dense(monkeypatch):
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 30, (20, 20, 20)).astype(np.uint32) * 3  # non-contiguous ids
    pred = rng.integers(0, 40, (20, 20, 20)).astype(np.uint32)
    dense = overlaps.overlaps(truth, pred, 39)
    monkeypatch.setattr(overlaps, "MAX_BINS", 10)
    monkeypatch.setattr(overlaps, "SLAB_VOXELS", 777)
    sparse = overlaps.overlaps(truth, pred, 39)
    for field in ("truth_ids", "truth_sizes", "pred_sizes", "rows", "cols", "inter", "pred_on_background"):
        np.testing.assert_array_equal(getattr(dense, field), getattr(sparse, field))
    assert dense.background_both == sparse.background_both == int(((truth == 0) & (pred == 0)).sum())


def test_truth_ids_beyond_the_voxel_count_are_scored(stores, make_big_id=70_000):
    truth = np.zeros((20, 20, 20), np.uint32)
    truth[5:10, 5:10, 5:10] = make_big_id  # crashes cc3d.statistics in the 2026 evaluator (docs/scoring.md)
    t = stores.truth({"crop1": {"nuc": truth}})
    ev = evaluate(stores.submission({"crop1": {"nuc": (truth > 0).astype(np.uint8)}}), t, metric="2026")
    assert ev.label_scores["nuc"]["combined_score"] == 1.0
    assert any("voxel count" in f for f in ev.official_failures)
    # nG is the largest id: 1 predicted object for nG = 70000 passes the cutoff trivially
    assert ev.crop_scores["crop1"]["nuc"]["status"] == "scored"


def test_too_many_overlapping_pairs_skip_the_crop(monkeypatch, three_balls):
    monkeypatch.setattr(instance_2026, "MAX_OVERLAP_EDGES_2026", 2)
    scores = score_instance_2026(three_balls, three_balls, [8.0, 8.0, 8.0])
    assert scores["status"] == "skipped_too_many_instances" and scores["n_hausdorff"] == 0


def test_unreadable_truth_is_an_error_not_a_missing_label(stores, three_balls):
    t = stores.truth({"crop1": {"mito": three_balls}})
    for chunk in (t / "crop1" / "mito").rglob("*"):
        if chunk.is_file() and not chunk.name.startswith("."):
            chunk.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="ground truth"):
        evaluate(stores.submission({"crop1": {"mito": three_balls}}), t, metric="2025")
