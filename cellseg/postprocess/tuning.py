"""Tuning a whole probability store (`tune_store`): every class's parameters (`cellseg.postprocess.tune`;
the instance classes, the slow ones, in worker processes), then each class's hierarchy option
(`tune_hierarchy`), with a checkpoint per class so that a tuning that was cut resumes. The search itself, its
grid and its scoring are described in `cellseg.postprocess.tune`."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cellseg.classes import is_instance
from cellseg.config.fields import DEFAULT_ERA
from cellseg.data.prediction_store import PredictionStore, boundary_channel
from cellseg.data.split import SplitEntry
from cellseg.pool import one_thread_per_process
from cellseg.postprocess.apply import read_class
from cellseg.postprocess.hierarchy import Rivals, crop_rivals, edited_probability, option_for, partners
from cellseg.postprocess.params import ClassParams, InstanceParams, ParamSet
from cellseg.postprocess.tune import (
    GRIDS,
    OpenCrops,
    Sample,
    load_samples,
    num_candidates,
    score_samples,
    tune_class,
)
from cellseg.postprocess.tune_crops import check_annotated, find_crops

__all__ = ["hierarchy_score", "tune_hierarchy", "tune_store"]
log = logging.getLogger(__name__)


def hierarchy_score(store: PredictionStore, entries: Sequence[SplitEntry], name: str,
                    thresholds: ParamSet, chosen: ClassParams, *, era: str, device: str, grid: str,
                    crops: OpenCrops | None, rivals: dict[str, Rivals]) -> float:
    """The class's score over its tuning samples with its hierarchy option on (`chosen` with the option), the
    probabilities edited by the other classes' tuned `thresholds`; `rivals`: each crop's rivals, read once and
    filled here."""
    def edit(sample: Sample) -> Sample:
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

    samples = [edit(s) for s in load_samples(store, entries, name, grid=grid, crops=crops)]
    return score_samples(name, samples, dataclasses.replace(chosen, hierarchy=option_for(name)), era=era,
                         device=device)


_WORKER_CROPS: dict[str, OpenCrops] = {}  # a tuning worker process's opened crops, by store (kept across classes)


def _worker_store(store_path: str) -> tuple[PredictionStore, OpenCrops]:
    """A tuning worker process's store and its crops, opened once per process (kept across classes)."""
    store = PredictionStore.open(store_path)
    return store, _WORKER_CROPS.setdefault(store_path, OpenCrops(store.classes))


_WORKER_RIVALS: dict[str, Rivals] = {}  # a hierarchy worker process's rivals by crop (one `tune_hierarchy` call)


def _hierarchy_in_worker(store_path: str, entries: Sequence[SplitEntry], name: str, thresholds: ParamSet,
                         chosen: ClassParams, era: str, device: str, grid: str) -> float:
    """`hierarchy_score` of one class in a worker process (`tune_hierarchy(workers > 1)`)."""
    store, crops = _worker_store(store_path)
    return hierarchy_score(store, entries, name, thresholds, chosen, era=era, device=device, grid=grid, crops=crops,
                           rivals=_WORKER_RIVALS)


def tune_hierarchy(store: PredictionStore, entries: Sequence[SplitEntry], chosen: dict[str, ClassParams],
                   scores: dict[str, dict[str, float | None]], *, era: str, device: str = "cpu",
                   grid: str = "annotation", on_class: Callable[[], None] = lambda: None,
                   crops: OpenCrops | None = None, workers: int = 1) -> None:
    """Try each tuned class's hierarchy option (module docstring of `cellseg.postprocess.tune`) and keep it where
    it wins, updating `chosen` and `scores` in place: "hierarchy_off_score" (the tuned score) and
    "hierarchy_on_score" for every class tried, "score" raised to the latter where the option is kept. A class
    whose partners the store lacks is not tried. The classes are independent (each reads the others' tuned
    thresholds, never their options): `workers` > 1 scores them in that many spawned processes, the same
    results."""
    thresholds = ParamSet(classes=dict(chosen))  # the options read the tuned thresholds, never edited probabilities
    names = [n for n in store.classes if n in chosen and partners(n, store.classes)
             and scores.get(n, {}).get("score") is not None]  # a class no tuning crop has foreground of: not tried

    def decide(name: str, on: float) -> None:
        off = float(scores[name]["score"])  # type: ignore[arg-type]
        scores[name].update(hierarchy_off_score=off, hierarchy_on_score=on)
        kept = on > off
        if kept:
            chosen[name], scores[name]["score"] = dataclasses.replace(chosen[name], hierarchy=option_for(name)), on
        log.info("%s: hierarchy %s %s (score %.4f with it, %.4f without)", name, option_for(name),
                 "kept" if kept else "off", on, off)
        on_class()

    if workers <= 1 or len(names) < 2:
        rivals: dict[str, Rivals] = {}
        for name in names:
            decide(name, hierarchy_score(store, entries, name, thresholds, chosen[name], era=era, device=device,
                                         grid=grid, crops=crops, rivals=rivals))
        return
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # no inherited threads or CUDA state
    with concurrent.futures.ProcessPoolExecutor(min(workers, len(names)), mp_context=context,
                                                initializer=one_thread_per_process) as pool:
        futures = [pool.submit(_hierarchy_in_worker, str(store.path), list(entries), name, thresholds, chosen[name],
                               era, device, grid) for name in names]
        for name, future in zip(names, futures, strict=True):  # in class order: the same log and decisions
            decide(name, future.result())


def _log_tuned(name: str, era: str, params: ClassParams, info: Mapping[str, Any]) -> None:
    """One line per tuned class: the setting and its score, the crops it was decided on, and for instance classes
    the objects it predicts beside the truth's."""
    crops = f"{info.get('positive_crops', '?')} of {info.get('crops', '?')} tuning crops with its foreground"
    if info.get("positive_crops") == 0:
        log.warning("%s: no tuning crop has its foreground (%s); defaults kept", name, crops)
        return
    objects = (f"; {info['objects']} objects predicted, {info['truth_objects']} in the truth"
               f"{'' if info['bounded'] else ' (no setting within the bounds: defaults kept)'}"
               f"; {info['rejected']} degenerate settings rejected" if "objects" in info else "")
    log.info("%s: %s → %s score %.4f (defaults %.4f) on %s%s", name, era, _describe(params), info["score"],
             info["default_score"], crops, objects)


def _tune_in_worker(store_path: str, entries: Sequence[SplitEntry], name: str, era: str, device: str, grid: str
                    ) -> tuple[ClassParams, dict[str, float | None]] | None:
    """One class tuned in a worker process (`tune_store(workers > 1)`); None where no tuning crop annotates it."""
    store, crops = _worker_store(store_path)
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
               era: str = DEFAULT_ERA, device: str = "cpu", grid: str = "annotation", hierarchy: bool = True,
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
            _log_tuned(name, era, chosen[name], scores[name])
        if hierarchy:
            tune_hierarchy(store, entries, chosen, scores, era=era, device=device, grid=grid,
                           on_class=lambda: bar.update(), crops=crops_open, workers=workers)
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
