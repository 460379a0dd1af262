"""The members of an ensemble: probability stores (`cellseg predict` outputs) read onto one grid and averaged.

- `open_members`: ≥ 2 distinct probability stores;
- `plan_channels`: the channels written and the members of each (the rules of `cellseg.infer.ensemble`);
- `common_crops`: the crops every member holds complete;
- `ensemble_grid`, `read_on_grid`: a crop's common grid, and each member read onto it in world coordinates
  (`area` resampling; NaN outside the member's own grid);
- `weighted_mean`: Σ w·p / Σ w over the members covering each voxel, in float32.

Array legend: `probs_ZYX` one channel of one crop; `M` members.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cellseg.data.crops import crop_sort_key
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import BOUNDARY_SUFFIX, QUANTUM, PredictionStore, boundary_channel
from cellseg.pool import usable_cores

log = logging.getLogger(__name__)

GridChoice = Literal["first", "finest"]
GRID_CHOICES: tuple[str, ...] = ("first", "finest")
RESAMPLING = "area"  # linear when up-sampling, overlap-weighted mean when down-sampling
CHANNEL_MEMORY_BYTES = 32 * 2**30  # host memory the channels processed at once may use
MAX_CHANNEL_THREADS = 16  # beyond this, reading and writing zarr chunks stops scaling


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
    """Decide the output channels (rule 2 of `cellseg.infer.ensemble`).

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


def ensemble_grid(stores: Sequence[PredictionStore], crop: str, choice: GridChoice = "finest") -> tuple[Grid, int]:
    """The crop's common grid and the index of the member it comes from (rule 4 of `cellseg.infer.ensemble`)."""
    if choice not in GRID_CHOICES:
        raise ValueError(f"grid choice {choice!r} is not one of {GRID_CHOICES}")
    grids = [s.grid(crop) for s in stores]
    if choice == "first":
        return grids[0], 0
    index = min(range(len(grids)), key=lambda i: float(np.prod(grids[i].voxel_size_nm)))  # min keeps the first tie
    return grids[index], index


def read_on_grid(store: PredictionStore, crop: str, channel: str, grid: Grid) -> np.ndarray:
    """One member channel on `grid` as float32 probabilities `(z, y, x)`, NaN outside the member's own grid.

    NaN marks "not covered" only outside the member's grid: a NaN or infinite value stored inside it is refused.

    Raises:
        ValueError: the stored array is neither float nor uint8-quantised, or holds a NaN or an infinity
            (naming the member store, crop and channel).
    """
    if store.grid(crop) == grid:  # the member's own grid (the usual case): no resampling
        return check_finite(store.read(crop, channel), store=store, crop=crop, channel=channel)
    image = store.image(crop, channel)
    level = image.levels[0]
    if level.dtype != np.uint8 and level.dtype.kind != "f":
        raise ValueError(f"{store.path}/{crop}/{channel}: dtype {level.dtype} is not a probability dtype "
                         "(float or uint8-quantised)")
    if level.dtype.kind == "f":  # uint8 cannot hold a NaN; a float one is checked on its own grid, before padding
        check_finite(store.read(crop, channel), store=store, crop=crop, channel=channel)
    probs_ZYX = image.read(**grid.read_kwargs(), interpolation=RESAMPLING, pad_value=np.nan, level=level.path,
                           dtype=np.float32)
    if level.dtype == np.uint8:
        probs_ZYX /= np.float32(QUANTUM)  # de-quantise: uint8 holds round(255 p)
    return probs_ZYX


def check_finite(probs_ZYX: np.ndarray, *, store: PredictionStore, crop: str, channel: str) -> np.ndarray:
    """`probs_ZYX` (one member channel on its own grid) when every value is finite.

    Raises:
        ValueError: naming the member store, crop and channel, the count of NaN and infinite voxels and the first.
    """
    finite = np.isfinite(probs_ZYX)
    if finite.all():
        return probs_ZYX
    nan, inf = int(np.count_nonzero(np.isnan(probs_ZYX))), int(np.count_nonzero(np.isinf(probs_ZYX)))
    first = tuple(int(i) for i in np.argwhere(~finite)[0])
    raise ValueError(f"{store.path}/{crop}/{channel}: member store holds {nan} NaN and {inf} infinite probabilities "
                     f"(first at voxel (z, y, x) = {first}); an ensemble refuses non-finite members: predict that "
                     "member again")


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
    return max(1, min(usable_cores(), MAX_CHANNEL_THREADS, CHANNEL_MEMORY_BYTES // per_channel))


def member_summary(stores: Sequence[PredictionStore]) -> list[dict[str, Any]]:
    """Path, run directory and channels of each member (recorded with the weights)."""
    return [{"path": str(s.path), "run_dir": s.provenance.get("run_dir"), "channels": list(s.channels)}
            for s in stores]
