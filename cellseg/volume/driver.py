"""`cellseg predict-volume` from its resolved config: every check first (members, EM level, ROI, parameters,
output store, disk), then the store, then the run on daisy (`cellseg.volume.run`)."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cellseg.classes import is_instance
from cellseg.data.grid import Grid
from cellseg.volume.plan import (
    context_vox,
    dataset_em,
    em_level,
    estimate_bytes,
    open_em,
    parse_roi_nm,
    roi_of,
)
from cellseg.volume.predict import (
    Members,
    resolve_decided,
    resolve_members,
    route_members,
    settings_of,
    volume_channels,
)
from cellseg.volume.run import RunResult, Workers, run_tasks, visible_gpus
from cellseg.volume.store import VolumeStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decided:
    """A decided ensemble (`cellseg predict-volume --decisions`), as its decisions file gives it: the runs, the
    weights per channel (one per run), the classes predicted with `tta` transforms, and what the store records of
    the file (`provenance`: its path and sha256, compared when the run resumes)."""

    run_dirs: tuple[str, ...]
    weights: Mapping[str, Sequence[float]]
    tta_classes: frozenset[str]
    tta: int
    provenance: Mapping[str, Any]


@dataclass(frozen=True)
class Prepared:
    """A checked run: its store (created or reopened), workers, and the context and halo blocks read."""

    store: VolumeStore
    workers: Workers
    context_vox: tuple[int, int, int]
    halo_vox: tuple[int, int, int]


def _instance_halo(classes: list[str], known: Sequence[str], source: str, voxel_size: tuple[float, float, float]
                   ) -> tuple[int, int, int]:
    """The halo decoding reads around a block: the largest of the classes' (`default_halo_vox`), after checking the
    parameter file against the members' classes `known`."""
    from cellseg.postprocess.params import ParamSet
    from cellseg.volume.instances import default_halo_vox

    params = ParamSet() if source == "default" else ParamSet.load(source)
    params.check_classes(known, store="the members")
    halos = [default_halo_vox(params.get(c), voxel_size) for c in classes]
    return tuple(max(h[d] for h in halos) for d in range(3))  # type: ignore[return-value]


@dataclass(frozen=True)
class Plan:
    """A checked job before anything is written: its members, classes and channels, where the EM is, the ROI's
    grid, the halo instance decoding reads, the write blocks and the workers."""

    members: Members
    classes: list[str]
    channels: list[str]
    root: str
    em_url: str
    grid: Grid
    halo_vox: tuple[int, int, int]
    block_vox: tuple[int, int, int]
    workers: Workers

    def label_bytes(self, instances: bool) -> list[int]:
        """Bytes per voxel of each label array the run writes (instance ids: 8, masks: 1)."""
        return [8 if is_instance(c) else 1 for c in self.classes] if instances else []


def plan_job(job: Any, decided: Decided | None = None) -> Plan:
    """Check everything a `PredictVolumeJob` needs (with `decided`, its members, weights and per-class TTA instead
    of the job's), writing nothing.

    Raises:
        ValueError, FileNotFoundError: bad input, named, before any block is predicted.
    """
    opts, vol, ens = job.infer, job.volume, job.ensemble
    if opts.axes_2d != "z":
        raise ValueError(f"infer.axes_2d={opts.axes_2d!r}: predict-volume slices 2D members across z only; predict "
                         "crops with `cellseg predict --axes-2d zyx` instead")
    if decided is not None:
        members = resolve_decided(decided.run_dirs, decided.weights, decided.tta_classes, tta=decided.tta, opts=opts)
    elif ens.routes:
        band = route_members(ens.routes, float(vol.scale_nm))
        members = resolve_members(list(band.members), band.weights, allow_partial=ens.allow_partial, opts=opts)
    else:
        members = resolve_members(list(ens.members), ens.library_weights(), allow_partial=ens.allow_partial, opts=opts)
    classes, channels = volume_channels(members.plan, vol.classes)
    root = opts.data_root or members.runs[0].cfg.data.root
    em_url = dataset_em(root, job.dataset)
    level = em_level(open_em(em_url, job.dataset), members.voxel_size_nm, job.dataset)
    grid = roi_of(level, parse_roi_nm(vol.roi_nm) if vol.roi_nm else None, job.dataset)
    instances = vol.instances is not None
    halo = _instance_halo(classes, members.plan.classes, vol.instances, grid.voxel_size_nm) if instances else (0, 0, 0)
    gpus = visible_gpus(opts.device)
    if opts.device == "cuda" and not gpus:
        raise ValueError("--device cuda: no CUDA device is visible")
    block_vox = vol.block_shape(grid.shape_vox[0], _fitted_edge(job, members, channels, gpus))
    predict_workers = vol.workers or (len(gpus) * vol.workers_per_gpu if gpus else 1)
    workers = Workers(predict=predict_workers, cpu=vol.cpu_workers, gpus=gpus, device=opts.device,
                      launch=tuple(shlex.split(vol.launch)), max_retries=vol.max_retries,
                      timeout_s=vol.block_timeout_s, host=vol.host)
    return Plan(members, classes, channels, str(root), em_url, grid, halo, block_vox, workers)


def _fitted_edge(job: Any, members: Members, channels: Sequence[str], gpus: Sequence[str]) -> int:
    """The write block's edge in y and x: `volume.block_vox`, made smaller when the members' blending sums would
    not fit the workers' GPU (`volume.gpu_memory_gb`, else the driver's first visible GPU; no plan without
    either, e.g. a driver on a batch host)."""
    from cellseg.infer.tiling import GPU_FUSED_FRACTION
    from cellseg.volume.plan import block_sums_bytes, fit_block_edge

    vol, opts = job.volume, job.infer
    gpu_bytes = int(vol.gpu_memory_gb * 1e9) if vol.gpu_memory_gb else _first_gpu_bytes(opts.device, gpus)
    streams = member_streams(members, channels, opts.overlap)
    if not gpu_bytes or not streams:
        return vol.block_vox
    edge = fit_block_edge(vol.block_vox, vol.chunk_vox, streams, gpu_bytes)
    if edge < vol.block_vox:
        log.warning("blocks %d voxels wide: the %d members' blending sums need %.1f GB, more than %.0f %% of the "
                    "GPU's %.1f GB; blocks %d wide instead (set --block-vox, or volume.gpu_memory_gb for GPUs other "
                    "than the driver's)", vol.block_vox, len(streams), block_sums_bytes(vol.block_vox, streams) / 1e9,
                    100 * GPU_FUSED_FRACTION, gpu_bytes / 1e9, edge)
    return edge


def member_streams(members: Members, channels: Sequence[str], overlap: float) -> list[tuple[int, Any, float]]:
    """(channels it contributes, patch, overlap) of every member that contributes to `channels`: the sliding
    windows a block streams in lockstep (`cellseg.volume.plan.block_sums_bytes`)."""
    streams = []
    for i, run in enumerate(members.runs):
        k = sum(i in members.plan.members_of[c] and members.weights.per_channel[c][i] > 0 for c in channels)
        if k:
            streams.append((k, run.cfg.data.patch_shape_vox, overlap))
    return streams


def _first_gpu_bytes(device: str, gpus: Sequence[str]) -> int | None:
    """Memory of the first GPU the driver sees (the workers' on one node), or None on the CPU."""
    if device == "cpu" or not gpus:
        return None
    import torch

    return int(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else None


def prepare(job: Any, decided: Decided | None = None) -> Prepared:
    """`plan_job`, the disk check, then the store created (or, with `volume.resume`, reopened).

    Raises:
        ValueError, FileNotFoundError, FileExistsError, OSError: bad input, named, before any block is predicted.
    """
    from cellseg.volume.plan import check_disk

    opts, vol, ens = job.infer, job.volume, job.ensemble
    plan = plan_job(job, decided)
    instances = vol.instances is not None
    if not (vol.resume and VolumeStore.exists(job.out)):
        check_disk(job.out, estimate_bytes(plan.grid, plan.channels, plan.label_bytes(instances)),
                   compression=vol.disk_compression)
    settings = settings_of(opts, em_url=plan.em_url, allow_partial=ens.allow_partial,
                           extra={"instances": vol.instances, "band": None if not ens.routes else vol.scale_nm,
                                  "decisions": None if decided is None else dict(decided.provenance)})
    members = plan.members
    store = VolumeStore.create(job.out, dataset=job.dataset, data_root=plan.root, grid=plan.grid,
                               block_vox=plan.block_vox, chunk_vox=(vol.chunk_vox,) * 3,
                               classes=plan.classes, channels=plan.channels,
                               instance_classes=[c for c in plan.classes if is_instance(c)], instances=instances,
                               members=members.summary(opts), tta=max(members.transforms(opts)), settings=settings,
                               resume=vol.resume)
    patches = [r.cfg.data.patch_shape_vox for r in members.runs]
    return Prepared(store, plan.workers, context_vox(patches, opts.overlap), plan.halo_vox)


def predict_volume(job: Any, *, progress: bool = True, decided: Decided | None = None) -> RunResult:
    """Check, create the store and run every task; the result says which blocks failed (`summary.json` too)."""
    prepared = prepare(job, decided)
    store = prepared.store
    log.info("%s: %s voxels at %s nm in blocks of %s, %d prediction workers%s", store.path,
             "×".join(map(str, store.grid.shape_vox)), "×".join(f"{v:g}" for v in store.grid.voxel_size_nm),
             "×".join(map(str, store.block_vox)), prepared.workers.predict,
             f" on GPUs {','.join(prepared.workers.gpus)}" if prepared.workers.gpus else " on CPU")
    return run_tasks(store, prepared.workers, context_vox=prepared.context_vox, halo_vox=prepared.halo_vox,
                     progress=progress)
