"""A straightforward implementation of the official per-crop scoring, for timing and cross-checking only.

It follows the official evaluators step by step with whole-volume operations, as they do: a full
boolean mask per object, per-object KD-trees of every voxel (2025) or distance transforms over a box
padded by the distance cap (2026), a dense IoU matrix. The 2026 min-cost flow (OR-Tools in the
official code) is written as the equivalent dense assignment problem: one column per prediction plus
one "unmatched" column per truth object (cost 10⁶ + 1), forbidden entries for pairs that do not
overlap. Not part of the package; `bench/scoring.py` times it against `cellseg.eval`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FORBIDDEN = 1e12


def _hd_kd(a: np.ndarray, b: np.ndarray, vs: Sequence[float]) -> float:
    from scipy.spatial import cKDTree

    pa, pb = np.argwhere(a) * np.asarray(vs), np.argwhere(b) * np.asarray(vs)
    if len(pa) == 0 and len(pb) == 0:
        return 0.0
    if len(pa) == 0 or len(pb) == 0:
        return float("inf")
    fwd = cKDTree(pa).query(pb, k=1)[0]
    bwd = cKDTree(pb).query(pa, k=1)[0]
    return float(max(fwd.max(), bwd.max()))


def instance_2025(pred: np.ndarray, truth: np.ndarray, vs: Sequence[float]) -> dict[str, float]:
    """The 2025 per-crop instance scores, computed the straightforward way."""
    from scipy.optimize import linear_sum_assignment
    from skimage.measure import label

    pred = label(pred, connectivity=3)
    truth_ids = np.unique(truth)
    truth_ids = truth_ids[truth_ids != 0]
    pred_ids = np.unique(pred)
    pred_ids = pred_ids[pred_ids != 0]
    if len(truth_ids) and len(pred_ids) / len(truth_ids) > 50:
        return {"accuracy": 0, "hausdorff_distance": np.inf, "normalized_hausdorff_distance": 0, "combined_score": 0}
    matched = np.zeros_like(pred)
    distances: list[float] = []
    if len(pred_ids):
        cost = np.zeros((len(truth_ids), len(pred_ids)))
        for j, pid in enumerate(pred_ids):  # as the official get_cost: only truth ids under this prediction
            p = pred == pid
            for tid in np.unique(truth[p]):
                if tid == 0:
                    continue
                t = truth == tid
                inter = np.sum(t & p)
                cost[np.searchsorted(truth_ids, tid), j] = inter / (inter + np.sum(t & ~p) + np.sum(p & ~t))
        rows, cols = linear_sum_assignment(cost, maximize=True)
        for i, j in zip(rows, cols, strict=True):
            matched[pred == pred_ids[j]] = truth_ids[i]
        distances = [_hd_kd(truth == tid, matched == tid, vs) for tid in truth_ids]
    accuracy = float(np.mean(truth == matched))
    hd = np.mean(distances) if len(distances) else 0
    norm = 1.01 ** (-hd / np.linalg.norm(vs))
    return {"accuracy": accuracy, "hausdorff_distance": hd, "normalized_hausdorff_distance": norm,
            "combined_score": (accuracy * norm) ** 0.5}


def _match_2026(truth: np.ndarray, pred: np.ndarray, n_g: int, n_p: int) -> dict[int, int]:
    from scipy.optimize import linear_sum_assignment

    cost = np.full((n_g, n_p + n_g), FORBIDDEN)
    cost[np.arange(n_g), n_p + np.arange(n_g)] = 1_000_001
    any_edge = False
    for gid in range(1, n_g + 1):
        t = truth == gid
        if not t.any():
            continue
        for pid in np.unique(pred[t]):
            if pid == 0:
                continue
            p = pred == pid
            inter = int(np.sum(t & p))
            iou = np.float32(inter / (int(t.sum()) + int(p.sum()) - inter))
            cost[gid - 1, pid - 1] = int((1.0 - float(iou)) * 1_000_000)
            any_edge = True
    if not any_edge:
        return {}
    rows, cols = linear_sum_assignment(cost)
    return {int(c) + 1: int(r) + 1 for r, c in zip(rows, cols, strict=True) if c < n_p}


def _hd_edt_roi(truth: np.ndarray, pred: np.ndarray, tid: int, vs: Sequence[float], cap: float) -> float:
    from scipy.ndimage import distance_transform_edt

    pad = np.ceil(cap / np.asarray(vs)).astype(int) + 2
    t_idx, p_idx = np.nonzero(truth == tid), np.nonzero(pred == tid)
    lo = [min(t.min(), p.min()) if p.size else t.min() for t, p in zip(t_idx, p_idx, strict=True)]
    hi = [max(t.max(), p.max()) + 1 if p.size else t.max() + 1 for t, p in zip(t_idx, p_idx, strict=True)]
    roi = tuple(slice(max(0, a - d), min(n, b + d)) for a, b, d, n in zip(lo, hi, pad, truth.shape, strict=True))
    a, b = truth[roi] == tid, pred[roi] == tid
    if not b.any():
        return cap
    fwd = distance_transform_edt(~b, sampling=vs)[a]
    bwd = distance_transform_edt(~a, sampling=vs)[b]
    return float(min(max(fwd.max(initial=0.0), bwd.max(initial=0.0)), cap))


def instance_2026(pred: np.ndarray, truth: np.ndarray, vs: Sequence[float]) -> dict[str, float | int | str]:
    """The 2026 per-crop instance counts, computed the straightforward way."""
    import cc3d
    import fastremap

    cap = float(min(v * s / 2 for v, s in zip(vs, truth.shape, strict=True)))
    pred, n_p = cc3d.connected_components(pred, return_N=True)
    n_g = int(truth.max())
    mapping: dict[int, int] = {}
    if n_g > 0 and n_p > 0:
        if n_p / n_g > 10 + 50 * np.exp(-n_g / 5):
            return {"tp": 0, "fp": 0, "fn": 0, "hausdorff_norm_sum": 0.0, "n_hausdorff": 0,
                    "status": "skipped_too_many_instances"}
        mapping = _match_2026(truth, pred, n_g, n_p)
    if mapping:
        pred = fastremap.remap(pred, {0: 0, **mapping}, preserve_missing_labels=True)
    truth_ids = np.unique(truth)
    truth_ids = truth_ids[truth_ids != 0]
    dists = np.array([_hd_edt_roi(truth, pred, int(t), vs, cap) for t in truth_ids], dtype=np.float32)
    dists = np.concatenate([dists, np.full(n_p - len(mapping), cap, dtype=np.float32)])
    norm = 1.01 ** (-dists.astype(np.float64) / np.linalg.norm(vs))
    tp = len(set(mapping.values()))
    return {"tp": tp, "fp": n_p - len(mapping), "fn": len(truth_ids) - tp, "hausdorff_norm_sum": float(np.sum(norm)),
            "n_hausdorff": int(norm.size), "status": "scored"}


def semantic(pred: np.ndarray, truth: np.ndarray) -> tuple[int, int, int]:
    """(tp, fp, fn) of `pred > 0` against `truth > 0`."""
    p, t = pred > 0, truth > 0
    tp = int(np.sum(p & t))
    return tp, int(np.sum(p)) - tp, int(np.sum(t)) - tp
