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
   an existing output is replaced only with `overwrite`. The weights go into the store's provenance
   and into `weights.json` inside the store directory (it travels with the store; zarr ignores it).

Array legend: `probs_ZYX` one channel of one crop; `M` members.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from cellseg import __version__
from cellseg.data.crops import crop_sort_key
from cellseg.data.grid import Grid
from cellseg.data.write import atomic_dir
from cellseg.infer.store import (
    BOUNDARY_SUFFIX,
    QUANTUM,
    CropWriter,
    PredictionStore,
    boundary_channel,
    grid_to_json,
    quantise,
)

if TYPE_CHECKING:
    from cellseg.infer.ensemble_fit import FitOptions

log = logging.getLogger(__name__)

GridChoice = Literal["first", "finest"]
GRID_CHOICES: tuple[str, ...] = ("first", "finest")
WEIGHT_METHODS: tuple[str, ...] = ("uniform", "auto")
WEIGHTS_FILE = "weights.json"
RESAMPLING = "area"  # linear when up-sampling, overlap-weighted mean when down-sampling
CHANNEL_MEMORY_BYTES = 32 * 2**30  # host memory the channels processed at once may use
MAX_CHANNEL_THREADS = 16  # beyond this, reading and writing zarr chunks stops scaling


# ----------------------------------------------------------------------------------------------- members


@dataclass(frozen=True)
class ChannelPlan:
    """Which channels the ensemble writes and which members contribute to each.

    Attributes:
        channels: output channels: the classes, then the boundary channels in class order.
        members_of: channel → indices of the members that have it.
        instance_channels: output channels that any member marks as instance classes.
    """

    channels: tuple[str, ...]
    members_of: Mapping[str, tuple[int, ...]]
    instance_channels: tuple[str, ...]

    @property
    def classes(self) -> tuple[str, ...]:
        """The class channels (boundary channels left out)."""
        return tuple(c for c in self.channels if not c.endswith(BOUNDARY_SUFFIX))


def open_members(paths: Sequence[str | os.PathLike[str]]) -> list[PredictionStore]:
    """Open the member stores; they must be distinct probability stores.

    Raises:
        ValueError: fewer than 2 members, a member listed twice, or a segmentation store.
        FileNotFoundError: a member path does not exist.
    """
    if len(paths) < 2:
        raise ValueError(f"an ensemble needs at least 2 member stores, got {len(paths)}: {[str(p) for p in paths]}")
    resolved = [Path(p).resolve() for p in paths]
    twice = sorted({str(p) for p in resolved if resolved.count(p) > 1})
    if twice:
        raise ValueError(f"member stores listed more than once: {twice}")
    stores = [PredictionStore.open(p) for p in paths]
    for store in stores:
        if store.kind != "probabilities":
            raise ValueError(f"{store.path}: holds {store.kind}; an ensemble averages probabilities "
                             "(give it `cellseg predict` outputs, not `cellseg postprocess` ones)")
    return stores


def plan_channels(stores: Sequence[PredictionStore], *, allow_partial: bool = False) -> ChannelPlan:
    """Decide the output channels (rules in the module docstring).

    Raises:
        ValueError: members whose classes differ (without `allow_partial`), naming each store and the
            classes it lacks; members with no class at all.
    """
    class_sets = [set(s.classes) for s in stores]
    for store, classes in zip(stores, class_sets, strict=True):
        if not classes:
            raise ValueError(f"{store.path}: has no class channel (channels: {list(store.channels)})")
    union = list(dict.fromkeys(c for s in stores for c in s.classes))
    common = set.intersection(*class_sets)
    if len(common) < len(union) and not allow_partial:
        lacks = "; ".join(f"{s.path} lacks {sorted(set(union) - cs)}" for s, cs in zip(stores, class_sets, strict=True)
                          if set(union) - cs)
        what = "share no class" if not common else f"share only {sorted(common)}"
        raise ValueError(f"ensemble members have incompatible classes: they {what}: {lacks}. Pass --allow-partial "
                         "to average each class over the members that have it")
    members_of: dict[str, tuple[int, ...]] = {
        c: tuple(i for i, cs in enumerate(class_sets) if c in cs) for c in union}
    boundaries = []
    for c in union:
        having = tuple(i for i in members_of[c] if boundary_channel(c) in stores[i].channels)
        if not having:
            continue
        if having == members_of[c] or allow_partial:
            members_of[boundary_channel(c)] = having
            boundaries.append(boundary_channel(c))
        else:
            without = [str(stores[i].path) for i in members_of[c] if i not in having]
            log.warning("%s: dropped: members %s have class %s but no boundary channel (pass --allow-partial to "
                        "average it over the members that have it)", boundary_channel(c), without, c)
    channels = (*union, *boundaries)
    instance = tuple(c for c in channels if any(c in s.instance_channels for s in stores))
    return ChannelPlan(channels=channels, members_of=members_of, instance_channels=instance)


def common_crops(stores: Sequence[PredictionStore]) -> tuple[list[str], dict[str, list[str]]]:
    """Crops complete in every member (sorted by number) and, for the others, the members lacking them."""
    written = [set(s.completed()) for s in stores]
    common = sorted(set.intersection(*written), key=crop_sort_key)
    skipped = {crop: [str(s.path) for s, w in zip(stores, written, strict=True) if crop not in w]
               for crop in sorted(set.union(*written) - set(common), key=crop_sort_key)}
    for crop, lacking in skipped.items():
        log.warning("%s: skipped: not in every member (missing from %s)", crop, ", ".join(lacking))
    return common, skipped


# -------------------------------------------------------------------------------------------- resampling


def ensemble_grid(stores: Sequence[PredictionStore], crop: str, choice: GridChoice = "finest") -> tuple[Grid, int]:
    """The crop's common grid and the index of the member it comes from (rule in the module docstring)."""
    if choice not in GRID_CHOICES:
        raise ValueError(f"grid choice {choice!r} is not one of {GRID_CHOICES}")
    grids = [s.grid(crop) for s in stores]
    if choice == "first":
        return grids[0], 0
    index = min(range(len(grids)), key=lambda i: float(np.prod(grids[i].voxel_size_nm)))  # min keeps the first tie
    return grids[index], index


def read_on_grid(store: PredictionStore, crop: str, channel: str, grid: Grid) -> np.ndarray:
    """One member channel on `grid` as float32 probabilities `(z, y, x)`, NaN outside the member's own grid.

    Raises:
        ValueError: the stored array is neither float nor uint8-quantised.
    """
    if store.grid(crop) == grid:  # the member's own grid (the usual case): no resampling
        return store.read(crop, channel)
    image = store.image(crop, channel)
    level = image.levels[0]
    if level.dtype != np.uint8 and level.dtype.kind != "f":
        raise ValueError(f"{store.path}/{crop}/{channel}: dtype {level.dtype} is not a probability dtype "
                         "(float or uint8-quantised)")
    probs_ZYX = image.read(**grid.read_kwargs(), interpolation=RESAMPLING, pad_value=np.nan, level=level.path,
                           dtype=np.float32)
    if level.dtype == np.uint8:
        probs_ZYX /= np.float32(QUANTUM)  # de-quantise: uint8 holds round(255 p)
    return probs_ZYX


def weighted_mean(members: Iterable[tuple[np.ndarray, float]], *, where: str) -> np.ndarray:
    """Σ w·p / Σ w over the members covering each voxel (NaN = not covered); members with w = 0 are skipped.
    Members are consumed one at a time (and may be overwritten): memory stays at two or three volumes.

    Raises:
        ValueError: voxels that no member with a positive weight covers (`where` names the crop/channel).
    """
    acc: np.ndarray | None = None
    # a float32 scalar while every member covers every voxel (the usual case); float32 as `cellseg.infer.fused`
    total: np.ndarray | np.float32 = np.float32(0.0)
    for probs_ZYX, weight in members:
        if weight <= 0:
            continue
        w = np.float32(weight)
        missing = np.isnan(probs_ZYX)
        if acc is None:
            acc = np.zeros(probs_ZYX.shape, np.float32)
        if missing.any():
            if not isinstance(total, np.ndarray):
                total = np.full(probs_ZYX.shape, total, np.float32)
            acc += w * np.where(missing, np.float32(0), probs_ZYX)
            total += w * ~missing
        else:
            acc += np.multiply(probs_ZYX, w, out=probs_ZYX)
            total += w
    if acc is None:
        raise ValueError(f"{where}: no member has a positive weight")
    uncovered = int(np.count_nonzero(total <= 0))
    if uncovered:
        raise ValueError(f"{where}: {uncovered} voxels are covered by no member with a positive weight")
    acc /= total
    return np.clip(acc, 0.0, 1.0, out=acc)  # rounding can step a hair outside [0, 1]


def parallel_channels(voxels: int, volumes_per_channel: int = 3) -> int:
    """Threads that may process channels of one crop at once: the CPUs, limited so that their float32 volumes
    (`volumes_per_channel` each) stay within `CHANNEL_MEMORY_BYTES` (numpy and zarr release the GIL)."""
    per_channel = max(1, voxels * 4 * volumes_per_channel)
    return max(1, min(os.cpu_count() or 1, MAX_CHANNEL_THREADS, CHANNEL_MEMORY_BYTES // per_channel))


# ------------------------------------------------------------------------------------------------ weights


@dataclass(frozen=True)
class Weights:
    """Ensemble weights per output channel (a value per member, 0 for members without the channel).

    Attributes:
        per_channel: channel → weights over all members, summing to 1 over the members that have it.
        method: "uniform", "explicit", "auto" or "file".
        report: how they were obtained (the fit's metric, crops, per-class scores and shrinkage for "auto").
    """

    per_channel: Mapping[str, tuple[float, ...]]
    method: str
    report: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form (also what `weights.json` holds under "channels")."""
        return {"method": self.method, "channels": {c: list(w) for c, w in self.per_channel.items()},
                **({"fit": dict(self.report)} if self.report else {})}


def normalised(raw: Sequence[float], having: Sequence[int], num_members: int, *, what: str) -> tuple[float, ...]:
    """Weights over all members: `raw` restricted to `having` and rescaled to sum 1 there, 0 elsewhere.

    Raises:
        ValueError: negative or non-finite weights, or none positive among `having`.
    """
    raw = [float(v) for v in raw]
    if any(not np.isfinite(v) or v < 0 for v in raw):
        raise ValueError(f"{what}: weights must be finite and non-negative, got {raw}")
    total = sum(raw[i] for i in having)
    if total <= 0:
        raise ValueError(f"{what}: the members that have it (indices {list(having)}) all have weight 0")
    return tuple(raw[i] / total if i in having else 0.0 for i in range(num_members))


def uniform_weights(plan: ChannelPlan, num_members: int) -> Weights:
    """Equal weights over the members of each channel."""
    return Weights({c: normalised([1.0] * num_members, plan.members_of[c], num_members, what=c)
                    for c in plan.channels}, "uniform")


def explicit_weights(plan: ChannelPlan, values: Sequence[float], num_members: int) -> Weights:
    """The same user-given weights for every channel (renormalised over the members of each channel).

    Raises:
        ValueError: not one weight per member, or invalid weights.
    """
    if len(values) != num_members:
        raise ValueError(f"--weights gives {len(values)} values for {num_members} member stores")
    return Weights({c: normalised(values, plan.members_of[c], num_members, what=f"channel {c}")
                    for c in plan.channels}, "explicit")


def weights_from_file(path: str | os.PathLike[str], plan: ChannelPlan, stores: Sequence[PredictionStore]) -> Weights:
    """Weights saved by an earlier ensemble of the same members (same order), e.g. fitted on validation crops.

    Raises:
        ValueError: the file is not a weights file, has another number of members, or lacks a channel.
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
        channels, members = doc["channels"], doc["members"]
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not an ensemble weights file (needs 'channels' and 'members'): {err}") from err
    if len(members) != len(stores):
        raise ValueError(f"{path}: weights for {len(members)} members, but {len(stores)} member stores were given")
    for i, (saved, store) in enumerate(zip(members, stores, strict=True)):
        run_then, run_now = saved.get("run_dir"), store.provenance.get("run_dir")
        if run_then and run_now and Path(run_then) != Path(run_now):
            log.warning("member %d: %s comes from run %s, but the weights in %s were fitted for run %s; members "
                        "must be given in the same order", i + 1, store.path, run_now, path, run_then)
    missing = [c for c in plan.channels if c not in channels]
    if missing:
        raise ValueError(f"{path}: no weights for channels {missing} (it has {sorted(channels)})")
    per_channel = {c: normalised(channels[c], plan.members_of[c], len(stores), what=f"{path}: channel {c}")
                   for c in plan.channels}
    return Weights(per_channel, "file", {"source": str(path), "fitted_as": doc.get("method")})


def parse_weights(spec: str) -> str | list[float] | Path:
    """`--weights` value → "uniform" | "auto" | a list of floats | a weights.json path.

    Raises:
        ValueError: a value that is none of these.
    """
    if spec in WEIGHT_METHODS:
        return spec
    if spec.endswith(".json"):
        return Path(spec)
    try:
        return [float(v) for v in spec.split(",")]
    except ValueError:
        raise ValueError(f"--weights {spec!r}: expected 'uniform', 'auto', comma-separated numbers (one per "
                         "member) or a weights.json file") from None


# ------------------------------------------------------------------------------------------------- writing


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


def member_summary(stores: Sequence[PredictionStore]) -> list[dict[str, Any]]:
    """Path, run directory and channels of each member (recorded with the weights)."""
    return [{"path": str(s.path), "run_dir": s.provenance.get("run_dir"), "channels": list(s.channels)}
            for s in stores]


def _data_root(stores: Sequence[PredictionStore]) -> str | None:
    roots = {str(s.provenance["data_root"]) for s in stores if s.provenance.get("data_root")}
    return roots.pop() if len(roots) == 1 else None


def _provenance(stores: Sequence[PredictionStore], weights: Weights, grid: GridChoice, plan: ChannelPlan
                ) -> dict[str, Any]:
    provenance: dict[str, Any] = {
        "ensemble": {"members": member_summary(stores), "grid": grid, "resampling": RESAMPLING,
                     "weights": weights.to_json(), "members_of": {c: list(m) for c, m in plan.members_of.items()}},
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
                   overwrite: bool = False, progress: bool = False) -> PredictionStore:
    """Write the ensemble of `crops` to `out` atomically (the whole store appears at once, or nothing).

    Raises:
        FileExistsError: `out` exists and `overwrite` is not given.
    """
    from tqdm import tqdm

    out = Path(out)
    provenance = _provenance(stores, weights, grid, plan)
    doc = {**weights.to_json(), "members": member_summary(stores), "grid": grid, "crops": list(crops)}
    with atomic_dir(out, overwrite=overwrite) as tmp:
        store = PredictionStore.create(tmp, kind="probabilities", channels=plan.channels,
                                       instance_channels=plan.instance_channels, provenance=provenance)
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
        (tmp / WEIGHTS_FILE).write_text(json.dumps(doc, indent=2))
    return PredictionStore.open(out)


def ensemble(members: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *,
             weights: str | Sequence[float] | os.PathLike[str] = "uniform", grid: GridChoice = "finest",
             allow_partial: bool = False, truth_root: str | os.PathLike[str] | None = None,
             val_crops: Sequence[str] | None = None, fit: FitOptions | None = None, uint8: bool = False,
             overwrite: bool = False, progress: bool = False) -> EnsembleResult:
    """Ensemble member prediction stores into `out` (the steps are in the module docstring).

    Args:
        members: probability stores, in a fixed order (explicit weights and weight files follow it).
        out: the output store.
        weights: "uniform", "auto", one weight per member, or the path of a `weights.json`.
        grid: "finest" or "first" (per crop).
        allow_partial: allow classes that only some members have.
        truth_root: data root with the validation crops' labels (`auto`); default: the members' provenance.
        val_crops: crops to fit on (`auto`): names or ids; default: the validation crops of the members' runs.
        fit: `ensemble_fit.FitOptions` for `auto` (metric era, shrinkage, instance scoring, device).
        uint8: store uint8-quantised probabilities instead of float16.
        overwrite: replace an existing `out`.
        progress: show progress bars.

    Raises:
        FileExistsError: `out` exists without `overwrite` (checked before any work).
        ValueError: incompatible members, no common crop, bad weights, or no validation data for `auto`.

    Example:
        >>> ensemble(["unet3d.zarr", "unet2d.zarr"], "ens.zarr", weights="auto", truth_root="data/")
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; pass --overwrite to replace it")
    if any(out.resolve() == Path(m).resolve() for m in members):
        raise ValueError(f"{out}: the output cannot be one of the members")
    stores = open_members(members)
    plan = plan_channels(stores, allow_partial=allow_partial)
    crops, skipped = common_crops(stores)
    if not crops:
        raise ValueError(f"no crop is present in every member: {[(str(s.path), s.completed()) for s in stores]}")
    spec = parse_weights(weights) if isinstance(weights, str) else weights
    if spec == "uniform":
        chosen = uniform_weights(plan, len(stores))
    elif spec == "auto":
        from cellseg.infer.ensemble_fit import FitOptions, fit_weights
        from cellseg.infer.fit_crops import validation_entries

        options = fit or FitOptions()
        entries = validation_entries(stores, data_root=truth_root, crops=val_crops, available=crops)
        chosen = fit_weights(stores, plan, entries, grid=grid, options=options, progress=progress)
    elif isinstance(spec, os.PathLike):
        chosen = weights_from_file(spec, plan, stores)
    else:
        chosen = explicit_weights(plan, list(spec), len(stores))  # type: ignore[arg-type]
    store = write_ensemble(stores, out, plan, chosen, crops, grid=grid, uint8=uint8, overwrite=overwrite,
                           progress=progress)
    return EnsembleResult(store=store, weights=chosen, crops=tuple(crops), skipped=skipped)
