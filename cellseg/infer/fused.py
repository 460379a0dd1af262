"""`cellseg predict-ensemble`: several trained runs predicted over the same crops in one pass, straight into an
ensemble store. The result is `cellseg predict` of every member followed by `cellseg ensemble`, without a
store per member written and read back.

Why: on the real test set every member store holds 38 G channel-voxels of float16. Eight of them were 10 of
the 84 projected minutes of the 8-model ensemble, and `cellseg ensemble` reading them back another 5 (H200,
`python -m bench.studies.test_set`, docs/benchmarks.md).

How: every crop is cut into the same columns for all members (`fused_column_vox`: the blending sums of all of
them fit the GPU together). Each column streams through each member's sliding window along z
(`predict_slabs`, slabs kept on the GPU). The member furthest behind is advanced, and planes every member has
finished are averaged, moved to the host and written. The GPU holds one tile depth of sums per member, plus
the slabs the others are ahead by.

Rules, as `cellseg.infer.ensemble`:
- **Channels**: the members' classes must agree (`plan_channels`; with `allow_partial`, each class averages
  the members that have it).
- **Weights**: uniform, one per member, or a `weights.json` fitted by `cellseg ensemble --weights auto` on
  validation predictions of the same members, given in the same order.
- **Mean**: Σ w·p / Σ w per channel over the members with a positive weight, in float32, clipped to [0, 1],
  stored as float16 (or uint8). A member whose weights are all 0 is not run at all.

When both paths cut a crop into the same columns, the result equals `cellseg predict` + `cellseg ensemble`
bit for bit (tested).

Restrictions: every member predicts at the same voxel size (the crop grid is shared; members at different
voxel sizes need the two-step path, which resamples, or a routed ensemble, `cellseg.infer.routing`, which
gives each crop the members of its voxel-size band), and 2D members slice across z only.

Shapes: `K` channels, `Kₘ` those a member contributes, `dz` planes, `Y, X` a column's grid.
"""

from __future__ import annotations

import datetime
import json
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

import cellseg
from cellseg import runtime
from cellseg.classes import is_instance
from cellseg.config.inference import InferConfig
from cellseg.data.grid import Grid
from cellseg.data.prediction_store import QUANTUM, PredictionStore
from cellseg.infer.columns import commit_crop, write_columns
from cellseg.infer.crop_plan import (
    CropPlan,
    box_grid,
    check_store_disk,
    pending_crops,
    predict_crops,
    scored_channels,
    shard_crops,
)
from cellseg.infer.engine import Window, predict_slabs, require_em, to_host
from cellseg.infer.members import ChannelPlan, member_summary, plan_channels
from cellseg.infer.run import (
    ISOTROPY_RTOL,
    LoadedRun,
    job_gvox,
    load_run,
    run_provenance,
    run_transforms,
    run_window,
)
from cellseg.infer.selection import CropTarget, select_targets
from cellseg.infer.tiling import context_margin, count_tiles, fused_column_vox
from cellseg.infer.weights import (
    WEIGHTS_FILE,
    Weights,
    explicit_weights,
    parse_weights,
    uniform_weights,
    weights_from_file,
)

AVERAGE_PLANES = 16  # planes averaged and copied to the host at a time: bounds the float32 sums of the mean
# must agree to add crops to a store ("routes": a routed ensemble's bands, `cellseg.infer.routing`)
RESUME_KEYS = ("members", "weights", "routes", "tta", "overlap", "blend", "dtype", "channels")


@dataclass(frozen=True)
class Member:
    """One run of the ensemble, loaded, with the sliding window it predicts with (`run_window`)."""

    run: LoadedRun
    window: Window

    @classmethod
    def of(cls, run: LoadedRun, opts: InferConfig, precision: runtime.Precision,
           targets: Sequence[CropTarget] | None = None) -> Member:
        """The run with its window for `opts` (built once per run: it holds the compiled model); `targets`, the
        crops it will predict, size the job for `compile: auto` (`run.compile_decision`)."""
        transforms = run_transforms(run, opts.tta)
        gvox = None if targets is None else job_gvox(run, targets, overlap=opts.overlap, transforms=len(transforms))
        return cls(run, run_window(run, opts, precision=precision, transforms=transforms, gvox=gvox))


@dataclass(frozen=True)
class RunChannels:
    """A run seen as `plan_channels` and `weights_from_file` see a member store."""

    path: Path
    channels: tuple[str, ...]
    classes: tuple[str, ...]
    instance_channels: tuple[str, ...]
    provenance: dict[str, Any]

    @classmethod
    def of(cls, run: LoadedRun) -> RunChannels:
        classes = tuple(c for c in run.channels if c in run.cfg.data.classes)
        return cls(path=run.run_dir, channels=run.channels, classes=classes,
                   instance_channels=tuple(c for c in classes if is_instance(c)),
                   provenance={"run_dir": str(run.run_dir.resolve())})


def choose_weights(spec: str | Sequence[float], plan: ChannelPlan, views: Sequence[RunChannels]) -> Weights:
    """`--weights`: "uniform", one weight per member, or a weights.json path.

    Raises:
        ValueError: "auto" (it needs member predictions of validation crops: the two-step path), bad weights.
    """
    spec = parse_weights(spec) if isinstance(spec, str) else list(spec)
    if spec == "uniform":
        return uniform_weights(plan, len(views))
    if spec == "auto":
        raise ValueError("--weights auto fits on member predictions of validation crops: run `cellseg predict "
                         "--crops val` per member and `cellseg ensemble ... --weights auto`, then pass the "
                         "weights.json it writes (ENS.zarr/weights.json) here")
    if isinstance(spec, Path):
        return weights_from_file(spec, plan, views)  # type: ignore[arg-type]
    return explicit_weights(plan, spec, len(views))  # type: ignore[arg-type]


def common_voxel_size(runs: Sequence[LoadedRun]) -> tuple[float, float, float]:
    """The members' shared voxel size.

    Raises:
        ValueError: members at different voxel sizes (named), or a 2D member sliced across several axes.
    """
    sizes = [tuple(float(v) for v in r.cfg.data.voxel_size_nm) for r in runs]
    if any(not np.allclose(s, sizes[0], rtol=ISOTROPY_RTOL) for s in sizes):
        listed = "; ".join(f"{r.run_dir}: {list(s)} nm" for r, s in zip(runs, sizes, strict=True))
        raise ValueError(f"predict-ensemble needs members at one voxel size, got {listed}. Route each crop to "
                         "the members of its scale (ensemble.routes, configs/ensemble/routed.yaml), or predict "
                         "each with `cellseg predict` and combine with `cellseg ensemble`, which resamples")
    return sizes[0]  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------- lockstep


@dataclass(frozen=True)
class Contribution:
    """What one member adds to a crop's mean: its channels `keep` (model outputs) go to rows `rows` of the
    ensemble, each times its weight."""

    member: Member
    keep: tuple[int, ...]
    rows: torch.Tensor  # (Kₘ,) int64 ensemble channel of each kept output
    weight: torch.Tensor  # (Kₘ,) float32


class _Stream:
    """A member's slabs not yet averaged: contiguous along z from `begin` to `end`."""

    def __init__(self, slabs: Iterator[tuple[int, torch.Tensor]], start: int) -> None:
        self.slabs, self.pieces, self.begin, self.end = slabs, deque[torch.Tensor](), start, start

    def advance(self) -> None:
        z0, slab = next(self.slabs)
        if z0 != self.end:
            raise AssertionError(f"slab at plane {z0}, expected {self.end}")  # predict_slabs yields in order
        self.pieces.append(slab)
        self.end += slab.shape[1]

    def take(self, n: int) -> torch.Tensor:
        """The next `n` planes (K, n, Y, X), dropped from the stream."""
        parts, need = [], n
        while need:
            head = self.pieces[0]
            if head.shape[1] <= need:
                parts.append(self.pieces.popleft())
                need -= head.shape[1]
            else:
                parts.append(head[:, :need])
                self.pieces[0] = head[:, need:]
                need = 0
        self.begin += n
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def averaged_slabs(streams: Sequence[Iterator[tuple[int, torch.Tensor]]], parts: Sequence[Contribution],
                   total: torch.Tensor, *, start: int, depth: int, device: torch.device, uint8: bool = False
                   ) -> Iterator[tuple[int, np.ndarray]]:
    """The weighted mean of the members' slab streams, in order along z from `start` to `depth`, as host arrays
    (K, dz, Y, X): float16, or uint8 round(255 p) with `uint8`.

    The member furthest behind is advanced until every member has finished the next `AVERAGE_PLANES` planes
    (or the rest); the planes all have finished are averaged `AVERAGE_PLANES` at a time, in member order, as
    `cellseg.infer.members.weighted_mean` does (float32 products, then sums, then one division by Σ w), so both
    give the same numbers.

    Args:
        streams: one `predict_slabs(..., host=False)` generator per contribution, all from plane `start`.
        total: (K,) float32 Σ w of each ensemble channel.
    """
    pending = [_Stream(s, start) for s in streams]
    done = start
    while done < depth:
        goal = min(done + AVERAGE_PLANES, depth)  # average whole pieces, not each plane a 2D member finishes
        while (lag := min(pending, key=lambda p: p.end)).end < goal:
            lag.advance()
        upto = min(p.end for p in pending)
        for z in range(done, upto, AVERAGE_PLANES):
            n = min(AVERAGE_PLANES, upto - z)
            mean: torch.Tensor | None = None
            for part, stream in zip(parts, pending, strict=True):
                weighted = stream.take(n).to(device, torch.float32) * part.weight.view(-1, 1, 1, 1)
                if mean is None:
                    mean = weighted.new_zeros((total.numel(), *weighted.shape[1:]))
                mean.index_add_(0, part.rows, weighted)
            assert mean is not None  # at least one contribution (`contributions`)
            mean = mean.div_(total.view(-1, 1, 1, 1)).clamp_(0.0, 1.0)
            out = torch.round(mean * QUANTUM).to(torch.uint8) if uint8 else mean.to(torch.float16)
            yield z, to_host(out).numpy()
        done = upto


# ----------------------------------------------------------------------------------------------- the command


def predict_ensemble(run_dirs: Sequence[str | Path], crops: str, out: str | Path, *,
                     weights: str | Sequence[float] = "uniform", allow_partial: bool = False,
                     opts: InferConfig | None = None) -> list[dict[str, Any]]:
    """Predict `crops` ("val", "test" or ids) with every run and write their weighted mean into the store `out`;
    returns one summary per crop this rank wrote. Crops already in `out` are skipped (a re-run resumes, a partly
    written crop after its last written planes); under torchrun the crops are shared among the ranks.

    Args:
        run_dirs: ≥ 2 `cellseg train` run directories, in the order of the weights.
        weights: "uniform", one weight per run, or a weights.json (`cellseg ensemble --weights auto`).
        allow_partial: members may have different classes (each class averages the members that have it).
        opts: the `cellseg predict` options; `batch_size` and `tta_fold` (default: each run's own) apply to
            every member; `axes_2d` must be "z".

    Raises:
        ValueError: fewer than 2 runs, a run given twice, members at different voxel sizes or with incompatible
            classes, bad weights, crops that differ between the members' runs.
        FileNotFoundError: a run directory without its files or checkpoint.
    """

    opts = opts or InferConfig()
    if len(run_dirs) < 2:
        raise ValueError(f"an ensemble needs at least 2 runs, got {len(run_dirs)}: {[str(r) for r in run_dirs]}")
    resolved = [Path(r).resolve() for r in run_dirs]
    if len(set(resolved)) < len(resolved):
        raise ValueError(f"runs listed more than once: {sorted({str(r) for r in resolved if resolved.count(r) > 1})}")
    if opts.axes_2d != "z":
        raise ValueError("predict-ensemble slices 2D members across z only (--axes-2d z); for --axes-2d zyx "
                         "predict each member with `cellseg predict` and combine with `cellseg ensemble`")
    d = runtime.init_distributed(opts.device)
    try:
        runs = [load_run(r, opts.checkpoint, device=d.device, data_root=opts.data_root, backend=opts.backend)
                for r in run_dirs]
        voxel_size = common_voxel_size(runs)
        views = [RunChannels.of(r) for r in runs]
        plan = plan_channels(views, allow_partial=allow_partial)  # type: ignore[arg-type]
        chosen = choose_weights(weights, plan, views)
        precision = runtime.resolve_precision("auto", d.device)
        runtime.configure_backends(tf32=True, cudnn_benchmark=True)
        targets = member_targets(runs, crops, opts.data_root)
        provenance = _ensemble_provenance(runs, views, plan, chosen, opts, precision)
        weights_doc = {**chosen.to_json(), "members": member_summary(views), "grid": "shared"}  # type: ignore[arg-type]
        todo = pending_crops(lambda: open_store(out, plan.channels, plan.instance_channels, provenance, weights_doc,
                                                overwrite=opts.overwrite), targets, out, d,
                             check=lambda crops: check_store_disk(out, crops, plan.channels, voxel_size, opts))
        store = PredictionStore.open(out)
        mine = shard_crops(todo, d.rank, d.world_size)
        members = [Member.of(r, opts, precision, mine) for r in runs]
        return predict_crops(mine, lambda target, progress: predict_crop(
            members, target, store, plan, chosen, opts, voxel_size=voxel_size, progress=progress, rank=d.rank),
            desc="predict-ensemble", opts=opts, d=d)
    finally:
        runtime.shutdown_distributed()


def member_targets(runs: Sequence[LoadedRun], crops: str, data_root: str | None) -> list[CropTarget]:
    """The crops, selected as the first run selects them; the others must select the same crop names.

    Raises:
        ValueError: runs that select different crops (e.g. "val" of runs with different splits).
    """
    targets = select_targets(crops, runs[0].cfg, runs[0].run_dir, data_root=data_root)
    names = [t.name for t in targets]
    for run in runs[1:]:
        other = [t.name for t in select_targets(crops, run.cfg, run.run_dir, data_root=data_root)]
        if sorted(other) != sorted(names):
            raise ValueError(f"--crops {crops}: {run.run_dir} selects {other}, {runs[0].run_dir} selects {names}; "
                             "members must predict the same crops (give crop ids)")
    return targets


def _ensemble_provenance(runs: Sequence[LoadedRun], views: Sequence[RunChannels], plan: ChannelPlan,
                         weights: Weights, opts: InferConfig, precision: str) -> dict[str, Any]:
    """As `cellseg ensemble` records it, with each member's `cellseg predict` provenance."""
    member_prov = [run_provenance(r, opts, run_transforms(r, opts.tta), ("z",), precision) for r in runs]
    roots = {str(p["data_root"]) for p in member_prov if p.get("data_root")}
    return {"ensemble": {"members": member_summary(views),  # type: ignore[arg-type]
                         "grid": "shared", "fused": True, "weights": weights.to_json(),
                         "members_of": {c: list(m) for c, m in plan.members_of.items()}},
            "member_provenance": member_prov, "members": [p["run_dir"] for p in member_prov],
            "weights": weights.to_json()["channels"], "tta": opts.tta, "overlap": opts.overlap, "blend": opts.blend,
            "dtype": "uint8" if opts.uint8 else "float16", "channels": opts.channels,
            "precision": precision, "cellseg_version": cellseg.__version__,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            **({"data_root": roots.pop()} if len(roots) == 1 else {})}


def open_store(out: str | Path, channels: Sequence[str], instance_channels: Sequence[str],
               provenance: dict[str, Any], weights_doc: dict[str, Any], *, overwrite: bool) -> PredictionStore:
    """Create the store (with `weights_doc` as its weights.json), replace it, or reopen it to add crops when it
    was written by the same members, weights and settings (`RESUME_KEYS`)."""
    out = Path(out)
    if out.exists() and not overwrite:
        store = PredictionStore.create(out, kind="probabilities", channels=channels,
                                       instance_channels=instance_channels, resume=True)
        differ = [k for k in RESUME_KEYS if store.provenance.get(k) != provenance.get(k)]
        if differ:
            raise ValueError(f"{out}: written by other members or settings ({', '.join(differ)} differ); use "
                             "--overwrite to replace it or choose another --out")
        return store
    store = PredictionStore.create(out, kind="probabilities", channels=channels,
                                   instance_channels=instance_channels, provenance=provenance, overwrite=overwrite)
    tmp = store.path / f".{WEIGHTS_FILE}.tmp"
    tmp.write_text(json.dumps(weights_doc, indent=2))
    tmp.replace(store.path / WEIGHTS_FILE)
    return store


def contributions(members: Sequence[Member], channels: Sequence[str], plan: ChannelPlan, weights: Weights,
                   device: torch.device) -> list[Contribution]:
    """Per member with a positive weight on some of `channels`: those channels and their weights."""
    parts = []
    for i, m in enumerate(members):
        rows = [k for k, c in enumerate(channels) if i in plan.members_of[c] and weights.per_channel[c][i] > 0]
        if not rows:
            continue
        parts.append(Contribution(
            member=m, keep=tuple(m.run.channels.index(channels[k]) for k in rows),
            rows=torch.tensor(rows, dtype=torch.int64, device=device),
            weight=torch.tensor([weights.per_channel[channels[k]][i] for k in rows], dtype=torch.float32,
                                device=device)))
    return parts


def weight_totals(channels: Sequence[str], weights: Weights) -> np.ndarray:
    """(K,) float32 Σ w of each channel over its members with a positive weight, summed in member order in
    float32 as `cellseg.infer.members.weighted_mean` sums them."""
    totals = np.zeros(len(channels), np.float32)
    for k, c in enumerate(channels):
        for w in weights.per_channel[c]:
            if w > 0:
                totals[k] += np.float32(w)
    return totals


def predict_crop(members: Sequence[Member], target: CropTarget, store: PredictionStore, plan: ChannelPlan,
                 weights: Weights, opts: InferConfig, *, voxel_size: Sequence[float], progress: bool, rank: int,
                 attrs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One crop on the grid of `voxel_size`: column by column, every member in lockstep (module docstring),
    written a chunk of planes at a time; a partial crop left by a killed run with the same settings resumes where
    it stopped. The crop's channels are `plan`'s (those it is scored on, with `channels: scored`) in the store's
    order; `attrs` are recorded with the crop besides the common ones."""
    started = time.perf_counter()
    em = target.em()
    grid = box_grid(target.start_nm, target.stop_nm, em, voxel_size)
    require_em(em, grid, *(m.window.patch_vox for m in members), what=f"{target.name} ({target.dataset})")
    wanted = set(scored_channels(plan.channels, target.labels) if opts.channels == "scored" else plan.channels)
    channels = tuple(c for c in store.channels if c in wanted)  # a routed store holds every band's channels
    device = members[0].run.device
    parts = contributions(members, channels, plan, weights, device)
    if not parts:  # scored on none of the ensemble's channels: an empty crop, as `cellseg predict` writes it
        channels = ()
    total = torch.from_numpy(weight_totals(channels, weights)).to(device)
    streams = [(len(p.keep), p.member.window.patch_vox, context_margin(p.member.window.patch_vox)) for p in parts]
    columns = CropPlan.columns(grid.shape_vox, opts.block_vox or fused_column_vox(streams, len(channels), device))
    if not parts:
        columns = replace(columns, blocks=[])
    writer = store.crop_writer(target.name, grid, key=f"fused_column{columns.edge}", overwrite=opts.overwrite,
                               channels=channels)

    def slabs_of(column: Grid, start: int, on_tiles: Callable[[int], None]) -> Iterator[tuple[int, np.ndarray]]:
        slabs = [predict_slabs(p.member.run.model, em, column, p.member.window, num_outputs=len(p.member.run.channels),
                               keep=p.keep, start=start, on_tiles=on_tiles, host=False) for p in parts]
        return averaged_slabs(slabs, parts, total, start=start, depth=column.shape_vox[0],  # type: ignore[arg-type]
                              device=device, uint8=opts.uint8)

    def tiles_of(shape: Sequence[int], start: int) -> int:
        return sum(count_tiles(shape, p.member.window.patch_vox, opts.overlap, start_plane=start,
                               batch_size=p.member.window.batch_size) for p in parts)

    tiles = write_columns(writer, columns, slabs_of, tiles_of=tiles_of, progress=progress)
    return commit_crop(target, writer, columns, tiles=tiles, tta=opts.tta, started=started, rank=rank,
                       attrs={"members": len(parts), "tta": opts.tta, **(attrs or {})},
                       summary={"members": len(parts)}, detail=f"{len(parts)} members, ")
