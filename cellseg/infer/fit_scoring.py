"""The scoring half of the weight fit (`cellseg.infer.ensemble_fit`, whose docstring gives the method): the
candidate weightings of a class (step 3) and their per-crop scores on the validation crops (steps 2 and 4),
from counts of the thresholded weighted mean.

Shapes: `M` members, `P` candidate weightings, `N` voxels of a crop where the class is known.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cellseg.classes import is_instance
from cellseg.config.inference import FitConfig
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.split import SplitEntry
from cellseg.eval.crop_score import combine, score_class, semantic_from_counts
from cellseg.eval.eras import Era
from cellseg.eval.label_grid import annotation_grid
from cellseg.eval.truth import open_crop, read_class_truth
from cellseg.infer.members import ChannelPlan, GridChoice, ensemble_grid, read_on_grid
from cellseg.pool import map_bounded, usable_cores

log = logging.getLogger(__name__)

GRID_MAX_MEMBERS = 4  # above this the simplex grid grows too fast: softmax of the members' scores instead
GRID_MAX_POINTS = 40  # candidate budget per class (each is scored on every validation crop)
GRID_MAX_STEPS = 10  # never finer than 0.1
SLAB_VOXELS = 2**21  # voxels mixed at once for all candidates: bounds the (candidates × voxels) buffer
CLASS_THREADS = min(usable_cores(), 8)  # classes of a crop scored at once (a few member volumes each)
FOREGROUND_SUFFIX = "__foreground"  # an instance class's foreground IoU is aggregated under this label


def candidate_weights(num_members: int) -> np.ndarray:
    """(P, M) candidate weightings: one-hot rows, then uniform, then the simplex grid (step 3)."""
    eye = np.eye(num_members)
    rows = [*eye, np.full(num_members, 1.0 / num_members)]
    if num_members <= GRID_MAX_MEMBERS:
        steps = max(n for n in range(1, GRID_MAX_STEPS + 1) if math.comb(n + num_members - 1, num_members - 1)
                    <= GRID_MAX_POINTS)
        rows += [np.asarray(c, dtype=np.float64) / steps for c in _compositions(steps, num_members)]
    unique: list[np.ndarray] = []
    for row in rows:
        if not any(np.allclose(row, u) for u in unique):
            unique.append(row)
    return np.stack(unique)


def _compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    if parts == 1:
        return [(total,)]
    return [(first, *rest) for first in range(total, -1, -1) for rest in _compositions(total - first, parts - 1)]


def candidate_counts(probs_MN: np.ndarray, truth_N: np.ndarray, candidates_PM: np.ndarray, *, threshold: float,
                     device: str = "cpu") -> np.ndarray:
    """(P, 3) int64 tp, fp, fn of `Σ_m w_m p_m > threshold` for each candidate w over N voxels.

    NaN probabilities (a member not covering the voxel) are left out and the mean renormalised; a voxel
    no weighted member covers is negative.
    """
    import torch

    weights = torch.as_tensor(candidates_PM, dtype=torch.float32, device=device)
    tp_pred = torch.zeros((len(candidates_PM), 2), dtype=torch.int64, device=device)
    any_missing = bool(np.isnan(probs_MN).any())
    for start in range(0, truth_N.size, SLAB_VOXELS):
        probs = torch.from_numpy(np.ascontiguousarray(probs_MN[:, start:start + SLAB_VOXELS])).to(device)
        truth = torch.from_numpy(truth_N[start:start + SLAB_VOXELS]).to(device)
        if any_missing:
            missing = torch.isnan(probs)
            cover = weights @ (~missing).to(torch.float32)
            mix = weights @ torch.nan_to_num(probs, nan=0.0)
            mix = torch.where(cover > 0, mix / cover.clamp_min(1e-30), torch.zeros_like(mix))
        else:
            mix = weights @ probs
        # (tp, predicted) of every candidate as one product with [truth, 1]: sums of 0/1 in float32 are exact
        # below 2^24, and a slab holds 2^21 voxels; twice as fast on a CPU as boolean reductions.
        ones = torch.ones_like(truth, dtype=torch.float32)
        counts = (mix > threshold).to(torch.float32) @ torch.stack([truth.to(torch.float32), ones], dim=1)
        tp_pred += counts.to(torch.int64)
    tp, predicted = tp_pred[:, 0].cpu().numpy(), tp_pred[:, 1].cpu().numpy()
    return np.stack([tp, predicted - tp, int(np.count_nonzero(truth_N)) - tp], axis=1)


def _mix(probs_MZYX: np.ndarray, weights_M: np.ndarray) -> np.ndarray:
    """NaN-aware weighted mean over members (float32)."""
    missing = np.isnan(probs_MZYX)
    num = np.tensordot(weights_M.astype(np.float32), np.where(missing, np.float32(0), probs_MZYX), axes=1)
    if not missing.any():
        return num
    cover = np.tensordot(weights_M.astype(np.float32), (~missing).astype(np.float32), axes=1)
    return np.divide(num, cover, out=np.zeros_like(num), where=cover > 0)


@dataclass
class Tally:
    """Per-crop scores of every candidate weighting of one class, and the evidence behind them."""

    label: str  # the label the era's aggregation sees (the foreground proxy is aggregated as semantic)
    key: str  # class-level score: "combined_score" (instance) or "iou"
    candidates: np.ndarray  # (P, M_c)
    crop_scores: list[dict[str, dict[str, Any]]] = field(default_factory=list)  # per candidate: crop → scores
    num_crops: int = 0  # crops scored: those where the class has foreground
    truth_voxels: int = 0
    absent_crops: int = 0  # crops annotating the class without its foreground: left out (`cellseg.eval.presence`)

    def scores(self, era: Era) -> np.ndarray:
        """Class score of each candidate over the crops seen (NaN without crops)."""
        out = []
        for per_crop in self.crop_scores:
            if not per_crop:
                out.append(float("nan"))
                continue
            labels = combine({crop: {self.label: s} for crop, s in per_crop.items()}, era, decision=True)["label_scores"]
            out.append(float(labels[self.label][self.key]) if self.label in labels else float("nan"))
        return np.asarray(out)


def _new_tally(name: str, candidates: np.ndarray, options: FitConfig) -> Tally:
    metric = is_instance(name) and options.instance_score == "metric"
    return Tally(label=name if metric else f"{name}{FOREGROUND_SUFFIX}" if is_instance(name) else name,
                 key="combined_score" if metric else "iou", candidates=candidates,
                 crop_scores=[{} for _ in candidates])


def _device(choice: str) -> str:
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return choice


class Kept:
    """Per (crop, class) scored on IoU: the members' values and the truth at the known voxels, (M, N) float32 and
    (N,) bool, with the crop's record (`num_voxels`, `voxel_size`); within `max_bytes` in all (`fit_weights` gives
    the smaller of `ensemble_fit.KEEP_MAX_BYTES` and `KEEP_AVAILABLE_FRACTION` of the memory available),
    thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes, self._items = 0, {}
        self._lock = threading.Lock()

    def put(self, key: tuple[str, str], probs_MN: np.ndarray, truth_N: np.ndarray, extra: dict[str, Any]) -> None:
        size = probs_MN.nbytes + truth_N.nbytes
        with self._lock:
            if self.nbytes + size <= self.max_bytes:
                self._items[key] = (probs_MN, truth_N, extra)
                self.nbytes += size

    def get(self, key: tuple[str, str]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]] | None:
        with self._lock:
            return self._items.get(key)


def score_candidates(stores: Sequence[PredictionStore], plan: ChannelPlan, entries: Sequence[SplitEntry],
                     candidates: Mapping[str, np.ndarray], *, grid: GridChoice, options: FitConfig,
                     progress: bool = False, kept: Kept | None = None) -> dict[str, Tally]:
    """Score every candidate weighting of every class on the validation crops (steps 2 and 4); `kept`: values
    kept by an earlier pass over the same crops (used instead of reading them again) and kept for a later one."""
    from tqdm import tqdm

    device = _device(options.device)
    tallies = {c: _new_tally(c, cands, options) for c, cands in candidates.items()}
    if not tallies:
        return tallies
    for entry in tqdm(entries, desc="fitting weights", unit="crop", disable=not progress, leave=False):
        try:
            source = open_crop(entry, tuple(candidates))
        except ValueError as err:
            log.info("%s: not used for fitting: %s", entry.crop_name, err)
            continue
        common, _ = ensemble_grid(stores, entry.crop_name, grid)

        def score(name: str, source: Any = source, common: Grid | None = common, crop: str = entry.crop_name) -> None:
            known_values = None if kept is None else kept.get((crop, name))
            if known_values is not None:
                _tally_counts(tallies[name], crop, *known_values, options=options, device=device)
                return
            target_grid = common if options.score_grid == "ensemble" else annotation_grid(source, name)
            read = None if target_grid is None else read_class_truth(source, name, target_grid)
            if target_grid is not None and read is not None:
                _score_class(stores, plan, crop, name, target_grid, *read, tallies[name], options=options,
                             device=device, kept=kept)

        # the classes of a crop in threads (reading and resampling the members release the GIL); each class's
        # tally is written by one thread only, crop after crop, so the tallies do not depend on the threads
        map_bounded(score, list(source.classes), max(1, min(len(source.classes), CLASS_THREADS)))
    return tallies


def _score_class(stores: Sequence[PredictionStore], plan: ChannelPlan, crop: str, name: str, grid: Grid,
                 truth: np.ndarray, known: np.ndarray, tally: Tally, *, options: FitConfig, device: str,
                 kept: Kept | None = None) -> None:
    """Score every candidate of `tally` on one crop: `truth` as `read_class_truth` gives it, 0 outside `known`.
    A crop without the class's foreground is only counted (`Tally.absent_crops`): on it, predicting less always
    scores higher, so it would reward suppression (`cellseg.eval.presence`)."""
    if not np.any(truth):  # 0 outside `known` already: no masked copy
        tally.absent_crops += 1
        return
    probs_MZYX = np.stack([read_on_grid(stores[i], crop, name, grid) for i in plan.members_of[name]])
    extra = {"num_voxels": int(np.count_nonzero(known)), "voxel_size": list(grid.voxel_size_nm)}
    if tally.key == "combined_score":  # the official instance scorer on 26-connected components
        for p, w in enumerate(tally.candidates):
            pred = (_mix(probs_MZYX, w) > options.threshold) & known
            scores = score_class(pred, truth, label=name, era=options.metric, voxel_size_nm=grid.voxel_size_nm)
            tally.crop_scores[p][crop] = {**scores, **extra}
        tally.num_crops += 1
        tally.truth_voxels += int(np.count_nonzero(truth))
        return
    # foreground IoU from counts (instance truth: its objects' union)
    probs_MN, truth_N = probs_MZYX[:, known], truth[known] > 0
    if kept is not None:
        kept.put((crop, name), probs_MN, truth_N, extra)
    _tally_counts(tally, crop, probs_MN, truth_N, extra, options=options, device=device)


def _tally_counts(tally: Tally, crop: str, probs_MN: np.ndarray, truth_N: np.ndarray, extra: dict[str, Any], *,
                  options: FitConfig, device: str) -> None:
    """Every candidate's IoU scores on one crop from the members' values at its known voxels."""
    counts = candidate_counts(probs_MN, truth_N, tally.candidates, threshold=options.threshold, device=device)
    for p, (tp, fp, fn) in enumerate(counts.tolist()):
        tally.crop_scores[p][crop] = {**semantic_from_counts(tp, fp, fn, options.metric), **extra}
    tally.num_crops += 1
    tally.truth_voxels += int(np.count_nonzero(truth_N))
