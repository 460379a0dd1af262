"""Whole-volume prediction on daisy (`cellseg predict-volume`): throughput, the scheduler's overhead, instance
stitching's cost and a projection to real datasets.

    python -m bench.predict_volume --out OUT [--quick] [--steps 2] [--block-vox 128]

On the 8 nm dataset of a synthetic root (`cellseg synth`; preset "small": 192³ voxels, `--quick`: "tiny", an ROI
of 32 × 48 × 64 voxels, on the CPU), with runs trained for `--steps` steps (throughput does not depend on the
weights: a few steps give real run directories whose models run as trained ones do):

- **Mvox/s** of one model (unet_3d) and of the 8-member ensemble (the eight architectures'
  `configs/experiments/<name>.yaml`; `--quick`: the unet_3d and unet_2d smoke models), at TTA 1 and 8: ROI voxels
  over the command's wall time, from the driver's start (workers' start-up and model loading included);
- **daisy's overhead**: the blockwise run with one worker against the same blocks predicted one after the other
  `cellseg predict`-style in one process through the same engine (models loaded, then the blocks), on wall time
  and on the time predicting (the workers' first block start to last block end, against the one process after
  loading its models: what remains once a large volume has amortised the start-up); and the cost of blocking
  itself: the same blocks against the whole ROI in one piece (tiles across block faces are predicted by both
  neighbours, ((B + patch - step) / B)³ of the tiles for blocks of B);
- **instance stitching**: the same single-model run with `--instances`: the worker-seconds inside the blocks of
  decode, merge, relabel and the label pyramid (and the run's wall time against the one without);
- **projection** in GPU-hours at the ensemble's rate while predicting (TTA 1, and 8 when measured), for jrc_hela-2
  at 8 nm and for all 22 datasets:
  the catalogue has no whole-volume shapes, so each dataset's volume is bounded below by the box around its
  annotated crops (train and test manifests), and the hours are also given per 10¹⁰ voxels.

Writes OUT/predict_volume.json and OUT/predict_volume.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from bench.record import hardware, record_paths

REPO = Path(__file__).resolve().parents[1]
NAMES = ("unet_3d", "resnet_3d", "swin_3d", "vit_3d", "unet_2d", "resnet_2d", "swin_2d", "vit_2d")
QUIET = ("train.val_every=1000000", "train.checkpoint_every=1000000", "train.log_every=1000000", "val.max_crops=1")
DATASET = "synth-iso8-1"
QUICK_ROI_NM = "796:1052,396:780,1196:1708"  # tiny preset: 32 × 48 × 64 voxels from the volume's corner
HELA = "jrc_hela-2"
TARGET_NM = 8.0


def say(message: str) -> None:
    """A progress line (the GPU run is watched)."""
    print(f"[{datetime.datetime.now():%H:%M:%S}] {message}", flush=True)


def build_root(out: Path, quick: bool) -> Path:
    """The synthetic data root (reused when OUT already has it)."""
    from cellseg.synth import generate

    root = out / "synth"
    if not (root / "synth.json").is_file():
        say(f"synthetic root ({'tiny' if quick else 'small'}) → {root}")
        generate(root, preset="tiny" if quick else "small", seed=0, workers=1 if quick else 16)
    return root


def build_runs(out: Path, root: Path, quick: bool, steps: int) -> list[Path]:
    """Run directories trained for `steps` steps (reused when present)."""
    from cellseg.config import load_run_config
    from cellseg.train.trainer import train

    names = ("unet_3d", "unet_2d") if quick else NAMES
    runs = []
    for name in names:
        run_dir = out / "runs" / name
        if not (run_dir / "checkpoints" / "last.pt").is_file():
            say(f"training {name} for {steps} steps")
            config = REPO / "configs" / ("smoke" if quick else "experiments") / f"{name}.yaml"
            extra = ["train.device=cpu"] if quick else ["train.num_gpus=1", "train.compile=off"]
            train(load_run_config(config, [f"data.root={root}", f"run_dir={run_dir}", f"train.max_steps={steps}",
                                           *QUIET, *extra]))
        runs.append(run_dir)
    return runs


def job(runs: list[Path], root: Path, out: Path, *, tta: int, block: int, quick: bool, workers: int = 1,
        instances: bool = False) -> Any:
    """The `cellseg predict-volume` config of one measurement."""
    from cellseg.config.jobs import PredictVolumeJob, load_job

    members = ", ".join(str(r) for r in runs)
    overrides = [f"dataset={DATASET}", f"out={out}", f"ensemble.members=[{members}]", f"infer.data_root={root}",
                 f"infer.tta={tta}", "infer.checkpoint=last", "infer.compile=off", f"volume.block_vox={block}",
                 f"volume.workers={workers}", "volume.cpu_workers=2"]
    if quick:
        overrides += ["infer.device=cpu", "infer.overlap=0", "volume.chunk_vox=32", f"volume.roi_nm='{QUICK_ROI_NM}'"]
    if instances:
        overrides.append("volume.instances=default")
    return load_job(PredictVolumeJob, None, overrides)


def blockwise(config: Any) -> dict[str, Any]:
    """One daisy run, timed from the driver's start."""
    from cellseg.volume.driver import predict_volume

    start = time.perf_counter()
    result = predict_volume(config, progress=False)
    wall = time.perf_counter() - start
    from cellseg.volume.store import VolumeStore

    store = VolumeStore.open(config.out)
    voxels = math.prod(store.grid.shape_vox)
    if not result.ok:
        raise RuntimeError(f"{config.out}: the run failed: {result.failed} {result.errors}")
    timing = result.timing.get("predict", {})
    span = timing.get("span_s") or wall
    return {"wall_s": round(wall, 2), "voxels": voxels, "mvox_s": sig(voxels / wall / 1e6),
            "predict_span_s": round(span, 2), "worker_startup_s": timing.get("startup_s"),
            "steady_mvox_s": sig(voxels / span / 1e6), "blocks": result.tasks["predict"]["total"],
            "tasks": result.tasks, "timing": result.timing}


def single_process(config: Any, *, blocks: bool = False) -> dict[str, Any]:
    """The same ROI `cellseg predict`-style: one process, models loaded, then through the same engine the whole
    box in one piece, or (`blocks`) the blockwise run's blocks one after the other (no scheduler)."""
    from cellseg.volume.driver import prepare
    from cellseg.volume.plan import block_boxes
    from cellseg.volume.predict import BlockPredictor

    start = time.perf_counter()
    store = prepare(config).store  # the checks and an empty store, as the blockwise run pays them
    predictor = BlockPredictor.of(store, config.infer.device)
    loaded = time.perf_counter()
    whole = ((0, 0, 0), store.grid.shape_vox)
    for box in block_boxes(store.grid.shape_vox, store.block_vox) if blocks else [whole]:
        predictor.write(box)
    end = time.perf_counter()
    voxels = math.prod(store.grid.shape_vox)
    return {"wall_s": round(end - start, 2), "load_s": round(loaded - start, 2), "voxels": voxels,
            "mvox_s": sig(voxels / (end - start) / 1e6), "predict_span_s": round(end - loaded, 2),
            "steady_mvox_s": sig(voxels / (end - loaded) / 1e6)}


def dataset_boxes() -> dict[str, float]:
    """Voxels at 8 nm of the box around each dataset's annotated crops (a lower bound of its EM volume)."""
    from cellseg.data.crops import Catalog

    catalog = Catalog.official()
    lo: dict[str, list[float]] = {}
    hi: dict[str, list[float]] = {}
    crops = list(catalog.train.values()) + [c for t in catalog.tests.values() for c in t.values()]
    for crop in crops:
        for grid in crop.labels.values():
            start, size = grid.start_nm, grid.extent_nm
            a = lo.setdefault(crop.dataset, list(start))
            b = hi.setdefault(crop.dataset, [s + n for s, n in zip(start, size, strict=True)])
            for d in range(3):
                a[d] = min(a[d], start[d])
                b[d] = max(b[d], start[d] + size[d])
    return {ds: math.prod((b - a) / TARGET_NM for a, b in zip(lo[ds], hi[ds], strict=True)) for ds in lo}


def sig(x: float) -> float:
    """Four significant digits (rates span 10⁻³ on a loaded CPU to 10² on a GPU)."""
    return float(f"{x:.4g}")


def projection(mvox_s: float) -> dict[str, Any]:
    """GPU-hours at `mvox_s` per GPU (the rate while predicting: start-up is negligible over hours) for jrc_hela-2
    and all datasets (crop-box lower bounds, listed per dataset), and per 10¹⁰ voxels."""
    boxes = dataset_boxes()
    hours = {ds: v / (mvox_s * 1e6) / 3600 for ds, v in boxes.items()}
    return {"mvox_s_per_gpu": mvox_s, "gpu_hours_per_1e10_vox": sig(1e10 / (mvox_s * 1e6) / 3600),
            "datasets": len(boxes), HELA: {"voxels_lower_bound": round(boxes.get(HELA, 0.0)),
                                           "gpu_hours_lower_bound": sig(hours.get(HELA, 0.0))},
            "all": {"voxels_lower_bound": round(sum(boxes.values())), "gpu_hours_lower_bound": sig(sum(hours.values()))},
            "per_dataset_voxels_lower_bound": {ds: round(v) for ds, v in sorted(boxes.items())}}


def markdown(doc: dict[str, Any]) -> str:
    rows = ["| measurement | members | TTA | blocks | wall s | Mvox/s | predicting s | Mvox/s predicting |",
            "|---|---|---|---|---|---|---|---|"]
    for name, r in doc["runs"].items():
        rows.append(f"| {name} | {r['members']} | {r['tta']} | {r.get('blocks', 1)} | {r['wall_s']} | {r['mvox_s']} "
                    f"| {r['predict_span_s']} | {r['steady_mvox_s']} |")
    o = doc["overhead"]
    p = doc["projection"]
    return "\n".join([
        f"# predict-volume ({doc['hardware']}, {doc['date']})", "",
        f"ROI: {doc['roi_vox']} voxels of {DATASET} at 8 nm; runs trained {doc['steps']} steps (speed does not "
        f"depend on the weights). Wall: from the driver's start (worker start-up and model loading included); "
        "predicting: from the first block's start to the last block's end in the workers (one process: after "
        "loading the models).", "", *rows, "",
        f"daisy (1 worker) vs the same blocks predicted one after the other in one process, TTA 1: wall "
        f"{o['single']['wall']:+.1%} (single model), {o['ensemble']['wall']:+.1%} (ensemble); predicting only "
        f"{o['single']['steady']:+.1%}, {o['ensemble']['steady']:+.1%}. The blocks against one piece in one "
        f"process (the tiles across block faces predicted by both neighbours): {o['single']['blocking']:+.1%}, "
        f"{o['ensemble']['blocking']:+.1%}; larger `--block-vox` shrinks it.", "",
        f"Instance stitching (decode + merge + relabel + label pyramid): {doc['instances_s']:.1f} worker-seconds "
        f"inside blocks, {doc['instances_s_per_mvox']} s per Mvoxel (wall time of the run "
        f"{doc['instances_wall_extra_s']:+.1f} s against the one without).", "",
        f"Projection at the ensemble's {p['mvox_s_per_gpu']} Mvox/s per GPU while predicting (no TTA): "
        f"{p['gpu_hours_per_1e10_vox']} "
        f"GPU-hours per 10¹⁰ voxels; {HELA} ≥ {p[HELA]['gpu_hours_lower_bound']} GPU-hours "
        f"(≥ {p[HELA]['voxels_lower_bound']:.3g} voxels at 8 nm); all {p['datasets']} datasets ≥ "
        f"{p['all']['gpu_hours_lower_bound']} GPU-hours (lower bounds: the box around each dataset's crops).", ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the data, runs, stores and the record")
    parser.add_argument("--quick", action="store_true", help="tiny data and smoke models on the CPU")
    parser.add_argument("--steps", type=int, default=2, help="training steps per run (default 2)")
    parser.add_argument("--block-vox", type=int, default=None, help="write block edge (default 128; quick 32)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    block = args.block_vox or (32 if args.quick else 128)
    root = build_root(args.out, args.quick)
    runs = build_runs(args.out, root, args.quick, args.steps)
    stores = args.out / "stores"
    if stores.exists():
        import shutil

        shutil.rmtree(stores)  # this benchmark's own outputs, rebuilt every time
    measured: dict[str, dict[str, Any]] = {}
    plan = [("single", runs[:1], 1), ("ensemble", runs, 1)]
    if not args.quick:
        plan += [("single tta8", runs[:1], 8), ("ensemble tta8", runs, 8)]
    for name, members, tta in plan:
        say(f"blockwise: {name} ({len(members)} members, TTA {tta})")
        row = blockwise(job(members, root, stores / f"{name.replace(' ', '_')}.zarr", tta=tta, block=block,
                            quick=args.quick))
        measured[name] = {**row, "members": len(members), "tta": tta}
        say(f"  {row['mvox_s']} Mvox/s, {row['wall_s']} s")
    overhead: dict[str, dict[str, float]] = {}
    for name, members in (("single", runs[:1]), ("ensemble", runs)):
        rows = {}
        for blocks in (False, True):
            label = f"{name} one process{', same blocks' if blocks else ''}"
            say(label)
            rows[blocks] = single_process(job(members, root, stores / f"{label.replace(' ', '_').replace(',', '')}"
                                              ".zarr", tta=1, block=block, quick=args.quick), blocks=blocks)
            measured[label] = {**rows[blocks], "members": len(members), "tta": 1}
        daisy_row, same, piece = measured[name], rows[True], rows[False]
        overhead[name] = {"wall": daisy_row["wall_s"] / same["wall_s"] - 1,
                          "steady": daisy_row["predict_span_s"] / same["predict_span_s"] - 1,
                          "blocking": same["predict_span_s"] / piece["predict_span_s"] - 1}
        say(f"  daisy vs the same blocks in one process: wall {overhead[name]['wall']:+.1%}, predicting "
            f"{overhead[name]['steady']:+.1%}; blocks vs one piece {overhead[name]['blocking']:+.1%}")
    say("blockwise with --instances")
    inst = blockwise(job(runs[:1], root, stores / "instances.zarr", tta=1, block=block, quick=args.quick,
                         instances=True))
    measured["single + instances"] = {**inst, "members": 1, "tta": 1}
    stitching = ("decode", "merge", "relabel", *(t for t in inst["timing"] if t.startswith("pyramid-labels")))
    extra = sum(inst["timing"].get(t, {}).get("busy_s", 0.0) for t in stitching)  # worker seconds inside blocks
    doc = {"bench": "predict_volume", "hardware": hardware(), "date": datetime.date.today().isoformat(),
           "quick": args.quick, "steps": args.steps, "block_vox": block, "roi_vox": measured["single"]["voxels"],
           "runs": measured, "overhead": overhead, "instances_s": round(extra, 2),
           "instances_s_per_mvox": sig(extra / (inst["voxels"] / 1e6)),
           "instances_wall_extra_s": round(inst["wall_s"] - measured["single"]["wall_s"], 2),
           "projection": projection(measured["ensemble"]["steady_mvox_s"]),
           **({"projection_tta8": projection(measured["ensemble tta8"]["steady_mvox_s"])}
              if "ensemble tta8" in measured else {}),
           "total_s": round(time.perf_counter() - started, 1), "command": " ".join(sys.argv)}
    json_path, md_path = record_paths(args.out, "predict_volume")
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    md_path.write_text(markdown(doc))
    say(f"wrote {json_path} and {md_path} in {doc['total_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
