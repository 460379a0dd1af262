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
   annotated, exactly as validation during training scores (`cellseg.train.validate.class_tasks`); each
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
8. **Guard**: shrinkage (or a flat plateau's mean) must not leave the ensemble clearly worse than one of its
   members on the tuning crops. The candidates uniform, shrunk w, unshrunk w_fit and each member alone are
   scored on the same crops by the same path (w and w_fit in a second pass, on the members' values kept from the
   first within a memory cap (`Kept`), read again beyond it; unless both are first-pass candidates, as uniform is
   when nothing discriminates: then they keep the first-pass scores). The shrunk w stands unless a candidate
   beats it by more than the crop-bootstrap noise: the paired 95 % interval of its gain over w lies above 0
   (`cellseg.eval.noise.paired_gain`). Choosing the in-sample best on the very crops the fit was made on would
   undo the shrinkage whenever it costs anything there (the unshrunk fit nearly always scores highest in
   sample). Uniform, the simplest, replaces w on a tie (within 1e-9). Of the candidates that clear the noise
   the best is `chosen` (ties to the simplest, in the order uniform, unshrunk, then the members alone).
9. **Report** (stored with the ensemble): per class the score of each member alone, of uniform, of w_fit
   ("fitted"), of the shrunk w ("shrunk") and of the chosen weights ("final"), `chosen`, n_c, v_c and λ.

Scores are computed from counts of `Σ w·p > 0.5` in float32 (torch, on the GPU when there is one); at
voxels whose mean lies within float rounding of the threshold the written ensemble can differ. Steps 2-4 (the
candidates and their scores) are in `cellseg.infer.fit_scoring`; the settings are `cellseg.config.inference.FitConfig`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cellseg.classes import get_class
from cellseg.config.inference import FitConfig
from cellseg.data.prediction_store import BOUNDARY_SUFFIX, PredictionStore
from cellseg.data.split import SplitEntry, derivable
from cellseg.eval.eras import get_era
from cellseg.eval.noise import paired_gain
from cellseg.infer.fit_scoring import (
    FOREGROUND_SUFFIX,
    GRID_MAX_MEMBERS,
    Kept,
    Tally,
    candidate_weights,
    score_candidates,
)
from cellseg.infer.members import ChannelPlan, GridChoice
from cellseg.infer.weights import Weights, channel_weights
from cellseg.pool import available_memory_bytes

log = logging.getLogger(__name__)

SOFTMAX_TEMPERATURE = 0.05
TIE_TOLERANCE = 1e-9
WEIGHT_TOLERANCE = 1e-9  # weights this close to a first-pass candidate are that candidate (and take its weights)
CROPS_FOR_FULL_TRUST = 8
VOXELS_FOR_FULL_TRUST = 10_000
# The members' values and the truth of each (crop, class) scored on IoU are kept from the first pass for the second
# (the fitted and shrunk weights of step 8) up to this many bytes, and an eighth of the memory available when the fit
# starts (work beside it has the rest); what does not fit is read and resampled again.
KEEP_MAX_BYTES = 4 * 2**30
KEEP_AVAILABLE_FRACTION = 1 / 8


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


def _fit_class(tally: Tally, options: FitConfig) -> dict[str, Any]:
    num = tally.candidates.shape[1]
    scores = tally.scores(options.metric)
    uniform = np.full(num, 1.0 / num)
    if tally.num_crops == 0 or not np.isfinite(scores).any():
        method = (f"uniform (none of the {tally.absent_crops} validation crops that annotate it has its foreground)"
                  if tally.absent_crops else "uniform (no validation crop annotates it)")
        return {"method": method, "lambda": 1.0, "fitted_weights": uniform, "weights": uniform, "scores": {}}
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


def guard(fit: Mapping[str, Any], fitted_score: float, shrunk_score: float, members: Sequence[int],
          gain_low: Mapping[str, float]) -> dict[str, Any]:
    """Step 8: keep the shrunk weights unless uniform ties them or a candidate beats them beyond the noise.

    Args:
        fit: a class's fit (`_fit_class`): its weights, fitted weights and first-pass scores.
        fitted_score, shrunk_score: second-pass scores of the unshrunk and shrunk weights.
        members: the class's member indices (for naming a member chosen alone, e.g. "member 2").
        gain_low: candidate name ("uniform", "unshrunk", "member 2", ...) → the low end of the paired
            crop-bootstrap interval of its score minus the shrunk weights' score (a name missing: not clear).

    Returns:
        "chosen", the chosen "weights", and "scores" with "shrunk" and "final" (the chosen one's score).
    """
    num = len(members)
    # name → (weights, score), simplest first: a tie goes to the earliest
    cands = {"uniform": (np.full(num, 1.0 / num), fit["scores"]["uniform"]),
             "shrunk": (fit["weights"], shrunk_score), "unshrunk": (fit["fitted_weights"], fitted_score),
             **{f"member {m}": (np.eye(num)[k], fit["scores"]["members"][k]) for k, m in enumerate(members)}}
    scores = {name: float(s) if np.isfinite(s) else -math.inf for name, (_, s) in cands.items()}
    clear = {name for name in cands if name != "shrunk" and gain_low.get(name, -math.inf) > 0}
    if not math.isfinite(scores["shrunk"]):
        clear = set(cands) - {"shrunk"}  # nothing to keep: the best of the others
    eligible = [name for name in cands if name == "shrunk" or name in clear
                or (name == "uniform" and scores["uniform"] >= scores["shrunk"] - TIE_TOLERANCE)]
    best = max(scores[name] for name in eligible)
    chosen = next(name for name in eligible if scores[name] >= best - TIE_TOLERANCE)
    return {"chosen": chosen, "weights": cands[chosen][0],
            "scores": {**fit["scores"], "fitted": float(fitted_score), "shrunk": float(shrunk_score),
                       "final": float(cands[chosen][1])}}


def guard_gains(tally: Tally, per_crop: Mapping[str, Mapping[str, Mapping[str, Any]]], scores: Mapping[str, float],
                era: str) -> dict[str, float]:
    """Candidate → the low end of its paired crop-bootstrap gain over the shrunk weights, for the candidates
    whose score beats the shrunk one's (the others cannot be chosen over it)."""
    shrunk = per_crop["shrunk"]
    return {name: paired_gain(crops, shrunk, label=tally.label, key=tally.key, era=era).low
            for name, crops in per_crop.items()
            if name != "shrunk" and scores[name] > scores["shrunk"] + TIE_TOLERANCE}


def _guarded(fit: Mapping[str, Any], tally: Tally, members: Sequence[int], *, fitted: tuple[float, Any],
             shrunk: tuple[float, Any], era: str) -> dict[str, Any]:
    """`guard` of one class, with the noise of each candidate's gain over the shrunk weights."""
    num = len(members)
    per_crop = {"uniform": tally.crop_scores[num], "shrunk": shrunk[1], "unshrunk": fitted[1],
                **{f"member {m}": tally.crop_scores[k] for k, m in enumerate(members)}}
    point = {"uniform": fit["scores"]["uniform"], "shrunk": shrunk[0], "unshrunk": fitted[0],
             **{f"member {m}": fit["scores"]["members"][k] for k, m in enumerate(members)}}
    point = {name: float(v) if np.isfinite(v) else -math.inf for name, v in point.items()}
    return guard(fit, fitted[0], shrunk[0], members, guard_gains(tally, per_crop, point, era))


def fit_weights(stores: Sequence[PredictionStore], plan: ChannelPlan, entries: Sequence[SplitEntry], *,
                grid: GridChoice = "finest", options: FitConfig | None = None, progress: bool = False) -> Weights:
    """Fit per-class weights on the validation crops `entries` (method in the module docstring).

    Returns:
        Weights for every output channel, with a report of the fit per class.
    """
    options = options or FitConfig()
    get_era(options.metric)  # a ValueError naming the registered eras, before any reading
    fittable, notes = [], {}
    for c in plan.classes:
        if len(plan.members_of[c]) < 2:
            notes[c] = "single member"
        elif not _is_cellmap(c):
            notes[c] = "uniform (not a CellMap class: no labels)"
        else:
            fittable.append(c)
    check_annotated(fittable, entries)
    kept = Kept(min(KEEP_MAX_BYTES, int(KEEP_AVAILABLE_FRACTION * available_memory_bytes())))  # for the second pass
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
                known[c] = (float(first[rows[0]]), float(first[rows[1]]),
                            *(tallies[c].crop_scores[r] for r in rows))
    final = score_candidates(stores, plan, entries, second, grid=grid, options=options, progress=progress, kept=kept)
    log.info("weight fit: %.1f MB of member values kept between the passes", kept.nbytes / 2**20)
    report_classes: dict[str, Any] = {c: {"method": note, "members": list(plan.members_of[c])}
                                      for c, note in notes.items()}
    for c, f in fits.items():
        if c in final:
            fitted_score, shrunk_score = final[c].scores(options.metric)
            fitted_crops, shrunk_crops = final[c].crop_scores
        elif c in known:
            fitted_score, shrunk_score, fitted_crops, shrunk_crops = known[c]
        if c in final or c in known:
            f.update(_guarded(f, tallies[c], plan.members_of[c], fitted=(fitted_score, fitted_crops),
                              shrunk=(shrunk_score, shrunk_crops), era=options.metric))
        report_classes[c] = {"method": f["method"], "members": list(plan.members_of[c]),
                             "chosen": f.get("chosen", "uniform"), "weights": [float(v) for v in f["weights"]],
                             "fitted_weights": [float(v) for v in f["fitted_weights"]], "lambda": f["lambda"],
                             "num_crops": tallies[c].num_crops, "absent_crops": tallies[c].absent_crops,
                             "truth_voxels": tallies[c].truth_voxels,
                             "scores": f["scores"], "score": "foreground IoU" if tallies[c].label.endswith(
                                 FOREGROUND_SUFFIX) else tallies[c].key}
        log.info("%s: weights %s (%s; fit %s, λ=%.2f over %d crops); scores: %s", c,
                 [round(float(v), 3) for v in f["weights"]], report_classes[c]["chosen"],
                 [round(float(v), 3) for v in f["fitted_weights"]], f["lambda"], tallies[c].num_crops, f["scores"])
    blind = [c for c in fits if tallies[c].num_crops == 0]
    if blind:
        log.warning("weight fit: %d of %d classes have no foreground in any validation crop and keep uniform weights: "
                    "%s", len(blind), len(fits), ", ".join(blind))
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
        out[channel] = channel_weights(full.tolist(), plan, channel, num_members)
    return out
