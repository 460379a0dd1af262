"""Typed configuration of the inference steps, one section each: how a trained run predicts (`InferConfig`),
how members are averaged (`EnsembleConfig`, with `FitConfig` for fitted weights and `RouteConfig` for members
routed to crops by voxel size) and how probabilities become a segmentation (`PostprocessConfig`).

Same rules as the training schema (`cellseg.config.schema`): frozen, keyword-only dataclasses whose
`__post_init__` raises `ValueError` naming the dotted key and the valid choices. YAML recipes under
`configs/infer/`, `configs/ensemble/` and `configs/postprocess/` set them; the commands' root configs that
compose these sections are in `cellseg.config.jobs`; `docs/config.md` is generated from both modules.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from cellseg.config.fields import _check, check_era_name, era_field

STORE_CHUNK_VOX = 64  # the prediction store's chunk edge (`cellseg.data.write.DEFAULT_CHUNK`)
WEIGHT_METHODS = ("uniform", "auto")
INSTANCE_SCORES: tuple[str, ...] = ("iou", "metric")  # what instance classes are fitted on (`FitConfig`)
SCORE_GRIDS: tuple[str, ...] = ("annotation", "ensemble")  # where the fit scores a class (`FitConfig`)
BAND_RTOL = 1e-3  # a crop's voxel edge within 0.1% of a band's bound counts as on it (manifests print 2 decimals)
_CUDA_DEVICE = re.compile(r"cuda(:\d+)?")  # "cuda" or "cuda:N"
_CROP_ID = re.compile(r"(crop)?\d+")  # 12 or crop12


@dataclass(frozen=True, kw_only=True)
class InferConfig:
    """How a trained run predicts crops (`cellseg predict`, `cellseg predict-ensemble`).

    Attributes:
        tta: test-time transforms averaged per tile, at least 1 (`cellseg.infer.tta`): 8 (3D: identity + 7 flip
            combinations; 2D: the 8 in-plane symmetries), 1 (none); more than a model's distinct transforms uses
            them all. `--tta` takes the same numbers.
        overlap: fraction of a tile shared with its neighbour, in [0, 1).
        blend: "gaussian" (tiles weighted towards their centre) or "constant".
        checkpoint: "best", "last" or the path of a checkpoint file of the run.
        batch_size: tiles per sliding-window batch (null: the run's training micro-batch).
        tta_fold: TTA passes per forward, batched together (null: on CUDA the fewest that give 16 Mi tile voxels
            per forward; 1 on CPU).
        device: "auto" (CUDA when available), "cpu" or "cuda".
        axes_2d: 2D models: slice across "z" only, or across "zyx" and average (isotropic voxels only).
        channels: "scored" (a test crop gets only the classes it is scored on and their boundary channels) or
            "all" (every output channel for every crop).
        block_vox: cut a crop into columns of at most this many voxels in y and x (2D over z, y and x: cubic
            blocks); null: as large as host and GPU memory allow.
        compile: torch.compile the model: "auto" (on CUDA, for a job of at least 20 Gvoxels of model input: tiles
            × TTA transforms × tile voxels, where compiling repays its 10-60 s per model;
            `cellseg.infer.run.AUTO_COMPILE_MIN_GVOX`), "on" or "off"; a compiler error falls back to eager.
        uint8: store round(255 p) as uint8 instead of float16.
        overwrite: replace the output store entirely (default: add the missing crops to it).
        data_root: data root to read from instead of the run's `data.root` (null: the run's).
        backend: what runs the network: "torch" (cellseg's model code with the run's or a package's weights),
            or an exported package's "torchscript" or "onnx" graph (`cellseg export`; ONNX Runtime for onnx).
        progress: show progress bars (the commands: on a terminal and without -q only).
    """

    tta: int = 8
    overlap: float = 0.5
    blend: Literal["gaussian", "constant"] = "gaussian"
    checkpoint: str = "best"
    batch_size: int | None = None
    tta_fold: int | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    axes_2d: Literal["z", "zyx"] = "z"
    channels: Literal["scored", "all"] = "scored"
    block_vox: int | None = None
    compile: Literal["auto", "on", "off"] = "auto"
    uint8: bool = False
    overwrite: bool = False
    data_root: str | None = None
    backend: Literal["torch", "torchscript", "onnx"] = "torch"
    progress: bool = True

    def __post_init__(self) -> None:
        _check(self.backend in ("torch", "torchscript", "onnx"),
               f"infer.backend={self.backend!r}: choose 'torch', 'torchscript' or 'onnx'")
        _check(self.tta >= 1, f"infer.tta={self.tta} (--tta {self.tta}): need at least 1 (1 = no test-time "
               "augmentation)")
        _check(0 <= self.overlap < 1, f"infer.overlap={self.overlap} (--overlap {self.overlap}): must be in [0, 1)")
        _check(self.batch_size is None or self.batch_size >= 1,
               f"infer.batch_size={self.batch_size} (--batch-size {self.batch_size}): must be at least 1")
        _check(self.tta_fold is None or (self.tta_fold >= 1 and self.tta % self.tta_fold == 0),
               f"infer.tta_fold={self.tta_fold} (--tta-fold {self.tta_fold}): must divide infer.tta={self.tta}")
        _check(self.blend in ("gaussian", "constant"), f"infer.blend={self.blend!r}: choose 'gaussian' or 'constant'")
        _check(self.block_vox is None or self.block_vox >= 1,
               f"infer.block_vox={self.block_vox} (--block {self.block_vox}): must be a positive number of voxels "
               f"(multiples of {STORE_CHUNK_VOX}, the store's chunk, write whole chunks)")
        _check(self.channels in ("scored", "all"), f"infer.channels={self.channels!r}: choose 'scored' or 'all'")
        _check(self.compile in ("auto", "on", "off"), f"infer.compile={self.compile!r}: choose 'auto', 'on' or 'off'")
        _check(self.axes_2d in ("z", "zyx"), f"infer.axes_2d={self.axes_2d!r}: choose 'z' or 'zyx'")
        _check(self.device in ("auto", "cpu", "cuda"), f"infer.device={self.device!r}: choose 'auto', 'cpu' or 'cuda'")


@dataclass(frozen=True, kw_only=True)
class FitConfig:
    """How `weights: auto` fits per-class weights on validation crops (`cellseg ensemble` only; the method is in
    cellseg/infer/ensemble_fit.py, which takes this object).

    Attributes:
        metric: scoring era of the fit: a registered one (`cellseg.eval.eras`; default 2026-07, the leaderboard's
            reconstructed; 2026 the official code at 6b9ad68, 2025 the challenge era's).
        shrink: shrinkage towards uniform weights with ample validation data, in [0, 1]; fewer than 8 validation
            crops or 10^4 truth voxels of a class shrink it more.
        instance_score: instance classes are fitted on their foreground IoU ("iou") or on the official instance
            score of connected components ("metric", slower).
        threshold: probability threshold of the candidate ensembles, in (0, 1).
        device: where candidate ensembles are mixed and counted: "auto" (CUDA when available), "cpu" or "cuda".
        score_grid: where each class is scored: "annotation" (its label grid, as the leaderboard scores) or
            "ensemble" (the grid the ensemble is written on; cheaper when labels are much finer than the members).
        truth_root: data root with the validation crops' labels (null: the members' provenance).
        crops: crops to fit on: "val" (the validation crops of every member's run) or comma-separated crop ids,
            e.g. "12,34".
    """

    metric: str = era_field()
    shrink: float = 0.5
    instance_score: Literal["iou", "metric"] = "iou"
    threshold: float = 0.5
    device: Literal["auto", "cpu", "cuda"] = "auto"
    score_grid: Literal["annotation", "ensemble"] = "annotation"
    truth_root: str | None = None
    crops: str | int = "val"

    def __post_init__(self) -> None:
        check_era_name(self.metric, "ensemble.fit.metric (--metric)")
        _check(0.0 <= self.shrink <= 1.0, f"ensemble.fit.shrink={self.shrink} (--shrink): must be in [0, 1]")
        _check(self.instance_score in INSTANCE_SCORES,
               f"ensemble.fit.instance_score={self.instance_score!r} (--instance-score): choose 'iou' or 'metric'")
        _check(0.0 < self.threshold < 1.0, f"ensemble.fit.threshold={self.threshold}: must be in (0, 1)")
        _check(self.device in ("auto", "cpu", "cuda"),
               f"ensemble.fit.device={self.device!r} (--device): choose 'auto', 'cpu' or 'cuda'")
        _check(self.score_grid in SCORE_GRIDS,
               f"ensemble.fit.score_grid: score grid {self.score_grid!r} is not one of {SCORE_GRIDS}")
        if self.crops != "val":
            _check_ids(self.crops, "ensemble.fit.crops (--crops)", "'val' or crop ids such as '12,34'")

    def crop_ids(self) -> list[str] | None:
        """The fitting crops as a list of ids (None: the members' validation crops)."""
        return None if self.crops == "val" else _ids(self.crops)


@dataclass(frozen=True, kw_only=True)
class RouteConfig:
    """One voxel-size band of a routed `cellseg predict-ensemble`: the crops whose scale lies in the band are
    predicted by these members only, at the members' own voxel size. A crop's scale is the largest edge (nm) of
    the voxel size of its finest annotation (a test crop's one geometry): 2 for crop 557 at 1.74×2×2 nm, 16 for
    crop 980 at 13.92×16×16 nm.

    Attributes:
        band_nm: (low, high]: the crops whose scale s satisfies low < s ≤ high, in nm; the bands of
            `ensemble.routes` are sorted and do not overlap (gaps are allowed; a crop in one is an error).
        members: `cellseg train` run directories (≥ 1), all at one voxel size, in the order of the weights.
        weights: as `ensemble.weights`, for this band's members: "uniform", one number per member, or a
            weights.json that `cellseg ensemble --weights auto` fitted on validation predictions of these members.

    Example:
        ensemble:
          routes:    # from fine to coarse; configs/ensemble/routed.yaml routes the real test set
            - {band_nm: [0, 4], members: [runs/4nm/unet_3d, runs/4nm/unet_2d]}
            - {band_nm: [4, 16], members: [runs/unet_3d, runs/unet_2d], weights: [2, 1]}
            - {band_nm: [16, 64], members: [runs/32nm/unet_3d], weights: ens_val_32nm.zarr/weights.json}
    """

    band_nm: tuple[float, float]
    members: tuple[str, ...]
    weights: str | tuple[float, ...] = "uniform"

    def __post_init__(self) -> None:
        low, high = self.band_nm
        _check(0 <= low < high, f"ensemble.routes band_nm={list(self.band_nm)}: need 0 <= low < high (nm)")
        _check(len(self.members) >= 1, f"ensemble.routes band {self.label}: no members (run directories)")
        twice = sorted({m for m in self.members if self.members.count(m) > 1})
        _check(not twice, f"ensemble.routes band {self.label}: members listed more than once: {twice}")
        _check(self.weights != "auto", f"ensemble.routes band {self.label}: weights 'auto' fits on validation "
               "predictions (`cellseg ensemble --weights auto`); give the weights.json it writes")
        _check_weights(self.weights, f"ensemble.routes band {self.label}: weights")

    @property
    def label(self) -> str:
        """The band as text: "(8, 32] nm"."""
        return f"({self.band_nm[0]:g}, {self.band_nm[1]:g}] nm"

    def holds(self, scale_nm: float) -> bool:
        """Whether a crop of this scale (nm) falls in the band (bounds within `BAND_RTOL`)."""
        low, high = self.band_nm
        return low * (1 + BAND_RTOL) < scale_nm <= high * (1 + BAND_RTOL)


def check_routes(routes: Sequence[RouteConfig]) -> None:
    """The bands must be sorted by voxel size and must not overlap.

    Raises:
        ValueError: naming the two bands out of order or overlapping.
    """
    for before, after in itertools.pairwise(routes):
        _check(after.band_nm[0] >= before.band_nm[0],
               f"ensemble.routes: bands unsorted: {after.label} comes after {before.label}; list them from fine "
               "to coarse")
        _check(after.band_nm[0] >= before.band_nm[1],
               f"ensemble.routes: bands {before.label} and {after.label} overlap; a crop must fall in one band")


@dataclass(frozen=True, kw_only=True)
class EnsembleConfig:
    """Which members are averaged and with which weights (`cellseg predict-ensemble`, `cellseg ensemble`).

    Attributes:
        members: in the order of the weights: `cellseg train` run directories for `predict-ensemble`, probability
            stores (`cellseg predict` outputs) for `ensemble`; given on the command line, they replace these.
        weights: "uniform"; "auto" (per class, fitted on validation crops: `ensemble` only); one number per member
            (normalised), e.g. [3, 1]; or the path of a weights.json written by an earlier `cellseg ensemble`
            (fit on validation predictions, apply to the test predictions of the same members).
        grid: `ensemble` only: the common grid of a crop, the finest member's ("finest") or the first member's
            ("first"); `predict-ensemble` members share one voxel size.
        allow_partial: members may have different classes: each class averages the members that have it
            (with `routes`: within each band).
        fit: how "auto" weights are fitted.
        routes: `predict-ensemble` only (`ensemble` leaves them out), instead of `members` and `weights`:
            voxel-size bands, each with its own members and weights (`RouteConfig`); every crop is predicted once,
            by the band of its scale, and all crops land in one store, each on its band's grid.
        decisions: `predict-ensemble` and `predict-volume`: a decisions.json written by `cellseg decide`, instead of
            `weights` and the TTA setting: per class the members' weights and TTA on or off as decided on the
            tuning crops; `members`, when given, must be the file's runs (they default to them).
    """

    members: tuple[str, ...] = ()
    weights: str | tuple[float, ...] = "uniform"
    grid: Literal["finest", "first"] = "finest"
    allow_partial: bool = False
    fit: FitConfig = field(default_factory=FitConfig)
    routes: tuple[RouteConfig, ...] = ()
    decisions: str | None = None

    def __post_init__(self) -> None:
        _check_weights(self.weights, "ensemble.weights", " (--weights)")
        _check(self.decisions is None or (self.weights == "uniform" and not self.routes),
               f"ensemble.decisions={self.decisions!r} (--decisions) sets the weights per class: drop "
               "ensemble.weights (--weights) and ensemble.routes")
        _check(self.grid in ("finest", "first"), f"ensemble.grid={self.grid!r} (--grid): choose 'finest' or 'first'")
        check_routes(self.routes)

    def library_weights(self) -> str | list[float]:
        """The weights as the library's `weights=` argument takes them (a list, or the method / file name)."""
        return self.weights if isinstance(self.weights, str) else list(self.weights)


@dataclass(frozen=True, kw_only=True)
class PostprocessConfig:
    """How probabilities become semantic masks and instance ids (`cellseg postprocess`; the algorithm is in
    cellseg/postprocess/instances.py).

    Attributes:
        params: per-class parameter file (JSON) to read; with `tune_on`, the file the tuned parameters are written
            to (null: OUT.params.json next to the output). Neither: the defaults (threshold 0.5, no seed erosion,
            no size filter).
        tune_on: tune every class first on crops with truth in this data root, against the `metric` of the
            challenge (null: no tuning).
        crops: with `tune_on`: the crops to tune on, comma-separated ids ("12,crop34"; null: every crop of the
            store with truth in the data root).
        metric: with `tune_on`: the scoring era to tune for, a registered one (`cellseg.eval.eras`; default
            2026-07, the leaderboard's reconstructed); with `decisions`: the era whose post-processing choice is
            applied.
        device: "cpu" (numpy, cc3d and scipy), "cuda" or "cuda:N" (torch on a GPU; identical output) or "auto"
            (CUDA when available).
        grid: where the segmentation is written: "annotation" (each crop's label grids, e.g. 2 nm: the probability
            interpolated linearly and decoded there, cellseg/postprocess/native.py) or "model" (the probability
            store's grid; `cellseg submit` then upsamples it by nearest neighbour).
        data_root: with grid "annotation": the data root whose manifests and label arrays give the grids (null:
            `tune_on`, else the one the probability store records).
        decisions: a decisions.json written by `cellseg decide`, instead of `params` and `tune_on`: per class the
            tuned parameters or the plain decoding (p > 0.5, 26-connected components), as chosen for `metric`.
    """

    params: str | None = None
    tune_on: str | None = None
    crops: str | int | None = None
    metric: str = era_field()
    device: str = "auto"
    grid: Literal["annotation", "model"] = "annotation"
    data_root: str | None = None
    decisions: str | None = None

    def __post_init__(self) -> None:
        _check(self.decisions is None or (self.params is None and self.tune_on is None),
               f"postprocess.decisions={self.decisions!r} (--decisions) holds the parameters: drop "
               "postprocess.params (--params) and postprocess.tune_on (--tune-on)")
        if self.crops is not None:
            _check_ids(self.crops, "postprocess.crops (--crops)", "crop ids such as '12,crop34'")
        _check(self.crops is None or self.tune_on is not None,
               f"postprocess.crops={self.crops!r} (--crops) selects tuning crops; it needs --tune-on DATA_ROOT "
               "(postprocess.tune_on)")
        check_era_name(self.metric, "postprocess.metric (--metric)")
        _check(self.device in ("auto", "cpu") or _CUDA_DEVICE.fullmatch(self.device) is not None,
               f"postprocess.device={self.device!r} (--device): choose 'auto', 'cpu', 'cuda' or 'cuda:N'")
        _check(self.grid in ("annotation", "model"),
               f"postprocess.grid={self.grid!r} (--grid): choose 'annotation' or 'model'")

    def crop_ids(self) -> list[str] | None:
        """The tuning crops as a list of ids (None: every crop of the store with truth)."""
        return None if self.crops is None else _ids(self.crops)


def _check_weights(weights: str | tuple[float, ...], key: str, flag: str = "") -> None:
    """A method name, a weights.json or one non-negative number per member, not all zero (`flag`: the option
    that sets `key`, named in the message)."""
    if isinstance(weights, str):
        _check(weights in WEIGHT_METHODS or weights.endswith(".json"),
               f"{key}={weights!r}{flag}: choose 'uniform', 'auto', one number per member (a YAML list such as "
               "[3, 1]; --weights 3,1) or a weights.json file")
    else:
        _check(len(weights) > 0 and all(w >= 0 for w in weights) and sum(weights) > 0,
               f"{key}={list(weights)}{flag}: need one non-negative number per member, not all zero")


def _ids(crops: str | int) -> list[str]:
    """Crop ids of a comma-separated selection: "12,crop34" (or 12) → ["12", "crop34"]."""
    return [c.strip() for c in str(crops).split(",") if c.strip()]


def _check_ids(crops: str | int, key: str, expected: str) -> None:
    ids = _ids(crops)
    _check(bool(ids), f"{key} is empty: give {expected}")
    bad = [c for c in ids if not _CROP_ID.fullmatch(c)]
    _check(not bad, f"{key}: {bad[0] if bad else ''!r} is not a crop id (12 or crop12); give {expected}")
