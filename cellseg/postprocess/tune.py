"""Tune post-processing parameters per class on tuning crops, against the challenge metric of one era.

Tuning crops: the crops named, or by default every crop of the store with truth in the data root except the
*report* crops of the runs the store was predicted by (`validation_roles.csv` beside their datasplit.csv):
those are kept for measuring the decisions, never for making them. Every class of the store must be
annotated in one of them (an error before any scoring otherwise).

For every class of the store, the tuning crops' probabilities (on the store's grid) and truth are held in
memory. The truth is read on the class's annotation grid (`cellseg.eval.label_grid`: the label's `s0`, where
the leaderboard scores it; `grid="model"`: the store's grid) by `cellseg.eval.truth.read_class_truth`,
exactly as validation during training reads it (semantic truth from the class arrays, instance truth as the
ids on disk, or the 26-connected components of a group's union). Each candidate setting decodes every crop
on that grid (`cellseg.postprocess.native.decode_on_grid`: the linearly resampled probability for semantic
classes, objects decoded on the store's grid and refined there for instance classes), scores it
with the official per-crop scorer of the era (`cellseg.eval.crop_score.score_class`, inside the annotated
voxels only) and combines the crops as the leaderboard does, in decision mode (`cellseg.eval.crop_score.combine`:
a crop the era skips for too many objects counts as its worst case, so a setting cannot win by shattering a
poor crop): class IoU for semantic classes, the class combined score for instance classes.

Search (small on purpose: validation sets are small, a fine grid would fit their noise):
- semantic: the threshold over `SEMANTIC_THRESHOLDS`, in one pass over each crop (the voxel counts above
  every threshold at once, `threshold_counts`: a semantic class without post-ops is exactly `lin(p) > t`);
- instance: coordinate search, one parameter at a time with the others at their current best, in the
  order use_boundary (when the store has a boundary channel) → threshold → seed distance → minimum size →
  threshold again. Both scales follow the class's truth objects, since what matters is the size of an
  object, not of a voxel: seed distances are fractions of the median equivalent radius of the truth
  objects (`SEED_FRACTIONS`, nm), minimum sizes fractions of their median volume (`SIZE_FRACTIONS`, nm³).
A candidate replaces the current setting only when it scores strictly higher, so ties keep the defaults.

Two rules keep a small tuning set from choosing a confidently wrong setting:
- presence (`cellseg.eval.presence`): a class is tuned on the crops where its truth has foreground only (on
  the others the setting that predicts least always wins); with none, its defaults are kept and the scores
  say so (`positive_crops` 0);
- bounds (instance classes): a setting whose foreground volume or object count over those crops is more than
  `INSTANCE_BOUND` times off the truth's, either way, is degenerate (the whole crop as one object, or a
  thousand fragments) and cannot be chosen; a degenerate default is replaced by the best bounded candidate.
  The chosen setting's object count is reported beside the truth's.

Then, with every class's parameters chosen, each class's hierarchy option (`cellseg.postprocess.hierarchy`:
"union" for a group, "argmax" for an atom; it reads the other classes' tuned thresholds) is scored on the same
samples the same way, and kept only where it raises the class's score (ties: off): `tune_hierarchy` in
`cellseg.postprocess.tuning`, which also tunes a whole store (`tune_store`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellseg.classes import is_instance
from cellseg.data.grid import Grid, vec3
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.split import SplitEntry
from cellseg.data.targets import CropSource, NoRequestedClass
from cellseg.eval.crop_score import combine, score_class, semantic_from_counts
from cellseg.eval.eras import get_era
from cellseg.eval.label_grid import annotation_grid
from cellseg.eval.presence import MIN_POSITIVE_CROPS
from cellseg.eval.rules import is_scored_as_instance
from cellseg.eval.truth import open_crop, read_class_truth
from cellseg.postprocess.apply import read_class
from cellseg.postprocess.native import (
    axis_maps,
    decode_on_grid,
    linear_probability,
    segment_class,
    slab_planes,
)
from cellseg.postprocess.params import ClassParams, SemanticParams, default_params
from cellseg.postprocess.spec import float32_threshold
from cellseg.postprocess.tune_crops import find_crops, split_entry

__all__ = ["OpenCrops", "Sample", "find_crops", "load_samples", "score_samples", "split_entry", "sweep_scores",
           "threshold_counts", "tune_class"]
log = logging.getLogger(__name__)
SEMANTIC_THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
INSTANCE_THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7)
SEED_FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.45, 0.6)  # seed distances, × the median truth object radius
SIZE_FRACTIONS = (0.0, 0.02, 0.05, 0.1, 0.25)  # minimum sizes, × the median truth object volume
INSTANCE_BOUND = 4.0  # foreground volume and object count within 1/4..4 × the truth's, or the setting is degenerate
GRIDS = ("annotation", "model")  # where a class is decoded and scored: its label's grid, or the store's


@dataclass(frozen=True)
class Sample:
    """One class of one crop, in memory: probabilities on the `source` grid, truth and the annotated voxels on
    the `target` grid (z, y, x); without grids, everything is on one grid."""

    crop: str
    prob: np.ndarray  # float32
    boundary: np.ndarray | None  # float32 boundary probability (instance classes), or None
    truth: np.ndarray  # bool (semantic) or object ids (instance), 0 outside `inside`
    inside: np.ndarray  # bool: annotated voxels
    voxel_size_nm: tuple[float, float, float]  # of the truth's grid (Hausdorff distances, object volumes)
    source: Grid | None = None  # the probability's grid (the store's)
    target: Grid | None = None  # the truth's grid (the annotation grid)

    @property
    def resampled(self) -> bool:
        """The probability lives on another grid than the truth."""
        return self.source is not None and self.target is not None and self.source != self.target

    def decode(self, class_name: str, params: ClassParams, device: str = "cpu") -> np.ndarray:
        """The class decoded on the truth's grid with `params`, zero outside the annotated voxels."""
        if self.resampled:
            seg = decode_on_grid(class_name, self.prob, self.boundary, source=self.source, target=self.target,
                                 params=params, device=device)  # type: ignore[arg-type]
        else:
            seg = segment_class(class_name, self.prob, self.boundary, voxel_size_nm=self.voxel_size_nm,
                                params=params, device=device)
        return np.where(self.inside, seg, 0).astype(seg.dtype) if is_instance(class_name) else seg & self.inside

    @property
    def positive(self) -> bool:
        """The truth has foreground of the class in the annotated voxels."""
        return bool(np.any(self.truth))

    def extra(self) -> dict[str, Any]:
        """The keys the era's combining needs beside the per-crop scores."""
        return {"num_voxels": int(self.inside.sum()), "voxel_size": list(self.voxel_size_nm)}


def threshold_counts(sample: Sample, thresholds: Sequence[float]) -> np.ndarray:
    """(T, 3) int64 tp, fp, fn of `lin(p) > t` inside the annotated voxels for every threshold, in one pass
    (z-slabs of the truth's grid): what `Sample.decode` gives a semantic class without post-ops."""
    th = np.asarray([float32_threshold(t) for t in thresholds], np.float32)
    order = np.argsort(th)
    above = np.zeros((2, th.size + 1), np.int64)  # [negatives, positives] by the number of thresholds below
    maps = axis_maps(sample.source, sample.target) if sample.resampled else None  # type: ignore[arg-type]
    depth = sample.truth.shape[0]
    planes = slab_planes(sample.target) if sample.target is not None else depth
    for z0 in range(0, depth, planes):
        z1 = min(z0 + planes, depth)
        values = linear_probability(sample.prob, maps, z0, z1) if maps else sample.prob[z0:z1]
        inside, truth = sample.inside[z0:z1], sample.truth[z0:z1] > 0
        below = np.searchsorted(th[order], values[inside], side="left")  # thresholds < value: value > each
        for positive in (False, True):
            above[int(positive)] += np.bincount(below[truth[inside] == positive], minlength=th.size + 1)
    # value > th[order[j]] exactly when more than j thresholds lie below it: suffix sums over the bins
    predicted = np.cumsum(above[:, ::-1], axis=1)[:, ::-1][:, 1:]
    tp, fp = predicted[1], predicted[0]
    counts = np.zeros((th.size, 3), np.int64)
    counts[order] = np.stack([tp, fp, above[1].sum() - tp], axis=1)
    return counts


@dataclass(frozen=True)
class Outcome:
    """A setting's class score over the samples, with what it predicted (foreground voxels, objects)."""

    score: float
    foreground_voxels: int
    objects: int


def score_samples(class_name: str, samples: Sequence[Sample], params: ClassParams, *, era: str,
                  device: str = "cpu") -> float:
    """The class score over the samples: class IoU (semantic) or class combined score (instance), in `era`'s
    decision mode."""
    return score_outcome(class_name, samples, params, era=era, device=device).score


def score_outcome(class_name: str, samples: Sequence[Sample], params: ClassParams, *, era: str,
                  device: str = "cpu") -> Outcome:
    """`score_samples` with the predicted foreground voxels and objects (instance classes: distinct ids)."""
    crop_scores, voxels, objects = {}, 0, 0
    for s in samples:
        seg = s.decode(class_name, params, device)
        voxels += int(np.count_nonzero(seg))
        objects += count_objects(seg) if is_instance(class_name) else 0
        score = score_class(seg, s.truth, label=class_name, era=era, voxel_size_nm=s.voxel_size_nm)
        crop_scores[s.crop] = {class_name: {**score, **s.extra()}}
    return Outcome(_class_score(class_name, crop_scores, era), voxels, objects)


def count_objects(ids: np.ndarray) -> int:
    """Distinct non-zero ids of an instance array."""
    return int(np.unique(ids[ids != 0]).size)


@dataclass(frozen=True)
class Bounds:
    """What a bounded instance setting may predict over the samples: foreground voxels and objects within
    `INSTANCE_BOUND` of the truth's, either way."""

    truth_voxels: int
    truth_objects: int

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Bounds:
        """The truth's totals over the samples."""
        return cls(sum(int(np.count_nonzero(s.truth)) for s in samples), sum(count_objects(s.truth) for s in samples))

    def holds(self, outcome: Outcome) -> bool:
        """True when the outcome's foreground and object count are both within the bound."""
        return (_within(outcome.foreground_voxels, self.truth_voxels)
                and _within(outcome.objects, self.truth_objects))


def _within(value: int, reference: int) -> bool:
    return reference > 0 and reference / INSTANCE_BOUND <= value <= reference * INSTANCE_BOUND


def _class_score(class_name: str, crop_scores: dict[str, dict[str, dict[str, Any]]], era: str) -> float:
    labels = combine(crop_scores, era, decision=True)["label_scores"]
    if class_name not in labels:  # no crop with the class's foreground: nothing to decide on
        return math.nan
    return float(labels[class_name]["combined_score" if is_scored_as_instance(class_name) else "iou"])


def sweep_scores(class_name: str, samples: Sequence[Sample], thresholds: Sequence[float], *, era: str
                 ) -> dict[float, float]:
    """Threshold → the class IoU of a semantic class without post-ops, from one pass per sample."""
    counts = [threshold_counts(s, thresholds) for s in samples]
    out = {}
    for j, t in enumerate(thresholds):
        crop_scores = {s.crop: {class_name: {**semantic_from_counts(*map(int, c[j]), era), **s.extra()}}
                       for s, c in zip(samples, counts, strict=True)}
        out[t] = _class_score(class_name, crop_scores, era)
    return out


class _Search:
    """Memoised candidate scoring: each distinct setting is scored once. With `bounds` (instance classes), a
    setting outside them ranks below every bounded one (module docstring)."""

    def __init__(self, class_name: str, samples: Sequence[Sample], *, era: str, device: str,
                 on_score: Callable[[], None], bounds: Bounds | None = None):
        self.class_name, self.samples, self.era, self.device = class_name, samples, era, device
        self.on_score, self.bounds = on_score, bounds
        self.cache: dict[ClassParams, Outcome] = {}
        self.rejected: set[ClassParams] = set()

    def sweep_semantic(self, thresholds: Sequence[float]) -> None:
        """Score every threshold of a semantic class without post-ops in one pass (`sweep_scores`)."""
        base = SemanticParams()
        for t, score in sweep_scores(self.class_name, self.samples, thresholds, era=self.era).items():
            self.cache.setdefault(dataclasses.replace(base, threshold=t), Outcome(score, -1, -1))
            self.on_score()

    def outcome(self, params: ClassParams) -> Outcome:
        """The outcome of one setting (computed on first request)."""
        if params not in self.cache:
            self.cache[params] = score_outcome(self.class_name, self.samples, params, era=self.era, device=self.device)
            self.on_score()
        return self.cache[params]

    def score(self, params: ClassParams) -> float:
        """The class score of one setting."""
        return self.outcome(params).score

    def rank(self, params: ClassParams) -> float:
        """The score a setting competes with: -inf outside the bounds."""
        outcome = self.outcome(params)
        if self.bounds is not None and not self.bounds.holds(outcome):
            self.rejected.add(params)
            return -math.inf
        return outcome.score

    def sweep(self, best: ClassParams, field: str, values: Sequence[Any]) -> ClassParams:
        """Try each value of one field with the rest of `best`; keep a strictly better one."""
        best_rank = self.rank(best)
        for value in values:
            candidate = dataclasses.replace(best, **{field: value})
            rank = self.rank(candidate)
            if rank > best_rank:
                best, best_rank = candidate, rank
        return best


def tune_class(class_name: str, samples: Sequence[Sample], *, era: str, device: str = "cpu",
               on_score: Callable[[], None] = lambda: None) -> tuple[ClassParams, dict[str, Any]]:
    """Best parameters of one class on the samples with foreground (module docstring), with {"score",
    "default_score", "positive_crops", "crops"} and, for instance classes, the chosen setting's "objects" and
    "foreground_voxels" beside the truth's, and the number of settings "rejected" as degenerate."""
    get_era(era)  # a ValueError naming the registered eras
    if not samples:
        raise ValueError(f"{class_name}: no tuning samples")
    default = default_params(class_name)
    positive = [s for s in samples if s.positive]
    counts = {"positive_crops": len(positive), "crops": len(samples)}
    if len(positive) < MIN_POSITIVE_CROPS:
        return default, {"score": None, "default_score": None, **counts}
    bounds = Bounds.of(positive) if is_instance(class_name) else None
    search = _Search(class_name, positive, era=era, device=device, on_score=on_score, bounds=bounds)
    best: ClassParams = default
    if isinstance(default, SemanticParams):
        search.sweep_semantic(sorted({default.threshold, *SEMANTIC_THRESHOLDS}))
        best = search.sweep(best, "threshold", SEMANTIC_THRESHOLDS)
    else:
        volume = median_object_volume_nm3(positive)
        radius = (3 * volume / (4 * math.pi)) ** (1 / 3)
        if any(s.boundary is not None for s in positive):
            best = search.sweep(best, "use_boundary", (True, False))
        best = search.sweep(best, "threshold", INSTANCE_THRESHOLDS)
        if volume > 0:
            best = search.sweep(best, "seed_distance_nm", [round(f * radius, 3) for f in SEED_FRACTIONS])
            best = search.sweep(best, "min_size_nm3", [round(f * volume, 1) for f in SIZE_FRACTIONS])
            best = search.sweep(best, "threshold", INSTANCE_THRESHOLDS)
    info: dict[str, Any] = {"score": search.score(best), "default_score": search.score(default), **counts}
    if bounds is not None:
        chosen = search.outcome(best)
        info.update(objects=chosen.objects, truth_objects=bounds.truth_objects,
                    foreground_voxels=chosen.foreground_voxels, truth_voxels=bounds.truth_voxels,
                    rejected=len(search.rejected), bounded=bounds.holds(chosen))
    return best, info


def median_object_volume_nm3(samples: Sequence[Sample]) -> float:
    """Median physical volume of the truth objects over the samples (0 when there are none)."""
    volumes = []
    for s in samples:
        _, counts = np.unique(s.truth[s.truth > 0], return_counts=True)
        volumes.append(counts * float(np.prod(s.voxel_size_nm)))
    pooled = np.concatenate(volumes) if volumes else np.zeros(0)
    return float(np.median(pooled)) if pooled.size else 0.0


def num_candidates(class_name: str, has_boundary: bool) -> int:
    """Upper bound on the settings `tune_class` scores (for progress bars)."""
    if not is_instance(class_name):
        return len(SEMANTIC_THRESHOLDS) + 1
    return 1 + 2 * has_boundary + 2 * len(INSTANCE_THRESHOLDS) + len(SEED_FRACTIONS) + len(SIZE_FRACTIONS)


class OpenCrops:
    """The tuning crops opened once each for every class of a store (opening a crop reads the metadata of all
    its label arrays: per class and crop it cost more than reading the truth)."""

    def __init__(self, classes: Sequence[str]):
        self.classes = tuple(classes)
        self._open: dict[str, CropSource | None] = {}

    def get(self, entry: SplitEntry, class_name: str) -> CropSource | None:
        """The crop opened for (at least) `class_name`; None where it annotates none of the classes."""
        if class_name not in self.classes:
            return _open_or_none(entry, (class_name,))
        if entry.crop_name not in self._open:
            self._open[entry.crop_name] = _open_or_none(entry, self.classes)
        return self._open[entry.crop_name]


def _open_or_none(entry: SplitEntry, classes: Sequence[str]) -> CropSource | None:
    try:
        return open_crop(entry, classes)
    except NoRequestedClass:
        return None


def load_samples(store: PredictionStore, entries: Sequence[SplitEntry], class_name: str, *,
                 grid: str = "annotation", crops: OpenCrops | None = None) -> list[Sample]:
    """The class's samples over the tuning crops that annotate it: truth on its annotation grid (`grid`:
    "annotation") or the store's ("model"); `crops`: the crops opened once for many classes (the samples are
    the same)."""
    samples = []
    for entry in entries:
        source = store.grid(entry.crop_name)
        crop = crops.get(entry, class_name) if crops else _open_or_none(entry, (class_name,))
        if crop is None:
            continue
        target = source if grid == "model" else annotation_grid(crop, class_name)
        truth = None if target is None else read_class_truth(crop, class_name, target)
        if target is None or truth is None:
            continue
        prob, boundary = read_class(store, entry.crop_name, class_name)
        samples.append(Sample(crop=entry.crop_name, prob=prob, boundary=boundary, truth=truth[0], inside=truth[1],
                              voxel_size_nm=vec3(target.voxel_size_nm), source=source, target=target))
    return samples
