"""Validation during training with the challenge metric of one era (`val.metric`, e.g. "2026" or "2025").

For each validation crop: predict its annotated box at the training voxel size with the engine of
`cellseg predict` (`cellseg.infer.engine.predict_volume`: half a patch of EM context on every side, the
Gaussian-blended sliding window, no test-time augmentation), threshold, and score every class annotated
in the crop against its truth on the same grid (`cellseg.eval.truth`) with the official per-crop scoring of
that era (`cellseg.eval.crop_score`), only inside the annotated voxels. Instance classes become objects with
the post-processing of `cellseg postprocess` at its default parameters (`cellseg.postprocess`: seeds from the
mask minus the boundary channel, seeded growth back into the mask, holes filled) before scoring.
Per-crop scores are combined exactly as the leaderboard of that era combines them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cellseg import runtime
from cellseg.classes import is_instance
from cellseg.config.schema import RunConfig
from cellseg.data.grid import Grid
from cellseg.data.targets import CropSource
from cellseg.eval.crop_score import combine, score_class
from cellseg.eval.eras import get_era
from cellseg.eval.truth import read_class_truth
from cellseg.infer.engine import predict_volume
from cellseg.infer.plan import crop_grid
from cellseg.postprocess.instances import segment_instances
from cellseg.postprocess.params import InstanceParams

log = logging.getLogger(__name__)


def score_crop(crop: CropSource, probs: np.ndarray, grid: Grid, cfg: RunConfig) -> dict[str, dict[str, Any]]:
    """Per-class scores of one crop in the era of `cfg.val.metric` (`probs`: (C, z, y, x) on `grid`)."""
    era, th, vs = get_era(cfg.val.metric), cfg.val.threshold, grid.voxel_size_nm
    boundary_of = {c: len(cfg.data.classes) + j for j, c in enumerate(cfg.data.boundary_classes)}
    scores = {}
    for k, name in enumerate(crop.classes):
        read = read_class_truth(crop, name, grid)
        if read is None:
            continue  # not annotated here: nothing to score against
        truth, inside = read
        if is_instance(name):
            boundary = probs[boundary_of[name]] if name in boundary_of else None
            params = InstanceParams(threshold=th, boundary_threshold=th)
            pred = segment_instances(np.where(inside, probs[k], np.float32(0)), boundary, voxel_size_nm=vs,
                                     params=params)
        else:
            pred = (probs[k] > th) & inside
        s = score_class(pred, truth, label=name, era=era, voxel_size_nm=vs)
        scores[name] = {**s, "num_voxels": int(inside.sum()), "voxel_size": list(vs)}
    return scores


@torch.inference_mode()
def run_validation(model: torch.nn.Module, crops: Sequence[CropSource], cfg: RunConfig, *, device: torch.device,
                   precision: runtime.Precision) -> dict[str, Any]:
    """Predict and score the validation crops; returns overall, per-class and per-crop scores with the era.

    Raises:
        ValueError: `cfg.val.metric` names no registered era.
    """
    get_era(cfg.val.metric)  # fail before predicting
    was_training = model.training
    model.eval()
    crop_scores = {}
    try:
        for crop in list(crops)[: cfg.val.max_crops]:
            grid = crop_grid(crop, cfg.data.voxel_size_nm)
            probs = predict_volume(model, crop.em(), grid, patch_vox=cfg.data.patch_shape_vox,
                                   num_outputs=cfg.data.num_target_channels, device=device, precision=precision,
                                   overlap=cfg.val.overlap, batch_size=cfg.val.batch_size,
                                   channels_last=cfg.train.channels_last, pad_value=cfg.data.em_pad_value)
            crop_scores[crop.name] = score_crop(crop, probs, grid, cfg)
    finally:
        model.train(was_training)
    combined = combine(crop_scores, cfg.val.metric)
    labels = combined["label_scores"]
    return {"metric": cfg.val.metric, **{k: v for k, v in combined.items() if k != "label_scores"},
            "class_scores": {c: s.get("combined_score", s.get("iou")) for c, s in labels.items()},
            "label_scores": labels, "crop_scores": crop_scores}
