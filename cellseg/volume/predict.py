"""The members of a whole-volume prediction and one block of it, through the engine `cellseg predict-ensemble`
uses (`cellseg.infer.fused`): each member streams its sliding window (`predict_slabs`) over its tile-lattice box
(`cellseg.volume.plan.lattice_box`), cropped to the write box, and the weighted mean of the members
(`averaged_slabs`) is quantised to uint8 and written into the store's s0 arrays.

The driver resolves the members once (`resolve_members`: run directories, one voxel size, channels, weights) and
records them in the store; each worker rebuilds the same ensemble from the store alone (`BlockPredictor.of`),
so a worker started anywhere (a subprocess, an `srun`) needs only the store's path.

Decided (`resolve_decided`, `cellseg predict-volume --decisions`): each class its own members, weights and TTA. A
run then takes part once per number of transforms its classes need: as a member with 8 transforms weighing the
classes with TTA, and as one with 1 transform weighing the others (its model loaded once). Each channel's weighted
mean is over the members with a positive weight for it, so a block holds what `predict-ensemble --decisions`
writes for a crop.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cellseg import runtime
from cellseg.config.inference import InferConfig, RouteConfig
from cellseg.data.arrays import MultiscaleImage
from cellseg.data.prediction_store import BOUNDARY_SUFFIX, boundary_channel
from cellseg.infer.columns import chunked_slabs
from cellseg.infer.engine import predict_slabs
from cellseg.infer.fused import (
    Member,
    RunChannels,
    averaged_slabs,
    choose_weights,
    common_voxel_size,
    contributions,
    weight_totals,
)
from cellseg.infer.members import ChannelPlan, plan_channels
from cellseg.infer.run import LoadedRun, load_run, run_transforms
from cellseg.infer.weights import Weights
from cellseg.volume.plan import Box, lattice_box, sub_grid
from cellseg.volume.store import PROBABILITIES, VolumeStore

log = logging.getLogger(__name__)
# InferConfig keys that belong to one process, not to the run: a worker sets its own (`BlockPredictor.of`)
PROCESS_KEYS = ("device", "progress", "overwrite")


@dataclass(frozen=True)
class Members:
    """The resolved members: loaded runs (on the driver: CPU), their common voxel size, channels and weights; `tta`:
    the transforms each member asks for (None: `InferConfig.tta` for every member)."""

    runs: list[LoadedRun]
    voxel_size_nm: tuple[float, float, float]
    plan: ChannelPlan
    weights: Weights
    tta: tuple[int, ...] | None = None

    def transforms(self, opts: InferConfig) -> list[int]:
        """The transforms each member predicts with, as its model has them (a 2D model has 8 in-plane ones)."""
        asked = self.tta or (opts.tta,) * len(self.runs)
        return [len(run_transforms(r, n)) for r, n in zip(self.runs, asked, strict=True)]

    def summary(self, opts: InferConfig) -> list[dict[str, Any]]:
        """What the store records per member (enough for a worker to rebuild it): its effective transforms."""
        return [{"run": str(r.run_dir.resolve()), "checkpoint": str(r.checkpoint.resolve()),
                 "architecture": r.cfg.model.name, "step": r.step, "weights_kind": r.weights,
                 "patch_vox": list(r.cfg.data.patch_shape_vox), "tta": tta,
                 "weights": {c: self.weights.per_channel[c][i] for c in self.plan.channels}}
                for i, (r, tta) in enumerate(zip(self.runs, self.transforms(opts), strict=True))]


def route_members(routes: Sequence[RouteConfig], scale_nm: float) -> RouteConfig:
    """The band of a routed ensemble that holds `scale_nm`.

    Raises:
        ValueError: no band holds it (the bands are named).
    """
    for route in routes:
        low, high = route.band_nm
        if low < scale_nm <= high or (low == 0 and scale_nm == 0):
            return route
    raise ValueError(f"volume.scale_nm={scale_nm:g}: no band of ensemble.routes holds it (bands: "
                     f"{', '.join(r.label for r in routes)})")


def resolve_members(run_dirs: Sequence[str | Path], weights: str | Sequence[float], *, allow_partial: bool,
                    opts: InferConfig, device: torch.device | str = "cpu") -> Members:
    """Load the runs and decide voxel size, channels and weights as `predict_ensemble` does (one run is fine).

    Raises:
        ValueError: a run listed twice, members at different voxel sizes or with incompatible classes, bad
            weights; FileNotFoundError: a run directory without its files.
    """
    resolved = [Path(r).resolve() for r in run_dirs]
    if len(set(resolved)) < len(resolved):
        raise ValueError(f"runs listed more than once: {sorted({str(r) for r in resolved if resolved.count(r) > 1})}")
    runs = [load_run(r, opts.checkpoint, device=device, data_root=opts.data_root, backend=opts.backend)
            for r in run_dirs]
    voxel_size = common_voxel_size(runs)
    views = [RunChannels.of(r) for r in runs]
    plan = plan_channels(views, allow_partial=allow_partial)  # type: ignore[arg-type]
    return Members(runs, voxel_size, plan, choose_weights(weights, plan, views))


def resolve_decided(run_dirs: Sequence[str | Path], per_channel: Mapping[str, Sequence[float]],
                    tta_classes: Collection[str], *, tta: int, opts: InferConfig) -> Members:
    """The members of a decided ensemble (module docstring): for each of `tta` and 1 transforms that some class
    needs, every run with a positive weight on such a class's channels, weighing those channels only.

    Args:
        per_channel: channel → one weight per run (a decisions file's weights), in the order of `run_dirs`.
        tta_classes: the classes predicted with `tta` transforms; the others with one.

    Raises:
        ValueError: as `resolve_members`; a channel without weights.
    """
    loaded = resolve_members(run_dirs, "uniform", allow_partial=False, opts=opts)
    missing = [c for c in loaded.plan.channels if c not in per_channel]
    if missing:
        raise ValueError(f"no decided weights for channels {missing}")
    origin, asked, weights = [], [], []  # per member: the run it is, its transforms, its weight per channel
    for n, with_tta in ((tta, True), (1, False)):
        for i in range(len(loaded.runs)):
            row = {c: float(per_channel[c][i]) if (c.removesuffix(BOUNDARY_SUFFIX) in tta_classes) == with_tta
                   else 0.0 for c in loaded.plan.channels}
            if any(v > 0 for v in row.values()):
                origin.append(i)
                asked.append(n)
                weights.append(row)
    members_of = {c: tuple(k for k, i in enumerate(origin) if i in loaded.plan.members_of[c])
                  for c in loaded.plan.channels}
    chosen = Weights({c: tuple(w[c] for w in weights) for c in loaded.plan.channels}, "decided")
    return Members([loaded.runs[i] for i in origin], loaded.voxel_size_nm, replace(loaded.plan, members_of=members_of),
                   chosen, tuple(asked))


def volume_channels(plan: ChannelPlan, classes: Sequence[str]) -> tuple[list[str], list[str]]:
    """(classes, probability channels) of the volume: `classes` (default all the members' classes) and, after
    them, the boundary channels the members predict for them.

    Raises:
        ValueError: a class no member predicts.
    """
    chosen = list(classes) or list(plan.classes)
    unknown = [c for c in chosen if c not in plan.classes]
    if unknown:
        raise ValueError(f"--classes: {unknown} are not predicted by the members (they predict {list(plan.classes)})")
    return chosen, chosen + [boundary_channel(c) for c in chosen if boundary_channel(c) in plan.channels]


def _cropped(stream: Iterator[tuple[int, torch.Tensor]], offset: Sequence[int], shape: Sequence[int]
             ) -> Iterator[tuple[int, torch.Tensor]]:
    """The planes of a slab stream over a lattice box that fall in the write box (`offset` in the lattice box,
    `shape`), renumbered from 0 and cut in y and x."""
    (z, y, x), (nz, ny, nx) = offset, shape
    for z0, slab in stream:
        lo, hi = max(z0, z), min(z0 + slab.shape[1], z + nz)
        if hi > lo:
            yield lo - z, slab[:, lo - z0:hi - z0, y:y + ny, x:x + nx]
        if z0 + slab.shape[1] >= z + nz:
            return


class BlockPredictor:
    """The ensemble of a volume store, rebuilt in a worker: predicts write boxes into the store's s0 arrays."""

    def __init__(self, store: VolumeStore, members: list[Member], weights: Weights, plan: ChannelPlan,
                 em: MultiscaleImage, opts: InferConfig):
        self.store, self.em, self.opts = store, em, opts
        self.channels = store.channels
        self.device = members[0].run.device
        self.parts = contributions(members, self.channels, plan, weights, self.device)
        self.total = torch.from_numpy(weight_totals(self.channels, weights)).to(self.device)
        self.arrays = {c: store.array(PROBABILITIES, c, 0) for c in self.channels}

    @classmethod
    def of(cls, store: VolumeStore, device: str = "auto") -> BlockPredictor:
        """Rebuild the members, weights and windows the store records, on `device`."""
        from cellseg.volume.plan import open_em

        settings = store.attrs["settings"]
        opts = InferConfig(**settings["infer"], device=device)
        dev = runtime.init_distributed(opts.device).device
        recorded = store.attrs["members"]
        loaded: dict[tuple[str, str], LoadedRun] = {}  # a run taking part with two numbers of transforms: loaded once
        for m in recorded:
            key = (m["run"], m["checkpoint"])
            if key not in loaded:
                loaded[key] = load_run(m["run"], m["checkpoint"], device=dev, data_root=store.attrs["data_root"],
                                       backend=opts.backend)
        runs = [loaded[(m["run"], m["checkpoint"])] for m in recorded]
        views = [RunChannels.of(r) for r in runs]
        plan = plan_channels(views, allow_partial=bool(settings.get("allow_partial")))  # type: ignore[arg-type]
        per_channel = {c: tuple(float(m["weights"].get(c, 0.0)) for m in recorded) for c in plan.channels}
        precision = runtime.resolve_precision("auto", dev)
        runtime.configure_backends(tf32=True, cudnn_benchmark=True)
        members = [Member.of(r, replace(opts, tta=int(m.get("tta", opts.tta))), precision)
                   for r, m in zip(runs, recorded, strict=True)]
        return cls(store, members, Weights(per_channel, "recorded"), plan, open_em(settings["em_url"],
                                                                                      store.attrs["dataset"]), opts)

    @torch.inference_mode()
    def slabs(self, write: Box) -> Iterator[tuple[int, np.ndarray]]:
        """(z, (K, dz, y, x) uint8 round(255 p)) of the store's channels over a write box (ROI voxels), in order
        along z from the box's first plane (z relative to it)."""
        grid = self.store.grid
        if not self.parts:
            yield 0, np.zeros((len(self.channels), *write[1]), np.uint8)
            return
        streams = []
        for part in self.parts:
            window = part.member.window
            box = lattice_box(write, window.patch_vox, window.overlap)
            inner = [w - b for w, b in zip(write[0], box[0], strict=True)]
            slabs = predict_slabs(part.member.run.model, self.em, sub_grid(grid, box), window,
                                  num_outputs=len(part.member.run.channels), keep=part.keep, host=False)
            streams.append(_cropped(slabs, inner, write[1]))  # type: ignore[arg-type]
        yield from averaged_slabs(streams, self.parts, self.total, start=0, depth=write[1][0], device=self.device,
                                  uint8=True)

    def predict(self, write: Box) -> np.ndarray:
        """(K, z, y, x) uint8 round(255 p) of the store's channels over a write box, held whole (for checks)."""
        out = np.zeros((len(self.channels), *write[1]), np.uint8)
        for z, slab in self.slabs(write):
            out[:, z:z + slab.shape[1]] = slab
        return out

    def write(self, write: Box) -> None:
        """Predict a write box and write it into place a chunk row at a time, as the planes finish
        (`chunked_slabs`, as `cellseg predict` writes a column): host memory holds about one chunk depth of the
        block (a column block of a deep volume is never held whole), and every write covers whole chunks, which
        no other block touches. A box the GPU has no memory for is predicted again in halves along y and x
        (`halves`: the lattice makes them equal to the whole), down to one chunk; then a clear error."""
        try:
            self._write(write)
        except torch.OutOfMemoryError:
            parts = halves(write, self.store.chunk_vox)
            if not parts:
                raise RuntimeError(
                    f"block at {write[0]} ({'×'.join(map(str, write[1]))} voxels): out of GPU memory even at one "
                    f"chunk wide: the members' models and sums do not fit this GPU; predict fewer classes "
                    "(--classes), fewer members, or on a GPU with more memory") from None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            log.warning("block at %s: out of GPU memory at %s voxels; predicting it in %d parts of %s", write[0],
                        "×".join(map(str, write[1])), len(parts), "×".join(map(str, parts[0][1])))
            for part in parts:
                self.write(part)

    def _write(self, write: Box) -> None:
        (z0, y0, x0), (nz, _, _) = write
        for z, rows in chunked_slabs(self.slabs(write), nz, self.store.chunk_vox[0], 0):
            self._write_rows(rows, (z0 + z, y0, x0))

    def _write_rows(self, rows: np.ndarray, offset: Sequence[int]) -> None:
        where = tuple(slice(o, o + n) for o, n in zip(offset, rows.shape[1:], strict=True))
        for k, c in enumerate(self.channels):
            self.arrays[c][where] = rows[k]


def halves(write: Box, chunk_vox: Sequence[int]) -> list[Box]:
    """A write box cut in two along y and along x where each part stays whole chunks (the first part a multiple
    of the chunk), z kept whole (the window streams along it): 4, 2 or no parts."""
    (z, y, x), (nz, ny, nx) = write
    cuts = []
    for n, c in ((ny, chunk_vox[1]), (nx, chunk_vox[2])):
        first = -(-(n // 2) // c) * c
        cuts.append([(0, first), (first, n - first)] if 0 < first < n else [(0, n)])
    if len(cuts[0]) == len(cuts[1]) == 1:
        return []
    return [((z, y + oy, x + ox), (nz, sy, sx)) for oy, sy in cuts[0] for ox, sx in cuts[1]]


def settings_of(opts: InferConfig, *, em_url: str, allow_partial: bool, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The store's "settings": the inference settings as one object ("infer": every `InferConfig` key but the
    per-process ones, `PROCESS_KEYS`), where the EM is, and the caller's `extra` entries."""
    infer = {k: v for k, v in dataclasses.asdict(opts).items() if k not in PROCESS_KEYS}
    return {"infer": infer, "em_url": em_url, "allow_partial": allow_partial, **dict(extra)}
