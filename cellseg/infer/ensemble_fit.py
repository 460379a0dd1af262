"""Per-class ensemble weights fitted on validation crops against the challenge metric (`--weights auto`).

Method, for each class c that M_c ≥ 2 members predict (a class of one member gets weight 1):

1. **Tuning crops**: the given crop ids, or else the *tuning* validation crops of every member's run
   (provenance `run_dir`: "validate" in its `datasplit.csv`, role "tuning" in `validation_roles.csv`),
   intersected so that no member trained on a fitting crop and no run keeps it for reports; without run
   directories, the data root's own `datasplit.csv`. Only crops that every member predicted are used. Every
   class fitted must be annotated in one of them (else an error before any scoring). Labels come from the
   catalogue of the data root given (`--truth`), else from the paths the datasplit rows record, else from
   the data root the members' provenance names (`cellseg.infer.fit_crops`).
2. **Truth on each class's annotation grid** (the `s0` grid of its label, `cellseg.eval.label_grid`, as
   the leaderboard scores): `cellseg.eval.truth.read_class_truth`, scored only where the class is
   annotated, exactly as validation during training scores (`cellseg.train.validate.score_crop`); each
   member's channel is resampled onto it (`read_on_grid`: linear when up-sampling, area averaging when
   down-sampling). `score_grid="ensemble"` scores on the grid the ensemble is written on instead
   (`ensemble_grid`; cheaper when labels are much finer than the members).
3. **Candidate weightings**: each member alone (one-hot), uniform, and, when M_c ≤ 4, every point of the
   simplex grid with step 1/n, n the largest ≤ 10 that keeps ≤ 40 points (11 points for 2 members, 36
   for 3, 35 for 4).
4. **Score of a candidate w**: threshold Σ w·p at 0.5, score each crop with the era's per-crop semantic
   scorer (from confusion counts, `cellseg.eval.crop_score.semantic_from_counts`), and combine the crops
   as that era's leaderboard does (`cellseg.eval.crop_score.combine`: 2025 volume-weighted mean IoU, 2026
   pooled IoU) in decision mode: a crop the era skips for too many objects counts as its worst case. Instance classes are fitted on the IoU of their foreground
   by default (`instance_score="iou"`, a proxy): the probabilities only decide the foreground, the
   objects come from the watershed tuned afterwards, and the instance metric of plain connected
   components mostly measures how touching objects merge (the post-processing's job), which is very
   noisy on a few crops. `instance_score="metric"` scores the 26-connected components of the
   thresholded mean with the era's official instance scorer instead (slower: matching and Hausdorff
   distances per candidate).
5. **w_fit**: M_c ≤ 4: the best candidate; when several tie (within 1e-9: thresholded scores are often
   flat, e.g. a bad member cannot flip a 0.5 decision until its weight passes some value), their mean,
   the middle of the best plateau rather than its edge, and uniform when nothing discriminates. M_c > 4:
   softmax of the members' own scores with temperature 0.05 (a lead of 0.05 in score weighs e ≈ 2.7×).
6. **Shrinkage towards uniform** against over-fitting small validation sets: w = (1 − λ)·w_fit + λ/M_c
   with λ = 1 − (1 − λ0)·e, λ0 = `shrink` (default 0.5) and the evidence
   e = min(1, n_c / 8) · min(1, v_c / 10⁴), n_c the validation crops annotating c, v_c their positive
   truth voxels. Crops are the independent samples (the voxels of a crop are strongly correlated): with
   8 crops the standard error of a mean per-crop score is about a third of the crop-to-crop spread,
   small next to typical differences between members; with fewer crops, or under ~10⁴ positive voxels
   (a handful of small organelles, where IoU swings on a few boundary voxels), the fit is trusted
   proportionally less. No validation data: uniform (λ = 1). Any λ > 0 keeps every member above 0.
7. Boundary channels take their class's weights (the chosen ones of step 8).
8. **Guard**: shrinkage (or a flat plateau's mean) must never leave the ensemble worse than one of its
   members on the tuning crops. The candidates uniform, shrunk w, unshrunk w_fit and each member alone are
   scored on the same crops by the same path (w and w_fit in a second pass, on the members' values kept from the
   first within a memory cap (`Kept`), read again beyond it; unless both are first-pass candidates, as uniform is
   when nothing discriminates: then they keep the first-pass scores); the best is `chosen` and its
   weights are written. Ties (within 1e-9) go to the simplest, in the order uniform, shrunk, unshrunk, then
   the members alone (a single member only when it is strictly better than every mix keeping them all).
9. **Report** (stored with the ensemble): per class the score of each member alone, of uniform, of w_fit
   ("fitted"), of the shrunk w ("shrunk") and of the chosen weights ("final"), `chosen`, n_c, v_c and λ.

Scores are computed from counts of `Σ w·p > 0.5` in float32 (torch, on the GPU when there is one); at
voxels whose mean lies within float rounding of the threshold the written ensemble can differ.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from cellseg.classes import get_class, is_instance
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import BOUNDARY_SUFFIX, PredictionStore
from cellseg.data.split import SplitEntry, derivable
from cellseg.eval.crop_score import combine, score_class, semantic_from_counts
from cellseg.eval.eras import Era, get_era
from cellseg.eval.label_grid import annotation_grid
from cellseg.eval.truth import open_crop, read_class_truth
from cellseg.infer.members import ChannelPlan, GridChoice, ensemble_grid, read_on_grid
from cellseg.infer.weights import Weights, normalised
from cellseg.pool import available_memory_bytes, map_bounded, usable_cores

log = logging.getLogger(__name__)

InstanceScore = Literal["iou", "metric"]
INSTANCE_SCORES: tuple[str, ...] = ("iou", "metric")
SCORE_GRIDS: tuple[str, ...] = ("annotation", "ensemble")
GRID_MAX_MEMBERS = 4  # above this the simplex grid grows too fast: softmax of the members' scores instead
GRID_MAX_POINTS = 40  # candidate budget per class (each is scored on every validation crop)
GRID_MAX_STEPS = 10  # never finer than 0.1
SOFTMAX_TEMPERATURE = 0.05
TIE_TOLERANCE = 1e-9
WEIGHT_TOLERANCE = 1e-9  # weights this close to a first-pass candidate are that candidate (and take its weights)
CROPS_FOR_FULL_TRUST = 8
VOXELS_FOR_FULL_TRUST = 10_000
SLAB_VOXELS = 2**21  # voxels mixed at once for all candidates: bounds the (candidates × voxels) buffer
CLASS_THREADS = min(usable_cores(), 8)  # classes of a crop scored at once (a few member volumes each)
FOREGROUND_SUFFIX = "__foreground"  # an instance class's foreground IoU is aggregated under this label
# The members' values and the truth of each (crop, class) scored on IoU are kept from the first pass for the second
# (the fitted and shrunk weights of step 8) up to this many bytes, and an eighth of the memory available when the fit
# starts (work beside it has the rest); what does not fit is read and resampled again.
KEEP_MAX_BYTES = 4 * 2**30
KEEP_AVAILABLE_FRACTION = 1 / 8


@dataclass(frozen=True, kw_only=True)
class FitOptions:
    """How `--weights auto` fits (method in the module docstring).

    Attributes:
        metric: scoring era, e.g. "2026" (current) or "2025" (challenge era).
        shrink: λ0, the shrinkage towards uniform with ample validation data (more with less).
        instance_score: "iou" (foreground IoU proxy) or "metric" (official instance scorer).
        threshold: probability threshold of the candidate ensembles.
        device: "auto", "cpu" or "cuda" for mixing and counting.
        score_grid: "annotation" (each class's label grid, as the leaderboard) or "ensemble" (the grid the
            ensemble is written on).
    """

    metric: Era = "2026"
    shrink: float = 0.5
    instance_score: InstanceScore = "iou"
    threshold: float = 0.5
    device: str = "auto"
    score_grid: str = "annotation"

    def __post_init__(self) -> None:
        get_era(self.metric)  # a ValueError naming the registered eras
        if not 0.0 <= self.shrink <= 1.0:
            raise ValueError(f"--shrink {self.shrink} must be in [0, 1]")
        if self.instance_score not in INSTANCE_SCORES:
            raise ValueError(f"instance score {self.instance_score!r} is not one of {INSTANCE_SCORES}")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold {self.threshold} must be in (0, 1)")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device {self.device!r} is not one of ('auto', 'cpu', 'cuda')")
        if self.score_grid not in SCORE_GRIDS:
            raise ValueError(f"score grid {self.score_grid!r} is not one of {SCORE_GRIDS}")


# ----------------------------------------------------------------------------------------------- scoring


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
    num_crops: int = 0
    truth_voxels: int = 0

    def scores(self, era: Era) -> np.ndarray:
        """Class score of each candidate over the crops seen (NaN without crops)."""
        out = []
        for per_crop in self.crop_scores:
            if not per_crop:
                out.append(float("nan"))
                continue
            labels = combine({crop: {self.label: s} for crop, s in per_crop.items()}, era, decision=True)["label_scores"]
            out.append(float(labels[self.label][self.key]))
        return np.asarray(out)


def _new_tally(name: str, candidates: np.ndarray, options: FitOptions) -> Tally:
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
    (N,) bool, with the crop's record (`num_voxels`, `voxel_size`); within `max_bytes` in all (default: the smaller
    of `KEEP_MAX_BYTES` and `KEEP_AVAILABLE_FRACTION` of the memory available), thread-safe."""

    def __init__(self, max_bytes: int | None = None) -> None:
        if max_bytes is None:
            max_bytes = min(KEEP_MAX_BYTES, int(KEEP_AVAILABLE_FRACTION * available_memory_bytes()))
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
                     candidates: Mapping[str, np.ndarray], *, grid: GridChoice, options: FitOptions,
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
                 truth: np.ndarray, known: np.ndarray, tally: Tally, *, options: FitOptions, device: str,
                 kept: Kept | None = None) -> None:
    """Score every candidate of `tally` on one crop: `truth` as `read_class_truth` gives it, 0 outside `known`."""
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
                  options: FitOptions, device: str) -> None:
    """Every candidate's IoU scores on one crop from the members' values at its known voxels."""
    counts = candidate_counts(probs_MN, truth_N, tally.candidates, threshold=options.threshold, device=device)
    for p, (tp, fp, fn) in enumerate(counts.tolist()):
        tally.crop_scores[p][crop] = {**semantic_from_counts(tp, fp, fn, options.metric), **extra}
    tally.num_crops += 1
    tally.truth_voxels += int(np.count_nonzero(truth_N))


# -------------------------------------------------------------------------------------------------- fitting


def shrinkage(shrink: float, num_crops: int, truth_voxels: int) -> float:
    """λ of step 6: `shrink` with ample evidence, rising to 1 (uniform) as crops or truth voxels run out."""
    evidence = min(1.0, num_crops / CROPS_FOR_FULL_TRUST) * min(1.0, truth_voxels / VOXELS_FOR_FULL_TRUST)
    return 1.0 - (1.0 - shrink) * evidence


def best_candidate(candidates: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """The best-scoring candidate; the mean of the best ones when several tie (step 5)."""
    tied = np.flatnonzero(scores >= np.nanmax(scores) - TIE_TOLERANCE)
    return candidates[tied].mean(axis=0)


def softmax_weights(scores: np.ndarray, temperature: float = SOFTMAX_TEMPERATURE) -> np.ndarray:
    """softmax(score / T); NaN scores count as the worst score."""
    scores = np.nan_to_num(scores, nan=np.nanmin(scores) if np.isfinite(scores).any() else 0.0)
    z = np.exp((scores - scores.max()) / temperature)
    return z / z.sum()


def _fit_class(tally: Tally, options: FitOptions) -> dict[str, Any]:
    num = tally.candidates.shape[1]
    scores = tally.scores(options.metric)
    uniform = np.full(num, 1.0 / num)
    if tally.num_crops == 0 or not np.isfinite(scores).any():
        return {"method": "uniform (no validation crop annotates it)", "lambda": 1.0, "fitted_weights": uniform,
                "weights": uniform, "scores": {}}
    if num > GRID_MAX_MEMBERS:
        method, fitted = "softmax", softmax_weights(scores[:num])
    else:
        method, fitted = "grid", best_candidate(tally.candidates, scores)
    lam = shrinkage(options.shrink, tally.num_crops, tally.truth_voxels)
    return {"method": method, "lambda": lam, "fitted_weights": fitted, "weights": (1 - lam) * fitted + lam * uniform,
            "scores": {"members": scores[:num].tolist(), "uniform": float(scores[num])}}


def _candidate_row(candidates: np.ndarray, weights: np.ndarray) -> int | None:
    """The index of the first-pass candidate equal to `weights` (to float rounding, 1e-9), else None. Its
    first-pass score is the score of `weights`: the same mean thresholded on the same crops."""
    rows = np.flatnonzero(np.all(np.abs(candidates - weights) <= WEIGHT_TOLERANCE, axis=1))
    return int(rows[0]) if rows.size else None


def guard(fit: Mapping[str, Any], fitted_score: float, shrunk_score: float, members: Sequence[int]) -> dict[str, Any]:
    """Step 8: the best of uniform, shrunk, unshrunk and each member alone (ties to the simplest).

    Args:
        fit: a class's fit (`_fit_class`): its weights, fitted weights and first-pass scores.
        fitted_score, shrunk_score: second-pass scores of the unshrunk and shrunk weights.
        members: the class's member indices (for naming a member chosen alone, e.g. "member 2").

    Returns:
        "chosen", the chosen "weights", and "scores" with "shrunk" and "final" (the chosen one's score).
    """
    num = len(members)
    # name → (weights, score), simplest first: a tie goes to the earliest
    cands = {"uniform": (np.full(num, 1.0 / num), fit["scores"]["uniform"]),
             "shrunk": (fit["weights"], shrunk_score), "unshrunk": (fit["fitted_weights"], fitted_score),
             **{f"member {m}": (np.eye(num)[k], fit["scores"]["members"][k]) for k, m in enumerate(members)}}
    scores = {name: float(s) if np.isfinite(s) else -math.inf for name, (_, s) in cands.items()}
    best = max(scores.values())
    chosen = next(name for name in cands if scores[name] >= best - TIE_TOLERANCE)
    return {"chosen": chosen, "weights": cands[chosen][0],
            "scores": {**fit["scores"], "fitted": float(fitted_score), "shrunk": float(shrunk_score),
                       "final": float(cands[chosen][1])}}


def fit_weights(stores: Sequence[PredictionStore], plan: ChannelPlan, entries: Sequence[SplitEntry], *,
                grid: GridChoice = "finest", options: FitOptions | None = None, progress: bool = False) -> Weights:
    """Fit per-class weights on the validation crops `entries` (method in the module docstring).

    Returns:
        Weights for every output channel, with a report of the fit per class.
    """
    options = options or FitOptions()
    fittable, notes = [], {}
    for c in plan.classes:
        if len(plan.members_of[c]) < 2:
            notes[c] = "single member"
        elif not _is_cellmap(c):
            notes[c] = "uniform (not a CellMap class: no labels)"
        else:
            fittable.append(c)
    check_annotated(fittable, entries)
    kept = Kept()  # the first pass's values, for the second
    tallies = score_candidates(stores, plan, entries, {c: candidate_weights(len(plan.members_of[c]))
                                                        for c in fittable}, grid=grid, options=options,
                               progress=progress, kept=kept)
    fits = {c: _fit_class(tallies[c], options) for c in fittable}
    second, known = {}, {}
    for c, f in fits.items():
        if f["scores"]:
            rows = [_candidate_row(tallies[c].candidates, w) for w in (f["fitted_weights"], f["weights"])]
            if None in rows:
                second[c] = np.stack([f["fitted_weights"], f["weights"]])
            else:  # both were scored in the first pass (e.g. uniform, when no member scores): no second read
                f["fitted_weights"], f["weights"] = (tallies[c].candidates[r] for r in rows)
                first = tallies[c].scores(options.metric)
                known[c] = (float(first[rows[0]]), float(first[rows[1]]))
    final = score_candidates(stores, plan, entries, second, grid=grid, options=options, progress=progress, kept=kept)
    log.info("weight fit: %.1f MB of member values kept between the passes", kept.nbytes / 2**20)
    report_classes: dict[str, Any] = {c: {"method": note, "members": list(plan.members_of[c])}
                                      for c, note in notes.items()}
    for c, f in fits.items():
        if c in final or c in known:
            f.update(guard(f, *(final[c].scores(options.metric) if c in final else known[c]), plan.members_of[c]))
        report_classes[c] = {"method": f["method"], "members": list(plan.members_of[c]),
                             "chosen": f.get("chosen", "uniform"), "weights": [float(v) for v in f["weights"]],
                             "fitted_weights": [float(v) for v in f["fitted_weights"]], "lambda": f["lambda"],
                             "num_crops": tallies[c].num_crops, "truth_voxels": tallies[c].truth_voxels,
                             "scores": f["scores"], "score": "foreground IoU" if tallies[c].label.endswith(
                                 FOREGROUND_SUFFIX) else tallies[c].key}
        log.info("%s: weights %s (%s; fit %s, λ=%.2f over %d crops); scores: %s", c,
                 [round(float(v), 3) for v in f["weights"]], report_classes[c]["chosen"],
                 [round(float(v), 3) for v in f["fitted_weights"]], f["lambda"], tallies[c].num_crops, f["scores"])
    per_channel = _channel_weights(plan, len(stores), {c: f["weights"] for c, f in fits.items()})
    report = {"metric": options.metric, "threshold": options.threshold, "shrink": options.shrink,
              "instance_score": options.instance_score, "grid": grid, "score_grid": options.score_grid,
              "combined": "decision mode",
              "validation_crops": [e.crop_name for e in entries], "crop_roles": _roles(entries),
              "classes": report_classes}
    return Weights(per_channel, "auto", report)


def check_annotated(classes: Sequence[str], entries: Sequence[SplitEntry]) -> None:
    """Every class to fit must be annotated (listed, or derivable from its atoms) in a tuning crop.

    Raises:
        ValueError: naming the classes no crop annotates and the crops.
    """
    lacking = [c for c in classes if not any(derivable(c, e.classes) for e in entries)]
    if lacking:
        raise ValueError(f"no tuning crop annotates {lacking} (tuning crops: {[e.crop_name for e in entries]}): "
                         "their weights cannot be fitted; pass --crops with crops that annotate them, or weights")


def _is_cellmap(name: str) -> bool:
    try:
        get_class(name)
    except ValueError:
        return False
    return True


def _roles(entries: Sequence[SplitEntry]) -> dict[str, str]:
    """crop → its role in its run's split ("tuning"; "none recorded" for a crop of a split without roles or
    one named explicitly from the catalogue)."""
    return {e.crop_name: e.role or "none recorded" for e in entries}


def _channel_weights(plan: ChannelPlan, num_members: int, fitted: Mapping[str, np.ndarray]
                     ) -> dict[str, tuple[float, ...]]:
    """Class weights (over the class's members) → every channel's weights over all members (step 7)."""
    out = {}
    for channel in plan.channels:
        cls = channel.removesuffix(BOUNDARY_SUFFIX)
        full = np.zeros(num_members)
        if cls in fitted:
            full[list(plan.members_of[cls])] = fitted[cls]
        else:
            full[list(plan.members_of[cls])] = 1.0
        out[channel] = normalised(full.tolist(), plan.members_of[channel], num_members, what=f"channel {channel}")
    return out
