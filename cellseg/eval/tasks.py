"""Scoring one (crop, label) pair: read truth and mask, align the prediction, run the era's scorer.

A task never raises for a problem with the submission: an unreadable, refused or malformed array is
scored as missing (as the official evaluators score labels they cannot find), and the reason is
returned with the result, together with what the official evaluator of the era would have done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cellseg.eval.crop_score import align_prediction, score_class, score_missing
from cellseg.eval.eras import Era, get_era
from cellseg.eval.instance_2025 import MatrixTooLarge
from cellseg.eval.io import ArrayInfo, ArrayRefused, CompactArray, Source, open_zarr, read_array
from cellseg.eval.relabel import relabel_26
from cellseg.eval.resample import BadAttributes, Target
from cellseg.eval.rules import is_scored_as_instance

# Working memory of scoring, in bytes per truth voxel, on top of the arrays themselves.
INSTANCE_WORK_BYTES_PER_VOXEL = 4  # components (2-4 bytes) while the prediction is still held
SEMANTIC_WORK_BYTES_PER_VOXEL = 1
RESAMPLE_BYTES_PER_SOURCE_VOXEL = 24  # float64 copy, Gaussian, interpolation output


@dataclass(frozen=True, kw_only=True)
class Task:
    """One (crop, label) to score; `pred` is None when the submission lacks it."""

    crop: str
    label: str
    truth: ArrayInfo
    mask: ArrayInfo | None
    pred: ArrayInfo | None
    era: Era
    max_bytes: int

    @property
    def instance(self) -> bool:
        """Scored with the instance branch (the official INSTANCE_CLASSES list decides)."""
        return is_scored_as_instance(self.label)

    def estimate_bytes(self) -> int:
        """Peak memory this task needs, estimated from declared shapes."""
        voxels = self.truth.num_voxels
        need = self.truth.nbytes + (self.mask.nbytes if self.mask else 0)
        if self.pred is None:
            return need if self.instance else 0
        need += voxels * (self.pred.dtype.itemsize + (INSTANCE_WORK_BYTES_PER_VOXEL if self.instance
                                                      else SEMANTIC_WORK_BYTES_PER_VOXEL))
        if tuple(self.pred.shape) != tuple(self.truth.shape) or self.pred.attrs.get("voxel_size") != \
                self.truth.attrs.get("voxel_size"):
            need += self.pred.nbytes + self.pred.num_voxels * RESAMPLE_BYTES_PER_SOURCE_VOXEL
        return int(need)


@dataclass(kw_only=True)
class TaskResult:
    """Per-crop metrics of one (crop, label) and what happened while scoring it."""

    crop: str
    label: str
    scores: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    official_failure: str | None = None
    unreadable: str | None = None
    seconds: float = 0.0  # wall time of `run_task` (reading, aligning and scoring)


def truth_target(truth: ArrayInfo) -> Target:
    """The truth grid from the truth array's attributes (its shape is the array's own).

    Raises:
        ValueError: the truth lacks a usable `voxel_size` or `translation`.
    """
    try:
        vs = tuple(float(v) for v in truth.attrs["voxel_size"])
        tr = tuple(float(v) for v in truth.attrs.get("translation", (0.0,) * len(vs)))
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"truth array {truth.key} has no usable voxel_size/translation attributes") from None
    return Target(voxel_size_nm=vs, translation_nm=tr, shape_vox=tuple(truth.shape))


def missing_scores(task: Task, truth_source: Source | None) -> dict[str, Any]:
    """The official score of a label absent from the submission (its truth read from `truth_source` if the
    era needs it; None: counted as no object)."""
    truth = None if truth_source is None else lambda: _read_truth(task, truth_source)
    return score_missing(label=task.label, era=task.era, num_voxels=task.truth.num_voxels, truth=truth)


def _metadata(task: Task, scores: dict[str, Any], *, missing: bool) -> dict[str, Any]:
    voxel_size = task.truth.attrs.get("voxel_size")
    return {**scores, "num_voxels": task.truth.num_voxels, "voxel_size": voxel_size, "is_missing": missing}


class TruthUnreadable(ValueError):
    """The ground truth (not the submission) cannot be read: an error of the evaluation setup."""


def _read_truth(task: Task, source: Source) -> np.ndarray:
    try:
        return read_array(source, task.truth, max_bytes=task.max_bytes, compact=task.mask is None)
    except ArrayRefused as err:
        raise TruthUnreadable(f"ground truth {task.truth.key}: {err}") from None


def _read_mask(task: Task, source: Source, shape: tuple[int, ...], result: TaskResult) -> np.ndarray | None:
    if task.mask is None:
        return None
    try:
        mask = read_array(source, task.mask, max_bytes=task.max_bytes)
    except ArrayRefused as err:
        raise TruthUnreadable(f"mask {task.mask.key}: {err}") from None
    if mask.shape != shape:
        result.notes.append(f"mask {task.mask.key} has shape {mask.shape}, not {shape}: not applied")
        result.official_failure = "the mask array does not match the truth's shape"
        return None
    return mask


def _score(task: Task, holder: list[np.ndarray], mask: np.ndarray | None, truth_source: Source,
           result: TaskResult) -> dict[str, Any]:
    """Score the aligned prediction in `holder`.

    The prediction is relabelled (instance) and released before the truth is read, so at most two
    label volumes are in memory at once. Masks multiply prediction and truth first (numpy `*`, as
    the official `pred_label * mask`).
    """
    vs = list(truth_target(task.truth).voxel_size_nm)
    if mask is not None:
        holder[0] = holder[0] * mask
    if task.instance:
        pred_cc, num_pred = relabel_26(holder.pop())
        truth = _read_truth(task, truth_source)
        truth = truth * mask if mask is not None else truth
        result.official_failure = get_era(task.era).truth_failure(truth) or result.official_failure
        return score_class(pred_cc, truth, label=task.label, era=task.era, voxel_size_nm=vs, num_components=num_pred,
                           max_bytes=task.max_bytes)
    if holder[0].dtype.kind == "f" and (nans := int(np.isnan(holder[0]).sum())):
        result.notes.append(f"{nans} NaN voxels count as background (NaN > 0 is false)")
    truth = _read_truth(task, truth_source)
    truth = truth * mask if mask is not None else truth
    return score_class(holder.pop(), truth, label=task.label, era=task.era, voxel_size_nm=vs)


def _missing(task: Task, truth_source: Source) -> dict[str, Any]:
    return _metadata(task, missing_scores(task, truth_source), missing=True)


def run_task(task: Task, truth_source: Source, submission: Source) -> TaskResult:
    """Score one (crop, label); problems with the submission become a missing score plus a note.

    Raises:
        TruthUnreadable: the truth or its mask cannot be read.
    """
    started = time.perf_counter()
    result = _run_task(task, truth_source, submission)
    result.seconds = time.perf_counter() - started
    return result


def _run_task(task: Task, truth_source: Source, submission: Source) -> TaskResult:
    result = TaskResult(crop=task.crop, label=task.label, scores={})
    if task.pred is None:
        result.scores = _missing(task, truth_source)
        return result
    try:
        if task.estimate_bytes() > task.max_bytes:
            raise ArrayRefused(f"scoring needs about {task.estimate_bytes() / 2**30:.1f} GiB, more than the memory "
                               f"budget of {task.max_bytes / 2**30:.1f} GiB")
        array = open_zarr(submission, task.pred, max_bytes=task.max_bytes)
        reader = CompactArray(array) if task.mask is None else array
        aligned = align_prediction(reader, task.pred.attrs, instance=task.instance, target=truth_target(task.truth),
                                   era=task.era)
        result.notes += aligned.notes
        result.official_failure = aligned.official_failure
        holder = [aligned.data]
        del aligned
        mask = _read_mask(task, truth_source, tuple(task.truth.shape), result)
        result.scores = _metadata(task, _score(task, holder, mask, truth_source, result), missing=False)
    except TruthUnreadable:
        raise
    except Exception as err:  # a malformed submission must never stop the evaluation
        expected = isinstance(err, ArrayRefused | BadAttributes | MatrixTooLarge)
        result.unreadable = str(err) if expected else f"{type(err).__name__}: {err}"
        result.official_failure = result.official_failure or "the official evaluator fails on this array"
        result.scores = _missing(task, truth_source)
    return result
