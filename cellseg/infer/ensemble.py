"""Weighted ensembles of probability predictions: several `PredictionStore`s in, one out (`cellseg ensemble`).

Per crop, and per channel, the ensemble is the weighted mean of the members' probabilities on one
common grid (probabilities are averaged, never labels):

1. **Members**: ≥ 2 probability stores (`cellseg predict` outputs), possibly from models trained at
   different voxel sizes (a 2D model at 4 nm, a 3D model at 8 nm) and so on different grids.
2. **Channels**: the classes of the members must agree. With `allow_partial`, the union of the classes
   is written and each class is the mean over the members that have it (a specialist model adds its
   classes; its weight is renormalised among those members). A class's boundary channel
   (`<cls>_boundary`) is averaged like the class when every member with the class has it; otherwise it
   is dropped with a warning (with `allow_partial`: averaged over the members that have it).
3. **Crops**: only crops present (complete) in every member are written; the others are named in a
   log line with the members that lack them.
4. **Grid** (per crop): `finest` (default) takes the grid of the member with the smallest voxel volume
   (the first such member on ties), `first` the first member's grid. Every member is read onto it in
   world coordinates with `area` resampling: linear interpolation when up-sampling, the overlap-weighted
   mean when down-sampling (`cellseg.data.resample`). Voxels outside a member's own grid are NaN for that
   member and the mean is renormalised over the members that cover the voxel.
5. **Weights** (per channel, over members, summing to 1): `uniform`, explicit `w1,w2,...` (the same for
   every class), `auto` (per class, fitted on validation crops against the challenge metric: see
   `cellseg.infer.ensemble_fit`) or a `weights.json` written by an earlier ensemble (fit on the
   validation predictions, apply to the test predictions of the same members).
6. **Output**: a probability store (float16, or uint8 with `quantise`), written under a temporary name
   and renamed into place only when every crop is done, so an interrupted run leaves nothing behind;
   an existing output is replaced only with `overwrite`. With `resume` (`cellseg report`) the temporary
   store has a fixed hidden name beside the output (`.NAME.partial`) and is kept when a run is interrupted:
   the next run with the same members, weights and grid adds only the crops it lacks (another one is
   started over). The weights go into the store's provenance
   and into `weights.json` inside the store directory (it travels with the store; zarr ignores it).

The members (rules 1-4: `cellseg.infer.members`) and the weights (rule 5: `cellseg.infer.weights`) have
modules of their own; this one is the command (rule 6).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cellseg import __version__
from cellseg.config.inference import EnsembleConfig
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import CropWriter, PredictionStore, grid_to_json, quantise
from cellseg.data.write import atomic_dir, check_replaceable, replace_dir
from cellseg.infer.members import (
    RESAMPLING,
    ChannelPlan,
    GridChoice,
    common_crops,
    ensemble_grid,
    member_summary,
    open_members,
    parallel_channels,
    plan_channels,
    read_on_grid,
    weighted_mean,
)
from cellseg.infer.weights import (
    WEIGHTS_FILE,
    Weights,
    explicit_weights,
    parse_weights,
    uniform_weights,
    weights_from_file,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnsembleResult:
    """What `ensemble` wrote."""

    store: PredictionStore
    weights: Weights
    crops: tuple[str, ...]
    skipped: Mapping[str, list[str]]


def ensemble_channel(stores: Sequence[PredictionStore], crop: str, channel: str, plan: ChannelPlan,
                     weights: Weights, target: Grid) -> np.ndarray:
    """One output channel of one crop on the common grid `target` (members read one at a time)."""
    w = weights.per_channel[channel]
    members = ((read_on_grid(stores[i], crop, channel, target), w[i]) for i in plan.members_of[channel] if w[i] > 0)
    return weighted_mean(members, where=f"{crop}/{channel}")


def _data_root(stores: Sequence[PredictionStore]) -> str | None:
    roots = {str(s.provenance["data_root"]) for s in stores if s.provenance.get("data_root")}
    return roots.pop() if len(roots) == 1 else None


def _provenance(stores: Sequence[PredictionStore], weights: Weights, grid: GridChoice, plan: ChannelPlan, *,
                uint8: bool) -> dict[str, Any]:
    provenance: dict[str, Any] = {
        "ensemble": {"members": member_summary(stores), "grid": grid, "resampling": RESAMPLING,
                     "weights": weights.to_json(), "members_of": {c: list(m) for c, m in plan.members_of.items()},
                     "dtype": "uint8" if uint8 else "float16"},
        "member_provenance": [dict(s.provenance) for s in stores],
        "cellseg_version": __version__,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    root = _data_root(stores)
    if root:
        provenance["data_root"] = root  # lets `postprocess --tune-on` and `ensemble` find the truth again
    return provenance


def write_ensemble(stores: Sequence[PredictionStore], out: str | os.PathLike[str], plan: ChannelPlan,
                   weights: Weights, crops: Sequence[str], *, grid: GridChoice = "finest", uint8: bool = False,
                   overwrite: bool = False, resume: bool = False, progress: bool = False) -> PredictionStore:
    """Write the ensemble of `crops` to `out` atomically (the whole store appears at once, or nothing); with
    `resume`, the crops an interrupted run with the same members, weights and grid finished are kept (rule 6).

    Raises:
        FileExistsError: `out` exists and `overwrite` is not given.
    """
    out = Path(out)
    provenance = _provenance(stores, weights, grid, plan, uint8=uint8)
    doc = {**weights.to_json(), "members": member_summary(stores), "grid": grid, "crops": list(crops)}
    if not resume:
        with atomic_dir(out, overwrite=overwrite, kind="probabilities store") as tmp:
            store = PredictionStore.create(tmp, kind="probabilities", channels=plan.channels,
                                           instance_channels=plan.instance_channels, provenance=provenance)
            _write_crops(store, stores, plan, weights, crops, grid=grid, uint8=uint8, progress=progress)
            (tmp / WEIGHTS_FILE).write_text(json.dumps(doc, indent=2))
        return PredictionStore.open(out)
    if out.exists() or out.is_symlink():
        check_replaceable(out, overwrite=overwrite, kind="probabilities store")
    partial = out.with_name(f".{out.name}.partial")
    store = _reopen_partial(partial, plan, provenance)
    done = [c for c in crops if c in store]
    if done:
        log.info("%s: resuming, %d of %d crops written by an interrupted run", out, len(done), len(crops))
    _write_crops(store, stores, plan, weights, [c for c in crops if c not in done], grid=grid, uint8=uint8,
                 progress=progress)
    (partial / WEIGHTS_FILE).write_text(json.dumps(doc, indent=2))
    replace_dir(partial, out)
    return PredictionStore.open(out)


def _reopen_partial(partial: Path, plan: ChannelPlan, provenance: Mapping[str, Any]) -> PredictionStore:
    """The hidden store an interrupted `write_ensemble(resume=True)` left, when made with the same members, weights,
    grid and storage (its finished crops are kept); else a new one in its place."""
    wanted = json.loads(json.dumps(provenance["ensemble"]))  # as stored: lists for tuples
    if partial.exists():
        try:
            same = PredictionStore.open(partial).provenance.get("ensemble") == wanted
        except (OSError, ValueError):
            same = False
        if not same:
            log.info("%s: made with other members, weights or grid: started over", partial)
            shutil.rmtree(partial)
    return PredictionStore.create(partial, kind="probabilities", channels=plan.channels,
                                  instance_channels=plan.instance_channels, provenance=dict(provenance),
                                  resume=partial.exists())


def _write_crops(store: PredictionStore, stores: Sequence[PredictionStore], plan: ChannelPlan, weights: Weights,
                 crops: Sequence[str], *, grid: GridChoice, uint8: bool, progress: bool) -> None:
    """Each crop's ensemble into `store`, committed crop by crop."""
    from tqdm import tqdm

    for crop in tqdm(crops, desc="ensemble", unit="crop", disable=not progress, leave=False):
        target, source = ensemble_grid(stores, crop, grid)
        held = [set(s.crop_channels(crop)) for s in stores]
        channels = [c for c in plan.channels if all(c in held[i] for i in plan.members_of[c])]
        writer = store.crop_writer(crop, target, channels=channels)  # a test crop: what every member holds

        def one(channel: str, writer: CropWriter = writer, target: Grid = target, crop: str = crop) -> None:
            probs = ensemble_channel(stores, crop, channel, plan, weights, target)
            writer.write(channel, quantise(probs) if uint8 else probs)

        # A few channels at a time (memory-bounded), each read member by member: crops of any size.
        with ThreadPoolExecutor(parallel_channels(math.prod(target.shape_vox))) as pool:
            list(pool.map(one, channels))
        attrs = {k: v for k, v in stores[source].crop_attrs(crop).items() if k != "grid"}
        attrs["ensemble"] = {"grid_from": str(stores[source].path),
                             "member_grids": [grid_to_json(s.grid(crop)) for s in stores]}
        writer.commit(attrs)
        log.info("%s: %s voxels at %s nm from %d members", crop, "x".join(map(str, target.shape_vox)),
                 "x".join(f"{v:g}" for v in target.voxel_size_nm), len(stores))


def ensemble(config: EnsembleConfig, out: str | os.PathLike[str], *, uint8: bool = False, overwrite: bool = False,
             resume: bool = False, progress: bool = False) -> EnsembleResult:
    """Ensemble member prediction stores into `out` (the steps are in the module docstring).

    Args:
        config: the members (probability stores, in a fixed order: explicit weights and weight files follow it),
            the weights ("uniform", "auto", one per member, or the path of a `weights.json`), the grid ("finest"
            or "first", per crop), `allow_partial` (classes that only some members have) and, for "auto", the
            fit (`config.fit`: era, shrinkage, instance scoring, device, truth root and crops); `routes` are
            for `predict-ensemble` and refused here.
        out: the output store.
        uint8: store uint8-quantised probabilities instead of float16.
        overwrite: replace an existing `out`.
        resume: keep the crops an interrupted run with the same members, weights and grid wrote (rule 6).
        progress: show progress bars.

    Raises:
        FileExistsError: `out` exists without `overwrite` (checked before any work).
        ValueError: incompatible members, no common crop, bad weights, or no validation data for `auto`.

    Example:
        >>> ensemble(EnsembleConfig(members=("unet3d.zarr", "unet2d.zarr"), weights=(3, 1)), "ens.zarr")
    """
    out = Path(out)
    members = config.members
    if config.routes:
        raise ValueError("ensemble.routes are for `cellseg predict-ensemble`; `cellseg ensemble` averages "
                         "ensemble.members")
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; pass --overwrite to replace it")
    if any(out.resolve() == Path(m).resolve() for m in members):
        raise ValueError(f"{out}: the output cannot be one of the members")
    stores = open_members(members)
    plan = plan_channels(stores, allow_partial=config.allow_partial)
    crops, skipped = common_crops(stores)
    if not crops:
        raise ValueError(f"no crop is present in every member: {[(str(s.path), s.completed()) for s in stores]}")
    spec = parse_weights(config.weights) if isinstance(config.weights, str) else config.weights
    if spec == "uniform":
        chosen = uniform_weights(plan, len(stores))
    elif spec == "auto":
        from cellseg.infer.ensemble_fit import fit_weights
        from cellseg.infer.fit_crops import validation_entries

        fit = config.fit
        entries = validation_entries(stores, data_root=fit.truth_root, crops=fit.crop_ids(), available=crops)
        chosen = fit_weights(stores, plan, entries, grid=config.grid, options=fit, progress=progress)
    elif isinstance(spec, os.PathLike):
        chosen = weights_from_file(spec, plan, stores)
    else:
        chosen = explicit_weights(plan, list(spec), len(stores))  # type: ignore[arg-type]
    store = write_ensemble(stores, out, plan, chosen, crops, grid=config.grid, uint8=uint8, overwrite=overwrite,
                           resume=resume, progress=progress)
    return EnsembleResult(store=store, weights=chosen, crops=tuple(crops), skipped=skipped)
