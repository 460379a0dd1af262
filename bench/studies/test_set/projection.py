"""The projection: minutes per stage on the real 2026 test crops, under every policy of `layout.POLICIES`, from
the measured stages' steady-state rates and cost models."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bench.studies.test_set.layout import (
    BIG_CROP_SHARE,
    DOWNSTREAM,
    GOAL_MINUTES,
    H200_BYTES,
    LOW_OVERLAP,
    POLICIES,
    num_arrays,
    real_volumes,
    scored_count,
    submitted_voxels,
)
from cellseg.data.crops import Crop


def count_model_tiles(crops: Sequence[tuple[Sequence[int], int]], patch_vox: Sequence[int], overlap: float,
                      device: str, gpu_bytes: int | None = None) -> int:
    """Sliding-window tiles `predict_run` runs over crops given as (shape, channels): per column of
    `plan_crop` (what memory on `device`, a GPU of `gpu_bytes`, allows for that many channels), with context."""
    import torch

    from cellseg.infer.crop_plan import plan_crop
    from cellseg.infer.tiling import count_tiles

    dev = torch.device(device)
    return sum(count_tiles(n, patch_vox, overlap) for shape, k in crops
               for _, n in plan_crop(shape, k, patch_vox, ("z",), dev, gpu_bytes=gpu_bytes).blocks)


def project_predict(measured: Mapping[str, Any], real: Mapping[int, Crop], policy: str) -> dict[str, Any]:
    """One model's `predict_run` over the real test crops: load + compile (the warm-up predict) + tiles × the
    steady-state seconds per tile + channel-voxels written × the steady-state write cost."""
    volumes = real_volumes(real, policy)
    crops = [(v["shape_vox"], scored_count(measured["channels"], real[k])) for k, v in volumes.items()]
    voxels = sum(v["voxels"] for v in volumes.values())
    channel_voxels = sum(math.prod(shape) * k for shape, k in crops)
    overlap = LOW_OVERLAP if policy == "max8_ov25" else measured["overlap"]
    gpu_bytes = measured.get("gpu_total_bytes", H200_BYTES if measured["device"] == "cuda" else None)
    tiles = count_model_tiles(crops, measured["patch_shape_vox"], overlap, measured["device"], gpu_bytes)
    steady = measured["steady"]
    seconds = (measured["load_seconds"] + measured.get("warmup_seconds", 0.0) + tiles * steady["seconds_per_tile"]
               + channel_voxels * steady["write_seconds_per_channel_voxel"])
    return {"voxels": voxels, "channel_voxels": channel_voxels, "tiles": tiles, "seconds": seconds,
            "seconds_at_synthetic_rate": tiles * measured["compute_seconds"] / measured["tiles"],
            "bytes": measured["bytes"] * channel_voxels / max(1, measured.get("channel_voxels", measured["voxels"]))}


def project_fused(measured: Mapping[str, Any], real: Mapping[int, Crop], policy: str) -> dict[str, Any] | None:
    """`predict_ensemble` over the real test crops: its load and warm-up + every member's tiles × its steady-state
    seconds per tile + the ensemble's channel-voxels written once × the measured write cost. None while a member
    has no steady-state rate (`--steady`)."""
    members = measured["members"]
    if any("steady" not in m for m in members.values()):
        return None
    union = list(dict.fromkeys(c for m in members.values() for c in m["channels"]))
    volumes = real_volumes(real, policy)
    crops = [(v["shape_vox"], scored_count(union, real[k])) for k, v in volumes.items()]
    channel_voxels = sum(math.prod(shape) * k for shape, k in crops)
    overlap = LOW_OVERLAP if policy == "max8_ov25" else measured["overlap"]
    gpu_bytes = measured.get("gpu_total_bytes", H200_BYTES if measured["device"] == "cuda" else None)
    rows = {}
    for name, m in members.items():
        tiles = count_model_tiles(crops, m["patch_shape_vox"], overlap, measured["device"], gpu_bytes)
        rows[name] = {"tiles": tiles, "seconds": tiles * m["steady"]["seconds_per_tile"]}
    write = channel_voxels * measured["write_seconds_per_channel_voxel"]
    seconds = measured["load_seconds"] + measured.get("warmup_seconds", 0.0) + sum(r["seconds"] for r in rows.values()) + write
    return {"channel_voxels": channel_voxels, "members": rows, "write_seconds": write, "seconds": seconds,
            "bytes": measured["bytes"] * channel_voxels / max(1, measured["channel_voxels"])}


def probe_channels(real: Mapping[int, Crop], channels: Sequence[str]) -> int:
    """Channels for the steady-state probe: the most any crop holding ≥ `BIG_CROP_SHARE` of the max8 voxels is
    scored on (the 1000³ crops dominate the predict time)."""
    volumes = real_volumes(real, "max8")
    total = sum(v["voxels"] for v in volumes.values())
    return max(scored_count(channels, real[k]) for k, v in volumes.items() if v["voxels"] >= BIG_CROP_SHARE * total)


def project_stage(measured: Mapping[str, Any], units: int, items: int, key: str) -> dict[str, Any]:
    """A stage's cost model (`cost_model`) applied to the real test set's `items` and `units` voxels."""
    out = {key: units, "items": items,
           "seconds": measured["per_item_seconds"] * items + measured["per_voxel_seconds"] * units}
    if "bytes" in measured:
        out["bytes"] = measured["bytes"] * units / measured[key]
    return out


def project(stages: Mapping[str, Any], real: Mapping[int, Crop], rates: Mapping[str, Any] | None = None
            ) -> dict[str, Any]:
    """Minutes per stage and in total on the real test crops, for every policy. `rates` (a
    `bench/ensemble_steady.py` report) replaces the ensemble's and post-processing's cost per channel-voxel,
    and submit's and validate's per submitted voxel, with those measured on a large crop; their costs per crop
    or array stay this run's."""
    out = {}
    submitted, arrays = submitted_voxels(real), num_arrays(real)
    channels = next((m["channels"] for m in [*stages.get("predict", {}).values(),
                                             *stages.get("predict_ensemble", {}).get("members", {}).values()]
                     if m.get("status", "ok") == "ok"), None)
    for policy, description in POLICIES.items():
        volumes = real_volumes(real, policy)
        voxels = sum(v["voxels"] for v in volumes.values())
        channel_voxels = sum(v["voxels"] * scored_count(channels, real[k]) for k, v in volumes.items()) if channels else 0
        rows: dict[str, Any] = {"predict": {name: project_predict(m, real, policy)
                                            for name, m in stages.get("predict", {}).items() if m.get("status") == "ok"}}
        fused = stages.get("predict_ensemble", {})
        if fused.get("status") == "ok" and (row := project_fused(fused, real, policy)):
            rows["predict_ensemble"] = row
        for stage, key, units, items in (("ensemble", "channel_voxels", channel_voxels, len(real)),
                                         ("postprocess", "channel_voxels", channel_voxels, len(real)),
                                         ("submit", "submitted_voxels", submitted, arrays),
                                         ("validate", "submitted_voxels", submitted, arrays)):
            if stages.get(stage, {}).get("status") == "ok":
                measured = dict(stages[stage])
                if rates and f"{stage}_seconds_per_{key[:-1]}" in rates:  # e.g. submit_seconds_per_submitted_voxel
                    measured["per_voxel_seconds"] = rates[f"{stage}_seconds_per_{key[:-1]}"]
                rows[stage] = project_stage(measured, units, items, key)
        predict_s = sum(r["seconds"] for r in rows["predict"].values()) + rows.get("predict_ensemble", {}).get("seconds", 0)
        total_s = predict_s + sum(rows[s]["seconds"] for s in DOWNSTREAM if s in rows)
        needed = [s for s in DOWNSTREAM if not (s == "ensemble" and "predict_ensemble" in rows)]
        out[policy] = {"description": description, "model_voxels": voxels, "channel_voxels": channel_voxels,
                       "submitted_voxels": submitted,
                       "crops": {str(k): v for k, v in real_volumes(real, policy).items()}, "stages": rows,
                       "predict_minutes": predict_s / 60, "total_minutes": total_s / 60, "goal_minutes": GOAL_MINUTES,
                       "complete": bool(rows["predict"] or "predict_ensemble" in rows) and all(s in rows for s in needed),
                       "meets_goal": total_s / 60 <= GOAL_MINUTES}
    return out
