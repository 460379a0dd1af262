"""Validation during training with the challenge metric of one era (`val.metric`, e.g. "2026" or "2025").

For each validation crop: predict its annotated box at the training voxel size with the engine of
`cellseg predict` (`cellseg.infer.engine.predict_volume`: half a patch of EM context on every side, the
Gaussian-blended sliding window, no test-time augmentation). Then every class annotated in the crop is
decoded on the grid of its own truth (`val.grid: annotation`, `cellseg.eval.label_grid`: the label's `s0`,
as the leaderboard scores it) with `cellseg.postprocess.native.decode_on_grid`: semantic classes are the
linearly resampled probability above `val.threshold`; instance classes are objects of the post-processing of
`cellseg postprocess` at its default parameters (seeds from the mask minus the boundary channel, seeded
growth back into the mask, holes filled) decoded on the model's grid and refined on the label grid. The
truth is read on that grid (`cellseg.eval.truth`) and the class scored with the official per-crop scoring
of the era (`cellseg.eval.crop_score`), only inside the annotated voxels; Hausdorff distances are normalised
by the label's voxel size. `val.grid: model` decodes and scores on the model's grid instead (cheaper when
labels are much finer than the model, not what the leaderboard measures).

The GPU part stays in the training process; the decoding and scoring of each (crop, class) runs in the
`val.workers` processes of a `cellseg.train.valpool.ValidationPool` (by default as many as the loader's, idle
meanwhile), which the training run starts at its first validation and keeps for the others: while they work
on a crop, the next one is predicted. Every value of `val.workers` gives the same scores.

What ranks checkpoints (`best.pt`) is a decision, so (`cellseg.eval.decision`):
- only the *tuning* validation crops count (`SplitEntry.role`); the *report* crops are scored apart when
  `val.report_crops` is set and never rank;
- the crops are combined in decision mode: a crop the era skips for too many predicted objects counts as
  its worst case, never as nothing;
- the overall score ranks when the classes hold both kinds; otherwise the defined part does, with a warning.
The official scores are logged too, with the number of skipped crops beside them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from cellseg import runtime
from cellseg.classes import is_instance
from cellseg.config.schema import RunConfig
from cellseg.data.grid import Grid, shape3
from cellseg.data.targets import CropSource
from cellseg.eval.decision import decide
from cellseg.eval.eras import get_era
from cellseg.eval.label_grid import annotation_grid
from cellseg.infer.crop_plan import crop_grid
from cellseg.infer.engine import Window, predict_volume
from cellseg.postprocess.params import InstanceParams, SemanticParams
from cellseg.train.valpool import ClassTask, ValidationPool, gather

log = logging.getLogger(__name__)
CropScores = dict[str, dict[str, dict[str, Any]]]
CROPS_AHEAD = 2  # crops predicted while the validation workers have not yet scored them all


def validation_sets(crops: Sequence[CropSource], max_crops: int | None = None
                    ) -> tuple[list[CropSource], list[CropSource]]:
    """(tuning, report) crops; a crop without a role (a split written before roles existed) is a tuning
    crop. `max_crops` limits each part.

    Raises:
        ValueError: validation crops, but none of them a tuning crop (nothing to rank checkpoints on).
    """
    tuning = [c for c in crops if c.entry.role != "report"]
    report = [c for c in crops if c.entry.role == "report"]
    if crops and not tuning:
        raise ValueError(f"no tuning crop among the validation crops {[c.name for c in crops]} (all are report "
                         "crops): checkpoints are ranked on tuning crops; lower data.report_fraction")
    return tuning[:max_crops], report[:max_crops]


def validation_workers(cfg: RunConfig, crops: Sequence[CropSource]) -> int:
    """Worker processes of `val.workers` (null: `loader.num_workers`), at most one per (crop, class) scored."""
    tuning, report = validation_sets(crops, cfg.val.max_crops)
    tasks = sum(len(c.classes) for c in [*tuning, *(report if cfg.val.report_crops else [])])
    return min(cfg.loader.num_workers if cfg.val.workers is None else cfg.val.workers, tasks)


def class_tasks(crop: CropSource, probs: np.ndarray, grid: Grid, cfg: RunConfig) -> list[ClassTask]:
    """The decoding and scoring of every class of `crop` annotated there (`probs`: (C, z, y, x) on `grid`), each
    on its annotation grid (`val.grid`: "annotation") or on `grid` ("model"), in class order."""
    th = cfg.val.threshold
    boundary_of = {c: len(cfg.data.classes) + j for j, c in enumerate(cfg.data.boundary_classes)}
    tasks = []
    for k, name in enumerate(crop.classes):
        target = grid if cfg.val.grid == "model" else annotation_grid(crop, name)
        if target is None:
            continue  # not annotated here: nothing to score against
        params = InstanceParams(threshold=th, boundary_threshold=th) if is_instance(name) else SemanticParams(
            threshold=th)
        tasks.append(ClassTask(crop=crop, name=name, prob=probs[k],
                               boundary=probs[boundary_of[name]] if name in boundary_of else None,
                               source=grid, target=target, params=params, metric=cfg.val.metric))
    return tasks


def score_crops(model: torch.nn.Module, crops: Sequence[CropSource], cfg: RunConfig, *, device: torch.device,
                precision: runtime.Precision, pool: ValidationPool) -> CropScores:
    """Predict every crop (the model in eval mode, as the caller set it) and score its classes in `pool`.

    With worker processes, the next crop is predicted while the workers decode and score the classes of the
    ones before; at most `CROPS_AHEAD` crops wait for their scores (each holds its classes' probabilities).
    """
    window = Window(patch_vox=shape3(cfg.data.patch_shape_vox), device=device, precision=precision,
                    overlap=cfg.val.overlap, batch_size=cfg.val.batch_size, channels_last=cfg.train.channels_last,
                    pad_value=cfg.data.em_pad_value)
    crop_scores: CropScores = {}
    waiting: dict[str, dict[str, Future[dict[str, Any] | None]]] = {}
    try:
        for crop in crops:
            grid = crop_grid(crop, cfg.data.voxel_size_nm)
            probs = predict_volume(model, crop.em(), grid, window, num_outputs=cfg.data.num_target_channels)
            waiting[crop.name] = {t.name: pool.submit(t) for t in class_tasks(crop, probs, grid, cfg)}
            del probs
            while len(waiting) > CROPS_AHEAD:
                name = next(iter(waiting))
                crop_scores[name] = gather(waiting.pop(name), name)
        for name in list(waiting):
            crop_scores[name] = gather(waiting.pop(name), name)
    except BaseException:
        for futures in waiting.values():  # a failed validation leaves nothing queued
            for future in futures.values():
                future.cancel()
        raise
    return crop_scores


@torch.inference_mode()
def run_validation(model: torch.nn.Module, crops: Sequence[CropSource], cfg: RunConfig, *, device: torch.device,
                   precision: runtime.Precision, pool: ValidationPool | None = None) -> dict[str, Any]:
    """Predict and score the validation crops (module docstring), the classes in `pool` (a training run keeps
    one for all its validations), else in a pool of `validation_workers` processes made for this call.

    Returns:
        The official scores of the tuning crops (`overall_score`, its parts, `class_scores`, `label_scores`,
        `crop_scores`), `skipped_crops` (their count), `decision_score`, `ranked_by` and `ranking_score`
        (what `best.pt` is chosen by; `ranking_note` says why when it is not the overall score), `crops`
        (which crops were tuning and report crops), `grid`, `seconds`, and with `val.report_crops` the report
        crops' scores under `report`.

    Raises:
        ValueError: `cfg.val.metric` names no registered era, or no validation crop is a tuning crop.
    """
    get_era(cfg.val.metric)  # fail before predicting
    tuning, report = validation_sets(crops, cfg.val.max_crops)
    start = time.perf_counter()
    was_training = model.training
    model.eval()
    own_pool = pool is None
    pool = ValidationPool(validation_workers(cfg, crops)) if pool is None else pool
    try:
        scored = score_crops(model, [*tuning, *(report if cfg.val.report_crops else [])], cfg, device=device,
                             precision=precision, pool=pool)
    finally:
        model.train(was_training)
        if own_pool:
            pool.close()
    crop_scores = {c.name: scored[c.name] for c in tuning}
    report_scores = {c.name: scored[c.name] for c in report if c.name in scored}
    decision = decide(crop_scores, cfg.val.metric)
    if decision.ranking.reason:
        log.warning("checkpoints are ranked by %s, not the overall score: %s", decision.ranking.ranked_by,
                    decision.ranking.reason)
    result = {**decision.summary(), "ranking_note": decision.ranking.reason, "grid": cfg.val.grid,
              "seconds": round(time.perf_counter() - start, 3),
              "crops": {"tuning": [c.name for c in tuning], "report": [c.name for c in report]},
              "class_scores": decision.class_scores(), "label_scores": decision.official["label_scores"],
              "crop_scores": crop_scores}
    if report_scores:  # measured only: no ranking
        scored = decide(report_scores, cfg.val.metric)
        summary = {k: v for k, v in scored.summary().items() if k not in ("ranked_by", "ranking_score")}
        result["report"] = {**summary, "class_scores": scored.class_scores(), "crop_scores": report_scores}
    return result
