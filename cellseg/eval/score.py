"""`evaluate`: score a submission against a ground-truth store under one era's rules.

The (crop, label) pairs scored are exactly the label arrays of the truth (`crop<N>/<label>`, `_mask`
arrays included, docs/scoring.md quirk 1). Each pair is one task (`tasks.run_task`); tasks run in a process pool,
largest first, and are only started while the sum of their estimated memory stays within the budget.
A task whose own estimate exceeds the budget is refused and scored as missing, with the reason.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cellseg.eval.eras import Era, get_era
from cellseg.eval.io import ArrayInfo, CropListing, Source, list_crop, open_source
from cellseg.eval.rules import MASK_SUFFIX
from cellseg.eval.safezip import ZipLimits
from cellseg.eval.submission_layout import Layout, discover
from cellseg.eval.tasks import Task, TaskResult, missing_scores, run_task
from cellseg.pool import DEFAULT_BUDGET_FRACTION, available_memory_bytes, map_bounded

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class Evaluation:
    """Everything one evaluation produced (rendered by `report`)."""

    metric: Era
    crop_scores: dict[str, dict[str, dict[str, Any]]]
    label_scores: dict[str, dict[str, Any]]
    overall_score: float
    overall_instance_score: float
    overall_semantic_score: float
    missing: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    official_failures: list[str] = field(default_factory=list)
    array_notes: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    task_seconds: dict[str, float] = field(default_factory=dict)  # "crop/label" → wall seconds of its task

    def slowest(self, n: int = 3) -> list[tuple[str, float]]:
        """The `n` (crop/label, seconds) tasks that took longest, slowest first."""
        return sorted(self.task_seconds.items(), key=lambda kv: -kv[1])[:n]


def _truth_crops(truth: Source) -> dict[str, CropListing]:
    crops = {name: list_crop(truth, name) for name in truth.subdirs("")}
    crops = {name: c for name, c in crops.items() if c.arrays}
    if not crops:
        raise ValueError(f"{truth.path}: no crop folders with label arrays; expected the evaluator's ground-truth "
                         "layout crop<N>/<label> (single-scale arrays with voxel_size, translation, shape)")
    bad = [f"{c}/{k}: {a.problem}" for c, listing in crops.items() for k, a in listing.arrays.items() if a.problem]
    if bad:
        raise ValueError(f"{truth.path}: unreadable truth arrays: {'; '.join(bad[:5])}")
    return crops


def _with_voxel_size(info: ArrayInfo, listing: CropListing, notes: list[str]) -> ArrayInfo:
    """Truth arrays without `voxel_size` (e.g. masks) borrow their crop's; the official code raises KeyError."""
    if "voxel_size" in info.attrs:
        return info
    donors = [a for a in listing.arrays.values() if "voxel_size" in a.attrs and a.shape == info.shape]
    if not donors:
        raise ValueError(f"truth array {info.key} has no voxel_size attribute and no sibling to borrow one from")
    notes.append(f"truth {info.key} has no voxel_size attribute (the official evaluators raise KeyError); "
                 f"used {donors[0].key}'s")
    attrs = {**info.attrs, "voxel_size": donors[0].attrs["voxel_size"],
             "translation": info.attrs.get("translation", donors[0].attrs.get("translation"))}
    return dataclasses.replace(info, attrs=attrs)


def build_tasks(truth_crops: dict[str, CropListing], layout: Layout, *, era: Era, max_bytes: int,
                notes: list[str], masks_only: frozenset[str] = frozenset()) -> tuple[list[Task], dict[str, Any]]:
    """One task per truth (crop, label), and the `missing` summary. `masks_only`: `crop<N>/<label>_mask` arrays
    that mask their class and are not scored as labels of their own (those `cellseg truth` wrote)."""
    tasks: list[Task] = []
    missing: dict[str, Any] = {"crops": sorted(set(truth_crops) - set(layout.crops)), "labels": {},
                               "unreadable": {}, "multiscale_groups": {}, "not_in_truth": {},
                               "folders_not_in_truth": list(layout.unmatched)}
    unknown = sorted({label for listing in truth_crops.values() for label in listing.arrays if not _known(label)})
    if unknown:
        notes.append(f"truth labels that are not CellMap classes, scored semantically as the official code does: "
                     f"{', '.join(unknown)}")
    for crop, listing in sorted(truth_crops.items()):
        submitted = layout.crops.get(crop)
        for label, info in sorted(listing.arrays.items()):
            if f"{crop}/{label}" in masks_only:
                continue
            info = _with_voxel_size(info, listing, notes)
            pred = submitted.arrays.get(label) if submitted else None
            if submitted and pred is None:
                missing["labels"].setdefault(crop, []).append(label)
                if label in submitted.groups:
                    missing["multiscale_groups"].setdefault(crop, []).append(label)
            mask = listing.arrays.get(f"{label}{MASK_SUFFIX}")
            tasks.append(Task(crop=crop, label=label, truth=info, mask=mask, pred=pred, era=era, max_bytes=max_bytes))
        if submitted:
            extra = sorted(set(submitted.arrays) - set(listing.arrays))
            if extra:
                missing["not_in_truth"][crop] = extra
    return tasks, missing


def truth_masks(truth: Source) -> frozenset[str]:
    """The `crop<N>/<label>_mask` arrays a truth store `cellseg truth` wrote lists as masks only (its marker's
    "masks"); none for any other truth."""
    from cellseg.eval.truth_store import MARKER

    attrs = truth.read_json(".zattrs") or {}
    marker = attrs.get(MARKER) if isinstance(attrs, dict) else None
    masks = marker.get("masks") if isinstance(marker, dict) else None
    return frozenset(m for m in masks if isinstance(m, str)) if isinstance(masks, list) else frozenset()


def _known(label: str) -> bool:
    from cellseg.classes import get_class

    try:
        get_class(label.removesuffix(MASK_SUFFIX))
    except ValueError:
        return False
    return True


def _failed(task: Task, reason: str) -> TaskResult:
    scores = {**missing_scores(task, None), "num_voxels": task.truth.num_voxels,
              "voxel_size": task.truth.attrs.get("voxel_size"), "is_missing": True}
    return TaskResult(crop=task.crop, label=task.label, scores=scores, unreadable=reason,
                      official_failure="the official evaluator fails on this array")


def run_tasks(tasks: list[Task], truth: Source, submission: Source, *, workers: int, budget: int,
              progress: bool = False) -> list[TaskResult]:
    """Run tasks (in-process for one worker, else in spawned processes within `budget`) in task order."""
    from tqdm import tqdm

    score = functools.partial(run_task, truth_source=truth, submission=submission)
    with tqdm(total=len(tasks), desc="scoring", unit="label", disable=not progress, leave=False) as bar:
        return map_bounded(score, tasks, workers if workers > 1 and len(tasks) > 1 else 1, processes=True,
                           cost=Task.estimate_bytes, budget=budget, done=bar.update,
                           died=lambda task: _failed(task, "the scoring worker died (out of memory?)"))


def _collect(results: Iterable[TaskResult], missing: dict[str, Any], evaluation_notes: list[str]
             ) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, dict[str, list[str]]], list[str]]:
    crop_scores: dict[str, dict[str, dict[str, Any]]] = {}
    array_notes: dict[str, dict[str, list[str]]] = {}
    failures: list[str] = []
    for r in results:
        crop_scores.setdefault(r.crop, {})[r.label] = r.scores
        notes = list(r.notes)
        if r.unreadable:
            missing["unreadable"].setdefault(r.crop, {})[r.label] = r.unreadable
            notes.append(f"scored as missing: {r.unreadable}")
        if r.official_failure:
            failures.append(f"{r.crop}/{r.label}: {r.official_failure}")
        if notes:
            array_notes.setdefault(r.crop, {})[r.label] = notes
    return crop_scores, array_notes, failures


def evaluate(submission: str | os.PathLike[str], truth: str | os.PathLike[str], *, metric: Era, workers: int = 1,
             memory_budget_bytes: int | None = None, zip_limits: ZipLimits | None = None, progress: bool = False
             ) -> Evaluation:
    """Score `submission` (zarr directory or zip) against `truth` (ground-truth zarr) with `metric`'s rules.

    Raises:
        ValueError: unknown metric (era), unusable truth, a corrupt or unsafe zip.
        FileNotFoundError: a path does not exist.
    """
    era = get_era(metric)
    budget = int(memory_budget_bytes or DEFAULT_BUDGET_FRACTION * available_memory_bytes())
    truth_source = open_source(truth)
    truth_crops = _truth_crops(truth_source)
    submission_source = open_source(submission, zip_limits=zip_limits)
    layout = discover(submission_source, truth_crops, repairs=era.repairs_layout)
    notes = list(layout.notes)
    masks_only = truth_masks(truth_source)
    if masks_only:
        notes.append(f"{len(masks_only)} masks of classes annotated in part (`cellseg truth --unannotated mask`) mask "
                     "their class and are not scored as classes (the official evaluator would also score each as "
                     "a class of its own)")
    tasks, missing = build_tasks(truth_crops, layout, era=metric, max_bytes=budget, notes=notes,
                                 masks_only=masks_only)
    for crop, labels in missing["multiscale_groups"].items():
        notes.append(f"{crop}: {', '.join(labels)} submitted as multiscale groups; the official evaluators list "
                     "arrays only and score them as missing (write single-scale arrays)")
    results = run_tasks(tasks, truth_source, submission_source, workers=workers, budget=budget, progress=progress)
    crop_scores, array_notes, failures = _collect(results, missing, notes)
    combined = era.combine(crop_scores)
    whole = [f"the whole submission: {reason}" for reason in layout.official_failure]
    return Evaluation(metric=metric, crop_scores=crop_scores, label_scores=combined["label_scores"],
                      overall_score=combined["overall_score"],
                      overall_instance_score=combined["overall_instance_score"],
                      overall_semantic_score=combined["overall_semantic_score"], missing=missing, notes=notes,
                      official_failures=whole + failures, array_notes=array_notes,
                      task_seconds={f"{r.crop}/{r.label}": r.seconds for r in results})
