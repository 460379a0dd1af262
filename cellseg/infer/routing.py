"""A routed `cellseg predict-ensemble`: every crop predicted once, by the members trained at its scale, into one
store.

The test crops come at 1.74–32 nm (docs/real_data.md): an 8 nm model sees neither the detail of a 2 nm crop
nor the 36 training crops annotated only at 32 nm. A routed ensemble lists voxel-size bands, each with its own
members and weights (`ensemble.routes`, `cellseg.config.inference.RouteConfig`; configs/ensemble/routed.yaml):

    routes:
      - {band_nm: [0, 4],   members: [runs/4nm/unet_3d, runs/4nm/unet_2d]}
      - {band_nm: [4, 16],  members: [runs/unet_3d, runs/unet_2d], weights: preds/ens_val.zarr/weights.json}
      - {band_nm: [16, 64], members: [runs/32nm/unet_3d, runs/32nm/resnet_3d]}

How a crop is routed: its *scale* is the largest edge (nm) of the voxel size of its finest annotation (a test
crop has one geometry: 2 nm for crop 557 at 1.74×2×2 nm, 16 nm for crop 980 at 13.92×16×16 nm); it goes to the
band (low, high] holding that scale, and is predicted there exactly as `cellseg.infer.fused.predict_ensemble`
of that band's members predicts it (bit for bit: the same lockstep path), on the grid of the band's voxel
size. Crops of every band land in one store, each on its own grid; the store's channels are the union of the
bands' channels, and a crop holds those of its band (only those it is scored on, with `channels: scored`).

Checked before anything is predicted (a `ValueError` naming what is wrong): a crop whose scale no band holds,
bands unsorted or overlapping (`check_routes`), members of one band at different voxel sizes, members of one
band with different classes (unless `allow_partial`), bad weights, and a crop whose EM at its band's voxel size
was not downloaded though the dataset has that level (`check_em_levels`: a coarser level would be upsampled for
the band's members, on the real 16 nm test crops 13.4 grey levels off the 8 nm EM on average; the message names
the `cellseg fetch --em-levels NM` that brings it). A band whose members do not predict every
label a crop of the band is scored on is a warning naming the crops and labels (they score as empty).

A re-run resumes (complete crops are skipped, a partial one continues) when the bands, members, weights and
settings are the same; the store's provenance records the plan and each crop its band. Under torchrun the
crops of all bands are shared among the ranks, largest first.
"""

from __future__ import annotations

import datetime
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cellseg
from cellseg import runtime
from cellseg.config.inference import InferConfig, RouteConfig, check_routes
from cellseg.data.crops import Catalog, Crop, crop_id
from cellseg.data.prediction_store import PredictionStore, boundary_channel
from cellseg.infer.crop_plan import check_store_disk, pending_crops, predict_crops, shard_crops
from cellseg.infer.fused import (
    Member,
    RunChannels,
    choose_weights,
    member_targets,
    open_store,
    predict_crop,
)
from cellseg.infer.members import ChannelPlan, member_summary, plan_channels
from cellseg.infer.run import ISOTROPY_RTOL, LoadedRun, load_run, run_provenance, run_transforms
from cellseg.infer.selection import CropTarget
from cellseg.infer.weights import Weights

log = logging.getLogger(__name__)

Vec3 = tuple[float, float, float]
SCALE_RULE = "largest voxel edge (nm) of the crop's finest annotation"  # recorded in the store's provenance


@dataclass(frozen=True)
class Band:
    """One route, loaded: its members (at one voxel size), their channels, the channel plan and the weights."""

    route: RouteConfig
    members: tuple[Member, ...]
    views: tuple[RunChannels, ...]
    plan: ChannelPlan
    weights: Weights
    voxel_size_nm: Vec3

    def summary(self) -> dict[str, Any]:
        """What the store records about the band."""
        return {"band_nm": list(self.route.band_nm), "voxel_size_nm": list(self.voxel_size_nm),
                "members": member_summary(self.views),  # type: ignore[arg-type]
                "weights": self.weights.to_json(),
                "members_of": {c: list(m) for c, m in self.plan.members_of.items()}}


# ----------------------------------------------------------------------------------------------- crop scales


def annotation_scale(crop: Crop) -> tuple[Vec3, float]:
    """The voxel size (z, y, x nm) of the crop's finest annotation, and its largest edge: the crop's scale."""
    finest = min((g.voxel_size_nm for g in crop.labels.values()), key=math.prod)
    return finest, max(finest)


def crop_scales(targets: Sequence[CropTarget], root: str) -> dict[str, tuple[Vec3, float]]:
    """Crop name → (voxel size, scale) from the manifests of the data root `root` (test crops: the official
    ones for a real-data root without a test manifest, as `cellseg.infer.selection` finds them).

    Raises:
        ValueError: a crop in no manifest of the root.
    """
    catalog = Catalog.from_dir(root)
    tests = list((catalog.tests or Catalog.official().tests).values())
    scales = {}
    for target in targets:
        cid = crop_id(target.name)
        found = [t[cid] for t in tests if cid in t]
        if target.split != "test" and cid in catalog.train:  # a training or validation crop
            found.insert(0, catalog.train[cid])
        if not found:
            raise ValueError(f"{target.name}: in no manifest of {root}; its voxel size (to route it) is unknown")
        scales[target.name] = annotation_scale(found[0])
    return scales


def route_crops(targets: Sequence[CropTarget], scales: Mapping[str, tuple[Vec3, float]],
                routes: Sequence[RouteConfig]) -> dict[str, int]:
    """Crop name → index of the band holding its scale.

    Raises:
        ValueError: crops that no band holds, each named with its voxel size, and the bands.
    """
    routed, lost = {}, []
    for target in targets:
        voxel_size, scale = scales[target.name]
        bands = [i for i, route in enumerate(routes) if route.holds(scale)]
        if bands:
            routed[target.name] = bands[0]
        else:
            lost.append(f"{target.name} at {'×'.join(f'{v:g}' for v in voxel_size)} nm (scale {scale:g} nm)")
    if lost:
        raise ValueError(f"ensemble.routes: no band for {', '.join(lost)}; the bands are "
                         f"{', '.join(r.label for r in routes)}. Add or widen a band, or leave the crop out (--crops)")
    return routed


# ----------------------------------------------------------------------------------------------- the bands


def band_voxel_size(route: RouteConfig, runs: Sequence[LoadedRun]) -> Vec3:
    """The voxel size every member of the band predicts at.

    Raises:
        ValueError: members at different voxel sizes, each named with its own.
    """
    sizes = [tuple(float(v) for v in r.cfg.data.voxel_size_nm) for r in runs]
    if any(not math.isclose(a, b, rel_tol=ISOTROPY_RTOL) for s in sizes for a, b in zip(s, sizes[0], strict=True)):
        listed = "; ".join(f"{r.run_dir}: {list(s)} nm" for r, s in zip(runs, sizes, strict=True))
        raise ValueError(f"ensemble.routes band {route.label}: members at different voxel sizes ({listed}); the "
                         "members of a band predict at one voxel size")
    return sizes[0]  # type: ignore[return-value]


def load_bands(routes: Sequence[RouteConfig], members: Mapping[Path, Member], *, allow_partial: bool
               ) -> list[Band]:
    """Each route with its members (`members`: loaded, by resolved run directory), checked.

    Raises:
        ValueError: members of a band at different voxel sizes or with different classes (unless
            `allow_partial`), weights that do not fit the band's members; the message names the band.
    """
    bands = []
    for route in routes:
        band = tuple(members[Path(m).resolve()] for m in route.members)
        voxel_size = band_voxel_size(route, [m.run for m in band])
        views = tuple(RunChannels.of(m.run) for m in band)
        try:
            plan = plan_channels(views, allow_partial=allow_partial)  # type: ignore[arg-type]
            weights = choose_weights(route.weights, plan, views)
        except ValueError as err:
            raise ValueError(f"ensemble.routes band {route.label}: {err}") from None
        bands.append(Band(route, band, views, plan, weights, voxel_size))
    return bands


def check_em_levels(targets: Sequence[CropTarget], voxel_size_of: Mapping[str, Vec3]) -> None:
    """Each crop's EM must be on disk at the level its members read (the one `choose_level` picks for their voxel
    size) under the crop box, or the plan is refused: otherwise the read would fall back to a coarser level with
    data, upsampled.

    Raises:
        ValueError: naming each such crop, the level it lacks and the level it would read, and the fetch command.
    """
    lacking = []
    for t in targets:
        vs = voxel_size_of[t.name]
        shape = [max(1, math.ceil((b - a) / v - 1e-6)) for a, b, v in zip(t.start_nm, t.stop_nm, vs, strict=True)]
        em = t.em()
        want = em.choose_level(vs)
        got = em.level_with_data(t.start_nm, shape, vs)
        if got is not None and got.path != want.path:
            lacking.append((t, want, got, vs))
    if lacking:
        lines = [f"{t.name} ({t.dataset}): level {want.path} ({_nm(want.voxel_size_nm)} nm) has no chunks under the "
                 f"crop, which would be read from {got.path} ({_nm(got.voxel_size_nm)} nm) upsampled"
                 for t, want, got, _ in lacking]
        finest = min(min(vs) for *_, vs in lacking)
        ids = ",".join(str(crop_id(t.name)) for t, *_ in lacking)
        raise ValueError("the routed plan's members read EM levels that were not downloaded:\n  " + "\n  ".join(lines)
                         + f"\nfetch them with `cellseg fetch --crops {ids} --em-levels {finest:g}`")


def _nm(voxel_size_nm: Sequence[float]) -> str:
    return "x".join(f"{v:g}" for v in voxel_size_nm)


def warn_uncovered(targets: Sequence[CropTarget], routed: Mapping[str, int], bands: Sequence[Band]) -> None:
    """Warn, per band, of the labels its crops are scored on that none of its members predicts."""
    for i, band in enumerate(bands):
        gaps = {t.name: sorted(set(t.labels) - set(band.plan.classes)) for t in targets if routed[t.name] == i}
        gaps = {name: labels for name, labels in gaps.items() if labels}
        if gaps:
            listed = "; ".join(f"{name}: {', '.join(labels)}" for name, labels in gaps.items())
            log.warning("ensemble.routes band %s: no member (%s) predicts these labels its crops are scored on, "
                        "which will score as empty: %s", band.route.label,
                        ", ".join(str(m.run.run_dir) for m in band.members), listed)


def store_channels(plans: Sequence[ChannelPlan]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The routed store's channels (the bands' classes, then their boundary channels in class order) and its
    instance channels."""
    classes = list(dict.fromkeys(c for p in plans for c in p.classes))
    boundaries = [boundary_channel(c) for c in classes if any(boundary_channel(c) in p.channels for p in plans)]
    channels = (*classes, *boundaries)
    return channels, tuple(c for c in channels if any(c in p.instance_channels for p in plans))


# ----------------------------------------------------------------------------------------------- the command


def predict_routed(routes: Sequence[RouteConfig], crops: str, out: str | Path, *, allow_partial: bool = False,
                   opts: InferConfig | None = None) -> list[dict[str, Any]]:
    """Predict `crops` ("val", "test" or ids), each with the members of the band of its scale, into the one store
    `out`; returns one summary per crop this rank wrote (module docstring). Crops already in `out` are skipped;
    under torchrun the crops are shared among the ranks.

    Args:
        routes: the bands, sorted from fine to coarse, not overlapping; a run may serve several bands.
        allow_partial: the members of a band may have different classes (each class averages those having it).
        opts: the `cellseg predict` options, for every member; `axes_2d` must be "z".

    Raises:
        ValueError: no route; bands unsorted or overlapping; a crop no band holds; members of a band at different
            voxel sizes or with incompatible classes; bad weights; members that select different crops.
        FileNotFoundError: a run directory without its files or checkpoint.
    """
    opts = opts or InferConfig()
    if not routes:
        raise ValueError("ensemble.routes: no band given")
    check_routes(routes)
    if opts.axes_2d != "z":
        raise ValueError("predict-ensemble slices 2D members across z only (--axes-2d z)")
    d = runtime.init_distributed(opts.device)
    try:
        paths = list(dict.fromkeys(Path(m).resolve() for r in routes for m in r.members))
        runs = [load_run(p, opts.checkpoint, device=d.device, data_root=opts.data_root, backend=opts.backend)
                for p in paths]
        precision = runtime.resolve_precision("auto", d.device)
        runtime.configure_backends(tf32=True, cudnn_benchmark=True)
        targets = member_targets(runs, crops, opts.data_root)
        routed = route_crops(targets, crop_scales(targets, opts.data_root or runs[0].cfg.data.root), routes)
        band_members = [{Path(m).resolve() for m in r.members} for r in routes]
        served = {p: [t for t in targets if p in band_members[routed[t.name]]]
                  for p in paths}  # the crops each member predicts: the job size `compile: auto` decides by
        members = {p: Member.of(r, opts, precision, served[p]) for p, r in zip(paths, runs, strict=True)}
        bands = load_bands(routes, members, allow_partial=allow_partial)
        check_em_levels(targets, {t.name: bands[routed[t.name]].voxel_size_nm for t in targets})
        if d.is_main:
            warn_uncovered(targets, routed, bands)
        channels, instance = store_channels([b.plan for b in bands])
        provenance = _routed_provenance(runs, bands, opts, precision)
        weights_doc = {"method": "routed", "routes": [b.summary() for b in bands]}
        sizes = {t.name: bands[routed[t.name]].voxel_size_nm for t in targets}
        todo = pending_crops(lambda: open_store(out, channels, instance, provenance, weights_doc,
                                                overwrite=opts.overwrite), targets, out, d,
                             check=lambda crops: check_store_disk(out, crops, channels, sizes, opts))
        store = PredictionStore.open(out)

        def predict_one(target: CropTarget, progress: bool) -> dict[str, Any]:
            band = bands[routed[target.name]]
            return predict_crop(band.members, target, store, band.plan, band.weights, opts,
                                voxel_size=band.voxel_size_nm, progress=progress, rank=d.rank,
                                attrs={"band_nm": list(band.route.band_nm)})

        return predict_crops(shard_crops(todo, d.rank, d.world_size), predict_one, desc="predict-ensemble",
                             opts=opts, d=d)
    finally:
        runtime.shutdown_distributed()


def _routed_provenance(runs: Sequence[LoadedRun], bands: Sequence[Band], opts: InferConfig, precision: str
                       ) -> dict[str, Any]:
    """As a plain `predict-ensemble` records it, with the plan: each band's members and weights."""
    member_prov = [run_provenance(r, opts, run_transforms(r, opts.tta), ("z",), precision) for r in runs]
    roots = {str(p["data_root"]) for p in member_prov if p.get("data_root")}
    routes = [{"band_nm": list(b.route.band_nm), "members": [str(m.run.run_dir.resolve()) for m in b.members]}
              for b in bands]
    return {"ensemble": {"routed": True, "fused": True, "grid": "per band", "scale_rule": SCALE_RULE,
                         "routes": [b.summary() for b in bands]},
            "routes": routes, "member_provenance": member_prov, "members": [p["run_dir"] for p in member_prov],
            "weights": [b.weights.to_json()["channels"] for b in bands], "tta": opts.tta, "overlap": opts.overlap,
            "blend": opts.blend, "dtype": "uint8" if opts.uint8 else "float16", "channels": opts.channels,
            "precision": precision, "cellseg_version": cellseg.__version__,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            **({"data_root": roots.pop()} if len(roots) == 1 else {})}
