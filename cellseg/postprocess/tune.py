"""Tune post-processing parameters per class on tuning crops, against the challenge metric of one era.

Tuning crops: the crops named, or by default every crop of the store with truth in the data root except the
*report* crops of the runs the store was predicted by (`validation_roles.csv` beside their datasplit.csv):
those are kept for measuring the decisions, never for making them. Every class of the store must be
annotated in one of them (an error before any scoring otherwise).

For every class of the store, the tuning crops' probabilities and truth
(read at the store's grid by `cellseg.eval.truth.read_class_truth`, exactly as validation during training
reads it: semantic truth from the class arrays, instance truth as the ids on disk, or the 26-connected
components of a group's union) are held in memory; each candidate setting segments every crop, scores it
with the official per-crop scorer of the era (`cellseg.eval.crop_score.score_class`, inside the annotated
voxels only) and combines the crops as the leaderboard does, in decision mode (`cellseg.eval.crop_score.combine`:
a crop the era skips for too many objects counts as its worst case, so a setting cannot win by shattering a
poor crop): class IoU for semantic classes, the class combined score for instance classes.

Search (small on purpose: validation sets are small, a fine grid would fit their noise):
- semantic: the threshold over `SEMANTIC_THRESHOLDS`;
- instance: coordinate search, one parameter at a time with the others at their current best, in the
  order use_boundary (when the store has a boundary channel) → threshold → seed distance → minimum size →
  threshold again. Both scales follow the class's truth objects, since what matters is the size of an
  object, not of a voxel: seed distances are fractions of the median equivalent radius of the truth
  objects (`SEED_FRACTIONS`, nm), minimum sizes fractions of their median volume (`SIZE_FRACTIONS`, nm³).
A candidate replaces the current setting only when it scores strictly higher, so ties keep the defaults.
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
from cellseg.data.crops import Catalog, crop_name, crop_sort_key
from cellseg.data.split import ROLES_FILE, SplitEntry, derivable, read_roles
from cellseg.eval.crop_score import combine, score_class
from cellseg.eval.eras import get_era
from cellseg.eval.rules import is_scored_as_instance
from cellseg.eval.truth import read_class_truth
from cellseg.infer.store import PredictionStore, boundary_channel
from cellseg.postprocess.apply import read_class, segment_class
from cellseg.postprocess.params import ClassParams, InstanceParams, ParamSet, SemanticParams, default_params

log = logging.getLogger(__name__)
SEMANTIC_THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
INSTANCE_THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7)
SEED_FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.45, 0.6)  # seed distances, × the median truth object radius
SIZE_FRACTIONS = (0.0, 0.02, 0.05, 0.1, 0.25)  # minimum sizes, × the median truth object volume


@dataclass(frozen=True)
class Sample:
    """One class of one crop, in memory: probabilities, truth and the annotated voxels (z, y, x)."""

    crop: str
    prob: np.ndarray  # float32
    boundary: np.ndarray | None  # float32 boundary probability (instance classes), or None
    truth: np.ndarray  # bool (semantic) or object ids (instance), 0 outside `inside`
    inside: np.ndarray  # bool: annotated voxels
    voxel_size_nm: tuple[float, float, float]


def score_samples(class_name: str, samples: Sequence[Sample], params: ClassParams, *, era: str,
                  device: str = "cpu") -> float:
    """The class score over the samples: class IoU (semantic) or class combined score (instance), in `era`'s
    decision mode."""
    crop_scores: dict[str, dict[str, dict[str, Any]]] = {}
    for s in samples:
        seg = segment_class(class_name, s.prob, s.boundary, voxel_size_nm=s.voxel_size_nm, params=params,
                            device=device)
        seg = np.where(s.inside, seg, 0).astype(seg.dtype) if is_instance(class_name) else seg & s.inside
        score = score_class(seg, s.truth, label=class_name, era=era, voxel_size_nm=s.voxel_size_nm)
        crop_scores[s.crop] = {class_name: {**score, "num_voxels": int(s.inside.sum()),
                                            "voxel_size": list(s.voxel_size_nm)}}
    label = combine(crop_scores, era, decision=True)["label_scores"][class_name]
    return float(label["combined_score" if is_scored_as_instance(class_name) else "iou"])


class _Search:
    """Memoised candidate scoring: each distinct setting is scored once."""

    def __init__(self, class_name: str, samples: Sequence[Sample], *, era: str, device: str,
                 on_score: Callable[[], None]):
        self.class_name, self.samples, self.era, self.device = class_name, samples, era, device
        self.on_score = on_score
        self.cache: dict[ClassParams, float] = {}

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


def split_entry(catalog: Catalog, crop_id: int) -> SplitEntry:
    """The training crop `crop_id` of a catalogue as a validation entry (EM and label locations resolved)."""
    crop = catalog.train[crop_id]
    return SplitEntry(split="validate", em_url=str(catalog.locate(crop.em_url)), crop_url=str(catalog.locate(crop.crop_url)),
                      classes=crop.classes)


def store_runs(provenance: Mapping[str, Any]) -> list[Path]:
    """The run directories a store's provenance names (its own, or its ensemble members'), in order."""
    found: list[Path] = []
    stack: list[Any] = [provenance]
    while stack:
        item = stack.pop(0)
        if isinstance(item, Mapping):
            if isinstance(item.get("run_dir"), str):
                found.append(Path(item["run_dir"]))
            stack += list(item.values())
        elif isinstance(item, list):
            stack += item
    return list(dict.fromkeys(found))


def report_crops(store: PredictionStore) -> dict[str, str]:
    """Crop → the run that keeps it for reports, over the runs the store was predicted by."""
    out: dict[str, str] = {}
    for run in store_runs(store.provenance):
        roles = read_roles(run / ROLES_FILE)
        out.update({c: str(run) for c, role in roles.items() if role == "report" and c not in out})
    return out


def find_crops(data_root: str | Path, crops: Sequence[str] | None, store: PredictionStore) -> list[SplitEntry]:
    """Training crops of `data_root` to tune on: the named ones (`12` or `crop12`), by default every crop of
    the store that has truth in the data root and is not a report crop of the store's runs.

    Raises:
        ValueError: a named crop that is not a training crop of the data root or not in the store; no crop
            left by default.
    """
    catalog = Catalog.from_dir(data_root)
    by_name = {c.name: c for c in catalog.train.values()}
    written = set(store.completed())
    if crops:
        names = [crop_name(c) for c in crops]
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ValueError(f"{data_root}: {unknown} are not training crops with truth (known: "
                             f"{sorted(by_name, key=crop_sort_key)[:20]}...)")
        missing = [n for n in names if n not in written]
        if missing:
            raise ValueError(f"{store.path}: crops {missing} are not in the prediction store (it holds {sorted(written)})")
    else:
        kept = report_crops(store)
        names = sorted(written & set(by_name) - set(kept), key=crop_sort_key)
        if kept.keys() & written:
            log.info("not tuned on (report crops of %s): %s", ", ".join(sorted(set(kept.values()))),
                     ", ".join(sorted(kept.keys() & written, key=crop_sort_key)))
        if not names:
            raise ValueError(f"{store.path}: none of its crops {sorted(written)} has truth in {data_root} outside the "
                             f"report crops of its runs {sorted(kept)}; pass --crops IDS")
    return [split_entry(catalog, by_name[n].id) for n in names]


def check_annotated(classes: Sequence[str], entries: Sequence[SplitEntry]) -> None:
    """Every class to tune must be annotated (listed, or derivable from its atoms) in a tuning crop.

    Raises:
        ValueError: naming the classes no tuning crop annotates and the crops.
    """
    lacking = [c for c in classes if not any(derivable(c, e.classes) for e in entries)]
    if lacking:
        raise ValueError(f"no tuning crop annotates {lacking} (tuning crops: {[e.crop_name for e in entries]}): "
                         "pass --crops with crops that annotate every class of the store")


def load_samples(store: PredictionStore, entries: Sequence[SplitEntry], class_name: str) -> list[Sample]:
    """The class's samples over the tuning crops that annotate it."""
    samples = []
    for entry in entries:
        grid = store.grid(entry.crop_name)
        truth = read_class_truth(entry, class_name, grid)
        if truth is None:
            continue
        prob, boundary = read_class(store, entry.crop_name, class_name)
        samples.append(Sample(crop=entry.crop_name, prob=prob, boundary=boundary, truth=truth[0], inside=truth[1],
                              voxel_size_nm=tuple(float(v) for v in grid.voxel_size_nm)))  # type: ignore[arg-type]
    return samples


def tune_store(store: PredictionStore, data_root: str | Path, *, crops: Sequence[str] | None = None,
               era: str = "2026", device: str = "cpu", progress: bool = True) -> ParamSet:
    """Tune every class of a probability store on its tuning crops with truth in `data_root` (module docstring).

    A class whose listed annotation has no array in any tuning crop keeps its defaults (and no score).

    Raises:
        ValueError: bad crops (`find_crops`), or a class no tuning crop annotates (before any scoring).
    """
    from tqdm import tqdm

    entries = find_crops(data_root, crops, store)
    check_annotated(store.classes, entries)
    chosen: dict[str, ClassParams] = {}
    scores: dict[str, dict[str, float | None]] = {}
    total = sum(num_candidates(c, boundary_channel(c) in store.channels) for c in store.classes)
    with tqdm(total=total, desc="tune", unit="setting", disable=not progress) as bar:
        for name in store.classes:
            samples = load_samples(store, entries, name)
            if not samples:
                log.info("%s: annotated in none of the tuning crops; defaults kept", name)
                bar.update(num_candidates(name, boundary_channel(name) in store.channels))
                continue
            chosen[name], scores[name] = tune_class(name, samples, era=era, device=device, on_score=lambda: bar.update())
            log.info("%s (%d crops): %s → %s score %.4f (defaults %.4f)", name, len(samples), era,
                     _describe(chosen[name]), scores[name]["score"], scores[name]["default_score"])
    return ParamSet(classes=chosen, scores=scores, era=era,
                    tuned_on={"store": str(store.path), "data_root": str(data_root),
                              "crops": [e.crop_name for e in entries], "metric": era, "combined": "decision mode",
                              "crops_chosen": "given" if crops else "the store's crops with truth, report crops "
                                                                     "of its runs left out"})


def _describe(params: ClassParams) -> str:
    fields = dataclasses.asdict(params)
    if isinstance(params, InstanceParams):
        return ", ".join(f"{k}={v}" for k, v in fields.items())
    return f"threshold={fields['threshold']}"
