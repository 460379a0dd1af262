"""Ensemble weights: per output channel, one value per member, summing to 1 over the members that have the
channel. `uniform`, explicit (`w1,w2,...`, the same for every channel), read back from a `weights.json` written
by an earlier ensemble of the same members, or `auto` (fitted on validation crops: `cellseg.infer.ensemble_fit`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cellseg.data.prediction_store import BOUNDARY_SUFFIX, PredictionStore
from cellseg.infer.members import ChannelPlan
from cellseg.runtime.checkpoint import save_atomic_text

log = logging.getLogger(__name__)

WEIGHT_METHODS: tuple[str, ...] = ("uniform", "auto")
WEIGHTS_FILE = "weights.json"  # inside an ensemble store: its weights and members (zarr ignores it)


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


def channel_weights(raw: Sequence[float], plan: ChannelPlan, channel: str, num_members: int) -> tuple[float, ...]:
    """`raw` (one weight per member, given for the channel's class) as `channel`'s weights (`normalised` over its
    members). A boundary channel that not every member of its class has (`allow_partial`: another tool's
    probabilities carry none) and whose members all have weight 0 for the class is averaged uniformly over them:
    the class comes from the others, its boundaries are still what splits touching objects."""
    having = plan.members_of[channel]
    cls = channel.removesuffix(BOUNDARY_SUFFIX)
    if channel != cls and sum(float(raw[i]) for i in having) <= 0:
        log.info("%s: the members that have it (%s) have weight 0 for %s; it is averaged uniformly over them",
                 channel, list(having), cls)
        raw = [1.0 if i in having else 0.0 for i in range(num_members)]
    return normalised(raw, having, num_members, what=f"channel {channel}")


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
    return Weights({c: channel_weights(values, plan, c, num_members) for c in plan.channels}, "explicit")


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


def members_in_use(path: str | os.PathLike[str]) -> list[int]:
    """Indices of the members that a weights file (`WEIGHTS_FILE`) gives a positive weight for some channel; the
    others add nothing to any channel of that ensemble."""
    return _in_use(json.loads(Path(path).read_text())["channels"])


def _in_use(channels: Mapping[str, Sequence[float]]) -> list[int]:
    return sorted({i for weights in channels.values() for i, w in enumerate(weights) if w > 0})


def restrict_weights_file(path: str | os.PathLike[str], keep: Sequence[int], out: str | os.PathLike[str]) -> Path:
    """`path`'s weights for the members `keep` (indices, in that order) only, written to `out` (atomically): the
    ensemble of those members' stores with it equals the ensemble of all the stores with `path`.

    Raises:
        ValueError: a member left out has a positive weight for some channel.
    """
    path, out = Path(path), Path(out)
    doc = json.loads(path.read_text())
    dropped = sorted(set(_in_use(doc["channels"])) - set(keep))
    if dropped:
        raise ValueError(f"{path}: members {dropped} have positive weights; they cannot be left out")
    restricted = {**doc, "channels": {c: [w[i] for i in keep] for c, w in doc["channels"].items()},
                  "members": [doc["members"][i] for i in keep], "restricted_from": str(path)}
    save_atomic_text(json.dumps(restricted, indent=2) + "\n", out)
    return out
