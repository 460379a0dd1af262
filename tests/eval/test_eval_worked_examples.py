"""Worked examples against the values the official score functions of both eras give: 48³ crop at 8 nm,
three balls."""

import numpy as np
import pytest

from cellseg.eval import evaluate

NORM_8 = np.linalg.norm([8.0, 8.0, 8.0])  # 13.856 nm
UNMATCHED_2026 = 1.01 ** (-192.0 / NORM_8)  # max distance 48 · 8 / 2 = 192 nm


def _cases(truth):
    shifted = np.zeros_like(truth)
    shifted[:, :, 2:] = truth[:, :, :-2]
    extra = truth.copy()
    extra[40:44, 40:44, 40:44] = 9  # touches nothing, last in raster order
    return {
        "perfect": truth,
        "empty": np.zeros_like(truth),
        "two_of_three": np.where(truth == 3, 0, truth),
        "binary": (truth > 0).astype(np.uint8),
        "extra_fp": extra,
        "shifted": shifted,
    }


@pytest.fixture
def scored(stores, three_balls):
    truth_path = stores.truth({"crop1": {"mito": three_balls}})
    out = {}
    for name, pred in _cases(three_balls).items():
        sub = stores.submission({"crop1": {"mito": pred}})
        out[name] = {era: evaluate(sub, truth_path, metric=era).label_scores["mito"] for era in ("2025", "2026")}
    return out


def test_2025_worked_examples(scored, three_balls):
    n = three_balls.size
    fg = np.count_nonzero(three_balls)
    s = {k: v["2025"] for k, v in scored.items()}
    for name in ("perfect", "binary", "extra_fp"):
        assert s[name] == {"accuracy": 1.0, "hausdorff_distance": 0.0, "normalized_hausdorff_distance": 1.0,
                           "combined_score": 1.0}, name
    assert s["empty"]["accuracy"] == 1 - fg / n
    assert s["empty"]["hausdorff_distance"] == 0
    assert s["empty"]["combined_score"] == pytest.approx(np.sqrt(1 - fg / n), rel=1e-15)
    assert s["two_of_three"]["accuracy"] == 1 - np.count_nonzero(three_balls == 3) / n
    assert s["two_of_three"]["hausdorff_distance"] == np.inf
    assert s["two_of_three"]["combined_score"] == 0
    assert s["shifted"]["hausdorff_distance"] == 16.0
    assert s["shifted"]["normalized_hausdorff_distance"] == pytest.approx(0.98858, abs=5e-6)
    acc = s["shifted"]["accuracy"]
    assert s["shifted"]["combined_score"] == pytest.approx(np.sqrt(acc * 1.01 ** (-16 / NORM_8)), rel=1e-15)


def test_2026_worked_examples(scored):
    s = {k: v["2026"] for k, v in scored.items()}
    expect = {
        "perfect": (3, 0, 0, 1.0, 1.0, 1.0),
        "binary": (3, 0, 0, 1.0, 1.0, 1.0),
        "empty": (0, 0, 3, 0.0, UNMATCHED_2026, 0.0),
        "two_of_three": (2, 0, 1, 0.8, (2 + UNMATCHED_2026) / 3, None),
        "extra_fp": (3, 1, 0, 6 / 7, (3 + UNMATCHED_2026) / 4, None),
        "shifted": (3, 0, 0, 1.0, 1.01 ** (-16 / NORM_8), None),
    }
    for name, (tp, fp, fn, f1, hd, combined) in expect.items():
        got = s[name]
        assert (got["tp"], got["fp"], got["fn"]) == (tp, fp, fn), name
        assert got["f1"] == pytest.approx(f1, rel=1e-15), name
        assert got["normalized_hausdorff_distance"] == pytest.approx(hd, rel=1e-12), name
        assert got["combined_score"] == pytest.approx(combined if combined is not None else np.sqrt(f1 * hd), rel=1e-12)
    # the official functions' values, rounded as they were recorded
    assert round(UNMATCHED_2026, 5) == 0.87121
    assert (round(s["two_of_three"]["normalized_hausdorff_distance"], 5), round(s["two_of_three"]["combined_score"], 5)) \
        == (0.95707, 0.87502)
    assert (round(s["extra_fp"]["normalized_hausdorff_distance"], 5), round(s["extra_fp"]["combined_score"], 5)) \
        == (0.96780, 0.91079)
    assert round(s["shifted"]["combined_score"], 5) == 0.99427


def test_2025_empty_truth_with_a_prediction_scores_one(stores, three_balls):
    truth_path = stores.truth({"crop1": {"mito": np.zeros_like(three_balls), "er": np.zeros_like(three_balls)}})
    pred = (three_balls == 1).astype(np.uint8)
    sub = stores.submission({"crop1": {"mito": pred, "er": pred}})
    ev = evaluate(sub, truth_path, metric="2025")
    assert ev.label_scores["mito"]["combined_score"] == 1.0  # FPs are free
    assert ev.label_scores["er"]["iou"] == 0.0
    ev26 = evaluate(sub, truth_path, metric="2026")
    assert (ev26.label_scores["mito"]["fp"], ev26.label_scores["mito"]["f1"]) == (1, 0.0)
