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

Then, with every class's parameters chosen, each class's hierarchy option (`cellseg.postprocess.hierarchy`:
"union" for a group, "argmax" for an atom; it reads the other classes' tuned thresholds) is scored on the same
samples the same way, and kept only where it raises the class's score (ties: off), `tune_hierarchy`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cellseg.classes import is_instance
from cellseg.data.grid import Grid, vec3
from cellseg.data.split import SplitEntry
from cellseg.data.targets import CropSource, NoRequestedClass
from cellseg.eval.crop_score import combine, score_class, semantic_from_counts
from cellseg.eval.eras import get_era
from cellseg.eval.label_grid import annotation_grid
from cellseg.eval.pool import one_thread_per_process
from cellseg.eval.rules import is_scored_as_instance
from cellseg.eval.truth import open_crop, read_class_truth
from cellseg.infer.store import PredictionStore, boundary_channel
from cellseg.postprocess.apply import read_class
from cellseg.postprocess.hierarchy import Rivals, crop_rivals, edited_probability, option_for, partners
from cellseg.postprocess.native import (
    axis_maps,
    decode_on_grid,
    linear_probability,
    segment_class,
    slab_planes,
)
from cellseg.postprocess.params import ClassParams, InstanceParams, ParamSet, SemanticParams, default_params
from cellseg.postprocess.spec import float32_threshold
from cellseg.postprocess.tune_crops import check_annotated, find_crops, split_entry

__all__ = ["Sample", "find_crops", "load_samples", "score_samples", "split_entry", "sweep_scores",
           "threshold_counts", "tune_class", "tune_hierarchy", "tune_store"]
log = logging.getLogger(__name__)
SEMANTIC_THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
INSTANCE_THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7)
SEED_FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.45, 0.6)  # seed distances, × the median truth object radius
SIZE_FRACTIONS = (0.0, 0.02, 0.05, 0.1, 0.25)  # minimum sizes, × the median truth object volume
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


def score_samples(class_name: str, samples: Sequence[Sample], params: ClassParams, *, era: str,
                  device: str = "cpu") -> float:
    """The class score over the samples: class IoU (semantic) or class combined score (instance), in `era`'s
    decision mode."""
    crop_scores = {}
    for s in samples:
        score = score_class(s.decode(class_name, params, device), s.truth, label=class_name, era=era,
                            voxel_size_nm=s.voxel_size_nm)
        crop_scores[s.crop] = {class_name: {**score, **s.extra()}}
    return _class_score(class_name, crop_scores, era)


def _class_score(class_name: str, crop_scores: dict[str, dict[str, dict[str, Any]]], era: str) -> float:
    label = combine(crop_scores, era, decision=True)["label_scores"][class_name]
    return float(label["combined_score" if is_scored_as_instance(class_name) else "iou"])


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
    """Memoised candidate scoring: each distinct setting is scored once."""

    def __init__(self, class_name: str, samples: Sequence[Sample], *, era: str, device: str,
                 on_score: Callable[[], None]):
        self.class_name, self.samples, self.era, self.device = class_name, samples, era, device
        self.on_score = on_score
        self.cache: dict[ClassParams, float] = {}

    def sweep_semantic(self, thresholds: Sequence[float]) -> None:
        """Score every threshold of a semantic class without post-ops in one pass (`sweep_scores`)."""
        base = SemanticParams()
        for t, score in sweep_scores(self.class_name, self.samples, thresholds, era=self.era).items():
            self.cache.setdefault(dataclasses.replace(base, threshold=t), score)
            self.on_score()

    def score(self, params: ClassParams) -> float:
        """The class score of one setting (computed on first request)."""
        if params not in self.cache:
            self.cache[params] = score_samples(self.class_name, self.samples, params, era=self.era, device=self.device)
            self.on_score()
        return self.cache[params]

    def sweep(self, best: ClassParams, field: str, values: Sequence[Any]) -> ClassParams:
        """Try each value of one field with the rest of `best`; keep a strictly better one."""
        best_score = self.score(best)
        for value in values:
            candidate = dataclasses.replace(best, **{field: value})
            score = self.score(candidate)
            if score > best_score:
                best, best_score = candidate, score
        return best


def tune_class(class_name: str, samples: Sequence[Sample], *, era: str, device: str = "cpu",
               on_score: Callable[[], None] = lambda: None) -> tuple[ClassParams, dict[str, float]]:
    """Best parameters of one class on the samples, with {"score", "default_score"} (module docstring)."""
    get_era(era)  # a ValueError naming the registered eras
    if not samples:
        raise ValueError(f"{class_name}: no tuning samples")
    search = _Search(class_name, samples, era=era, device=device, on_score=on_score)
    default = default_params(class_name)
    best: ClassParams = default
    if isinstance(default, SemanticParams):
        search.sweep_semantic(sorted({default.threshold, *SEMANTIC_THRESHOLDS}))
        best = search.sweep(best, "threshold", SEMANTIC_THRESHOLDS)
    else:
        volume = median_object_volume_nm3(samples)
        radius = (3 * volume / (4 * math.pi)) ** (1 / 3)
        if any(s.boundary is not None for s in samples):
            best = search.sweep(best, "use_boundary", (True, False))
        best = search.sweep(best, "threshold", INSTANCE_THRESHOLDS)
        if volume > 0:
            best = search.sweep(best, "seed_distance_nm", [round(f * radius, 3) for f in SEED_FRACTIONS])
            best = search.sweep(best, "min_size_nm3", [round(f * volume, 1) for f in SIZE_FRACTIONS])
            best = search.sweep(best, "threshold", INSTANCE_THRESHOLDS)
    return best, {"score": search.score(best), "default_score": search.score(default)}


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


def tune_hierarchy(store: PredictionStore, entries: Sequence[SplitEntry], chosen: dict[str, ClassParams],
                   scores: dict[str, dict[str, float | None]], *, era: str, device: str = "cpu",
                   grid: str = "annotation", on_class: Callable[[], None] = lambda: None,
                   crops: OpenCrops | None = None) -> None:
    """Try each tuned class's hierarchy option (module docstring) and keep it where it wins, updating `chosen` and
    `scores` in place: "hierarchy_off_score" (the tuned score) and "hierarchy_on_score" for every class tried,
    "score" raised to the latter where the option is kept. A class whose partners the store lacks is not tried."""
    thresholds = ParamSet(classes=dict(chosen))  # the options read the tuned thresholds, never edited probabilities
    rivals: dict[str, Rivals] = {}  # crop → the rivals of its atoms, read once

    def edit(name: str, sample: Sample) -> Sample:
        present = [c for c in store.classes if c in store.crop_channels(sample.crop)]

        def threshold_of(c: str) -> float:
            return thresholds.get(c).threshold

        def read(c: str) -> np.ndarray:
            return read_class(store, sample.crop, c)[0]

        def crop_rivals_once() -> Rivals:
            if sample.crop not in rivals:
                rivals[sample.crop] = crop_rivals(present, threshold_of=threshold_of, read=read)
            return rivals[sample.crop]

        prob = edited_probability(name, option_for(name), sample.prob, present=present, threshold_of=threshold_of,
                                  read=read, rivals=crop_rivals_once)
        return dataclasses.replace(sample, prob=prob)

    for name in store.classes:
        if name not in chosen or not partners(name, store.classes):
            continue
        option = option_for(name)
        samples = [edit(name, s) for s in load_samples(store, entries, name, grid=grid, crops=crops)]
        candidate = dataclasses.replace(chosen[name], hierarchy=option)
        on, off = score_samples(name, samples, candidate, era=era, device=device), float(scores[name]["score"])  # type: ignore[arg-type]
        scores[name].update(hierarchy_off_score=off, hierarchy_on_score=on)
        kept = on > off
        if kept:
            chosen[name], scores[name]["score"] = candidate, on
        log.info("%s: hierarchy %s %s (score %.4f with it, %.4f without)", name, option, "kept" if kept else "off",
                 on, off)
        on_class()


_WORKER_CROPS: dict[str, OpenCrops] = {}  # a tuning worker process's opened crops, by store (kept across classes)


def _tune_in_worker(store_path: str, entries: Sequence[SplitEntry], name: str, era: str, device: str, grid: str
                    ) -> tuple[ClassParams, dict[str, float | None]] | None:
    """One class tuned in a worker process (`tune_store(workers > 1)`); None where no tuning crop annotates it."""
    store = PredictionStore.open(store_path)
    crops = _WORKER_CROPS.setdefault(store_path, OpenCrops(store.classes))
    samples = load_samples(store, entries, name, grid=grid, crops=crops)
    return tune_class(name, samples, era=era, device=device) if samples else None


Tuned = tuple[ClassParams, dict[str, float | None]] | None  # a class's parameters and scores; None: no samples


def _tune_classes(store: PredictionStore, entries: Sequence[SplitEntry], crops: OpenCrops, *, era: str,
                  device: str, grid: str, workers: int, bar: Any, done: Mapping[str, Tuned],
                  on_result: Callable[[str, Tuned], None]) -> dict[str, Tuned]:
    """Every class of the store tuned (None: annotated in no tuning crop), in this process or, with `workers` > 1,
    the instance classes (over a minute each on a crop set of the quality benchmark's size: the 2026 metric's
    Hausdorff distances of every candidate decoding) in that many spawned processes while this one tunes the
    semantic classes (seconds each). Each class's tuning is independent of the others: the results are the same.
    Classes in `done` are taken from it; `on_result` gets each class as its tuning ends."""
    def here(name: str) -> Tuned:
        samples = load_samples(store, entries, name, grid=grid, crops=crops)
        result = tune_class(name, samples, era=era, device=device, on_score=lambda: bar.update()) if samples else None
        on_result(name, result)
        return result

    todo = [c for c in store.classes if c not in done]
    costly = [c for c in todo if is_instance(c)] if workers > 1 else []
    if len(costly) < 2:
        return {name: done[name] if name in done else here(name) for name in store.classes}
    import concurrent.futures
    import multiprocessing

    out: dict[str, Tuned] = dict(done)
    context = multiprocessing.get_context("spawn")  # no inherited threads or CUDA state
    with concurrent.futures.ProcessPoolExecutor(min(workers, len(costly)), mp_context=context,
                                                initializer=one_thread_per_process) as pool:
        futures = {pool.submit(_tune_in_worker, str(store.path), list(entries), c, era, device, grid): c
                   for c in costly}
        for name in todo:
            if name not in costly:
                out[name] = here(name)
        for future in concurrent.futures.as_completed(futures):
            name = futures[future]
            out[name] = future.result()
            on_result(name, out[name])
            if out[name] is not None:  # tune_store counts a class without samples itself
                bar.update(num_candidates(name, boundary_channel(name) in store.channels))
    return {name: out[name] for name in store.classes}


def tune_store(store: PredictionStore, data_root: str | Path, *, crops: Sequence[str] | None = None,
               era: str = "2026", device: str = "cpu", grid: str = "annotation", hierarchy: bool = True,
               progress: bool = True, workers: int = 1, checkpoint: Path | None = None) -> ParamSet:
    """Tune every class of a probability store on its tuning crops with truth in `data_root` (module docstring),
    scored on each class's annotation grid (`grid`: "annotation") or the store's ("model"); then, with
    `hierarchy`, the hierarchy options (`tune_hierarchy`). `workers` > 1 tunes the instance classes in that many
    processes (`_tune_classes`; the same parameters).

    A class whose listed annotation has no array in any tuning crop keeps its defaults (and no score).

    With `checkpoint`, every class's result is written there as it is tuned (a parameter file, atomically), and
    the classes a file there already holds, tuned on the same store, crops, era and grid, are not tuned again:
    a tuning that was cut resumes (the hierarchy options, tried last, are always tried).

    Raises:
        ValueError: bad crops (`find_crops`), a class no tuning crop annotates, an unknown `grid` (before any
            scoring).
    """
    from tqdm import tqdm

    if grid not in GRIDS:
        raise ValueError(f"tuning grid {grid!r} is not one of {GRIDS}")
    entries = find_crops(data_root, crops, store)
    check_annotated(store.classes, entries)
    chosen: dict[str, ClassParams] = {}
    scores: dict[str, dict[str, float | None]] = {}
    total = sum(num_candidates(c, boundary_channel(c) in store.channels) for c in store.classes)
    total += sum(bool(partners(c, store.classes)) for c in store.classes) if hierarchy else 0
    crops_open = OpenCrops(store.classes)
    if workers < 1:
        raise ValueError(f"tuning workers must be >= 1, got {workers}")
    identity = {"store": str(store.path), "crops": [e.crop_name for e in entries], "metric": era, "grid": grid}
    done = _checkpointed(checkpoint, identity, store.classes)
    partial = ParamSet(classes={n: r[0] for n, r in done.items() if r}, scores={n: r[1] for n, r in done.items() if r},
                       era=era, tuned_on={**identity, "partial": True})

    def keep(name: str, result: Tuned) -> None:
        nonlocal partial
        if checkpoint is not None and result is not None:
            partial = ParamSet(classes={**partial.classes, name: result[0]}, scores={**partial.scores, name: result[1]},
                               era=era, tuned_on=partial.tuned_on)
            partial.save(checkpoint, overwrite=True)

    with tqdm(total=total, desc="tune", unit="setting", disable=not progress) as bar:
        bar.update(sum(num_candidates(c, boundary_channel(c) in store.channels) for c in done))
        tuned = _tune_classes(store, entries, crops_open, era=era, device=device, grid=grid, workers=workers, bar=bar,
                              done=done, on_result=keep)
        for name, result in tuned.items():
            if result is None:
                log.info("%s: annotated in none of the tuning crops; defaults kept", name)
                bar.update(num_candidates(name, boundary_channel(name) in store.channels))
                continue
            chosen[name], scores[name] = result
            log.info("%s: %s → %s score %.4f (defaults %.4f)", name, era, _describe(chosen[name]),
                     scores[name]["score"], scores[name]["default_score"])
        if hierarchy:
            tune_hierarchy(store, entries, chosen, scores, era=era, device=device, grid=grid,
                           on_class=lambda: bar.update(), crops=crops_open)
    return ParamSet(classes=chosen, scores=scores, era=era,
                    tuned_on={"store": str(store.path), "data_root": str(data_root),
                              "crops": [e.crop_name for e in entries], "metric": era, "combined": "decision mode",
                              "grid": grid, "hierarchy": "kept where it raises the class's score" if hierarchy
                              else "not tried",
                              "crops_chosen": "given" if crops else "the store's crops with truth, report crops "
                                                                     "of its runs left out"})


def _checkpointed(path: Path | None, identity: Mapping[str, Any], classes: Sequence[str]) -> dict[str, Tuned]:
    """The classes a `tune_store` checkpoint at `path` holds for the same `identity` (else none, with a notice)."""
    if path is None or not path.is_file():
        return {}
    try:
        params = ParamSet.load(path)
    except ValueError as err:
        log.warning("%s: not a usable tuning checkpoint (%s); tuning every class", path, err)
        return {}
    if any(params.tuned_on.get(k) != v for k, v in identity.items()):
        log.warning("%s: tuned on another store, crops, era or grid; tuning every class", path)
        return {}
    done = {n: (p, dict(params.scores.get(n, {}))) for n, p in params.classes.items() if n in classes}
    log.info("%s: %d classes tuned before (%s), resuming", path, len(done), ", ".join(sorted(done)))
    return done


def _describe(params: ClassParams) -> str:
    fields = dataclasses.asdict(params)
    if isinstance(params, InstanceParams):
        return ", ".join(f"{k}={v}" for k, v in fields.items())
    return f"threshold={fields['threshold']}"
