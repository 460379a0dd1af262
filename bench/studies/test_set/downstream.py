"""The stages after predict, as the CLI runs them: ensemble, post-processing, submission and validation, each
timed in full, then on the smallest crop alone (cost per crop or array) and on a probe (cost per voxel)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.studies.test_set.layout import PROBE_LABELS, PROBE_VOXEL_NM, num_arrays, submitted_voxels
from bench.studies.test_set.records import cost_model, store_channel_voxels, store_voxels, timed
from cellseg.data.crops import Crop, Geometry
from cellseg.data.inspect import disk_bytes
from cellseg.eval.rules import is_scored_as_instance
from cellseg.eval.submit import load_manifest


def ensemble_stage(stores: Sequence[Path], out: Path, smallest: str) -> dict[str, Any]:
    """Uniform-weight ensemble of the member stores, as `cellseg ensemble --weights uniform`; then the smallest
    crop alone (`write_ensemble`, what `ensemble` runs) for the cost per crop that does not grow with voxels."""
    from cellseg.config.inference import EnsembleConfig
    from cellseg.infer.ensemble import ensemble, write_ensemble
    from cellseg.infer.members import open_members, plan_channels
    from cellseg.infer.weights import uniform_weights

    record: dict[str, Any] = {}
    with timed(record):
        result = ensemble(EnsembleConfig(members=tuple(str(s) for s in stores)), out)
    members = open_members(stores)
    plan = plan_channels(members)
    with timed(record, "smallest_crop_seconds"):
        write_ensemble(members, out.with_name(f"{out.stem}_{smallest}.zarr"), plan, uniform_weights(plan, len(members)),
                       [smallest])
    record.update(members=len(stores), voxels=store_voxels(out), channel_voxels=store_channel_voxels(out),
                  bytes=disk_bytes(out))
    return cost_model(record, per_item=record["smallest_crop_seconds"], items=len(result.crops), key="channel_voxels")


def postprocess_stage(source: Path, out: Path, device: str) -> dict[str, Any]:
    """Default post-processing parameters, as `cellseg postprocess --device auto` (CUDA on a GPU); cost per crop
    and per voxel fitted to the seconds the store records for each crop."""
    import numpy as np

    from cellseg.data.prediction_store import PredictionStore
    from cellseg.postprocess.apply import open_probabilities, postprocess_store, resolve
    from cellseg.postprocess.params import ParamSet

    record: dict[str, Any] = {"device": resolve(device)}
    with timed(record):
        seg = postprocess_store(open_probabilities(source), out, params=ParamSet(), device=record["device"],
                                progress=False)
    crops = seg.completed()
    probs = PredictionStore.open(source)
    voxels = [math.prod(seg.grid(c).shape_vox) * len(probs.crop_channels(c)) for c in crops]  # channel-voxels
    seconds = [seg.crop_attrs(c).get("postprocess", {}).get("seconds", 0.0) for c in crops]
    per_voxel, per_crop = np.polyfit(voxels, seconds, 1) if len(set(voxels)) > 1 else (0.0, 0.0)
    record.update(voxels=sum(math.prod(seg.grid(c).shape_vox) for c in crops), channel_voxels=sum(voxels),
                  bytes=disk_bytes(out), crop_seconds=dict(zip(crops, seconds, strict=True)))
    model = cost_model(record, per_item=max(0.0, float(per_crop)), items=len(crops), key="channel_voxels")
    if per_voxel > 0:  # else (timing noise) the rest of the stage's time per voxel, as `cost_model` has it
        model["per_voxel_seconds"] = float(per_voxel)
    return model


def probe_crops(segmentation: Path) -> dict[int, Crop]:
    """The largest crop of a segmentation store as a submission crop on a `PROBE_VOXEL_NM` grid over its box, with
    up to `PROBE_LABELS` of its labels: enough voxels for submit and validate to show their cost per voxel."""
    from cellseg.data.prediction_store import PredictionStore

    store = PredictionStore.open(segmentation)
    name = max(store.completed(), key=lambda c: math.prod(store.grid(c).shape_vox) * math.prod(store.grid(c).voxel_size_nm))
    grid = store.grid(name)
    probe = Geometry(voxel_size_nm=(PROBE_VOXEL_NM,) * 3,
                     translation_nm=tuple(t + (PROBE_VOXEL_NM - v) / 2 for t, v in  # type: ignore[arg-type]
                                          zip(grid.translation_nm, grid.voxel_size_nm, strict=True)),
                     shape_vox=tuple(round(n * v / PROBE_VOXEL_NM)  # type: ignore[arg-type]
                                     for n, v in zip(grid.shape_vox, grid.voxel_size_nm, strict=True)))
    crop_id = int(name.removeprefix("crop"))
    instance = [c for c in store.crop_channels(name) if is_scored_as_instance(c)]
    semantic = [c for c in store.crop_channels(name) if not is_scored_as_instance(c)]
    labels = [c for pair in itertools.zip_longest(instance, semantic) for c in pair if c][:PROBE_LABELS]
    return {crop_id: Crop(id=crop_id, dataset=store.crop_attrs(name).get("dataset", ""),
                          labels={label: probe for label in labels})}


def submit_stage(source: Path, manifest: Path, out: Path, smallest: int) -> dict[str, Any]:
    """The submission zip at the synthetic test crops' geometry, as `cellseg submit --manifest`; then the smallest
    crop alone (cost per array) and the probe (`probe_crops`: cost per voxel)."""
    from cellseg.eval.submit import write_submission

    crops, probe = load_manifest(manifest), probe_crops(source)
    record: dict[str, Any] = {}
    with timed(record):
        report = write_submission(source, crops, out)
    with timed(record, "smallest_crop_seconds"):
        write_submission(source, {smallest: crops[smallest]}, out.with_name(f"{out.stem}_{smallest}.zip"))
    with timed(record, "probe_seconds"):
        write_submission(source, probe, out.with_name(f"{out.stem}_probe.zip"))
    return probed(record, crops, smallest, probe, arrays=len(report.written), missing=len(report.missing),
                  bytes=out.stat().st_size)


def validate_stage(submission: Path, source: Path, manifest: Path, smallest: int) -> dict[str, Any]:
    """`cellseg validate-submission` with data checks; then the smallest crop alone (cost per array) and the
    probe submission `submit_stage` wrote (cost per voxel)."""
    from cellseg.eval.validate import validate_submission

    crops, probe = load_manifest(manifest), probe_crops(source)
    record: dict[str, Any] = {}
    with timed(record):
        issues = validate_submission(submission, crops, read_data=True)
    with timed(record, "smallest_crop_seconds"):
        validate_submission(submission, {smallest: crops[smallest]}, read_data=True)
    with timed(record, "probe_seconds"):
        validate_submission(submission.with_name(f"{submission.stem}_probe.zip"), probe, read_data=True)
    counts = {level: sum(i.severity == level for i in issues) for level in ("error", "warning", "info")}
    return probed(record, crops, smallest, probe, issues=counts,
                  errors=[str(i) for i in issues if i.severity == "error"][:10])


def probed(record: dict[str, Any], crops: Mapping[int, Crop], smallest: int, probe: Mapping[int, Crop],
           **extra: Any) -> dict[str, Any]:
    """Submit/validate cost model: per array from the smallest crop, per voxel from the probe (less its arrays)."""
    per_array = record["smallest_crop_seconds"] / len(crops[smallest].labels)
    probe_voxels = submitted_voxels(probe)
    record.update(extra, submitted_voxels=submitted_voxels(crops), probe_voxels=probe_voxels)
    return {**cost_model(record, per_item=per_array, items=num_arrays(crops), key="submitted_voxels"),
            "per_voxel_seconds": max(0.0, record["probe_seconds"] - per_array * num_arrays(probe)) / probe_voxels}
