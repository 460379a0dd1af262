"""Whole-volume prediction on daisy (`cellseg predict-volume`): throughput, the scheduler's overhead, the cost of
cubic blocks against columns, instance stitching's cost and a projection to real datasets.

    python -m bench.predict_volume --out OUT [--quick] [--size Z,Y,X] [--only single,ensemble,tta8,instances]
    python -m bench.predict_volume --out OUT --merge JOB1/predict_volume.partial.json JOB2/... # jobs on fresh nodes

The volume is a dataset of `--size` voxels at 8 nm (default 384 × 768 × 768 = 2.3·10⁸ on a GPU, `--quick`:
32 × 48 × 64 on the CPU) tiled from the 8 nm EM of a synthetic root (`cellseg synth`, preset "small"; quick:
"tiny") and written beside it in the challenge's layout; runs are trained for `--steps` steps, four at a time on
the GPU, and only those the groups asked for need (throughput does not depend on the weights: a few steps give real
run directories whose models run as trained ones do).

- **Mvox/s** of one model (unet_3d) over the volume and of the 8-member ensemble (the eight architectures'
  `configs/experiments/<name>.yaml`; `--quick`: the unet_3d and unet_2d smoke models) over its first 128 planes,
  at TTA 1 and (on a corner of at most 128 × 384 × 384) TTA 8: voxels over the command's wall time, from the driver's start
  (workers' start-up and model loading included), and over the time predicting (the workers' first block start
  to last block end): the rate a whole cell is predicted at once the start-up is amortised;
- **daisy's overhead**: the blockwise run with one worker against the same blocks predicted one after the other
  in one process through the same engine, after loading the models (the single-process rate: the work
  `cellseg predict-ensemble` does for one crop of this size, cut into the same columns);
- **one piece, and MONAI**: the single model over the volume as one box in one process (no blocks), and
  MONAI's `sliding_window_inference` with the same model, forward, patch, overlap and blending (the plain-loop
  anchor a MONAI user has), each timed after loading the model;
- **GPU utilisation**: nvidia-smi's mean over each measurement;
- **cubes against columns**: whole-depth columns of `--column-vox`² (`--block-z-vox 0`), which predict no tile
  twice along z, against the default cubic blocks of `--block-vox`³, whose neighbours each predict the tiles
  across their shared faces (((B + patch − step) / B)³ of the tiles for blocks of B);
- **instance stitching**: the single model's column run with `--instances`: the worker-seconds inside the blocks
  of decode, merge, relabel and the label pyramid (and the run's wall time against the one without);
- **projection** in GPU-hours at the ensemble's rate while predicting (TTA 1, and 8 when measured), for jrc_hela-2
  at 8 nm and for all 22 datasets: the catalogue has no whole-volume shapes, so each dataset's volume is bounded
  below by the box around its annotated crops (train and test manifests; the tissue datasets' crops lie hundreds
  of µm apart), and the hours are also given per 10¹⁰ voxels.

Each measurement is recorded in OUT/predict_volume.partial.json as it finishes and skipped when the command runs
again, so a job time limit costs only the measurement it stopped (`--only` picks groups for one job; `--merge`
joins the partial records of jobs that ran on different nodes of one kind). Writes OUT/predict_volume.json and
OUT/predict_volume.md once every group is measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.record import hardware, record_paths
from bench.volume_engines import (
    GpuUtilisation,
    blockwise,
    monai_sliding_window,
    sig,
    single_process,
)

REPO = Path(__file__).resolve().parents[1]
NAMES = ("unet_3d", "resnet_3d", "swin_3d", "vit_3d", "unet_2d", "resnet_2d", "swin_2d", "vit_2d")
QUIET = ("train.val_every=1000000", "train.checkpoint_every=1000000", "train.log_every=1000000", "val.max_crops=1")
SOURCE = "synth-iso8-1"  # the synthetic root's 8 nm dataset, whose EM is tiled into the benchmark's volume
DATASET = "synth-tiled-8"
HELA = "jrc_hela-2"
TARGET_NM = 8.0
TTA8_MAX_VOX = (128, 384, 384)  # TTA 8 on a corner of the volume: 8 passes of the whole would not fit one job
ENSEMBLE_MAX_VOX = (128, 768, 768)  # the 8 members (about 1/8 of one model's rate) on a slab: two runs in one job
TRAIN_AT_ONCE = 4  # runs trained side by side on one GPU (the four 3D presets' peaks add up to about 95 GB)
GROUPS = ("single", "ensemble", "tta8", "instances")


def say(message: str) -> None:
    """A progress line (the GPU run is watched)."""
    print(f"[{datetime.datetime.now():%H:%M:%S}] {message}", flush=True)


def build_root(out: Path, quick: bool, size: tuple[int, int, int]) -> Path:
    """The synthetic data root with the tiled dataset of `size` voxels (both reused when OUT already has them)."""
    from cellseg.data.arrays import MultiscaleImage
    from cellseg.data.split import dataset_paths
    from cellseg.data.write import write_multiscale
    from cellseg.synth import generate

    root = out / "synth"
    if not (root / "synth.json").is_file():
        say(f"synthetic root ({'tiny' if quick else 'small'}) → {root}")
        generate(root, preset="tiny" if quick else "small", seed=0, workers=1 if quick else 16)
    em_path = Path(dataset_paths(root, DATASET)[0])
    if em_path.is_dir() and MultiscaleImage(str(em_path)).levels[0].shape_vox == size:
        return root
    source = MultiscaleImage(str(dataset_paths(root, SOURCE)[0]), expected_dtype="uint8")
    level = source.levels[0]
    tile = source.read_level(level.path)
    reps = [-(-n // t) for n, t in zip(size, tile.shape, strict=True)]
    em = np.tile(tile, reps)[:size[0], :size[1], :size[2]]
    say(f"{DATASET}: {'×'.join(map(str, size))} voxels at 8 nm tiled from {SOURCE} ({em.nbytes / 1e9:.2f} GB)")
    write_multiscale(em_path, em, voxel_size_nm=level.voxel_size_nm, translation_nm=[v / 2 for v in
                     level.voxel_size_nm], kind="em", overwrite=em_path.is_dir())
    return root


def build_runs(out: Path, root: Path, quick: bool, steps: int, names: Sequence[str]) -> list[Path]:
    """Run directories of `names` trained for `steps` steps (reused when present), `TRAIN_AT_ONCE` at a time, each
    `cellseg train` its own process on the one GPU (a run's start-up, not its steps, is most of its time here)."""
    runs = [out / "runs" / name for name in names]
    todo = [(name, run) for name, run in zip(names, runs, strict=True)
            if not (run / "checkpoints" / "last.pt").is_file()]
    for at in range(0, len(todo), 1 if quick else TRAIN_AT_ONCE):
        wave = todo[at:at + (1 if quick else TRAIN_AT_ONCE)]
        say(f"training {', '.join(n for n, _ in wave)} for {steps} steps")
        jobs = []
        for name, run in wave:
            config = REPO / "configs" / ("smoke" if quick else "experiments") / f"{name}.yaml"
            extra = ["train.device=cpu"] if quick else ["train.num_gpus=1", "train.compile=off", "loader.num_workers=2"]
            log = out / "runs" / f"{name}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            command = [sys.executable, "-m", "cellseg", "train", str(config), f"data.root={root}", f"run_dir={run}",
                       f"train.max_steps={steps}", *QUIET, *extra]
            jobs.append((name, log, subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)))
        for name, log, process in jobs:
            if process.wait():
                tail = "\n".join(log.read_text().splitlines()[-20:])
                raise RuntimeError(f"training {name} failed (exit {process.returncode}; {log}):\n{tail}")
    return runs


def job(runs: list[Path], root: Path, out: Path, *, tta: int, block: tuple[int, int | None], chunk: int,
        quick: bool, roi_vox: tuple[int, int, int] | None = None, instances: bool = False) -> Any:
    """The `cellseg predict-volume` config of one measurement: blocks of `block` = (edge, depth in z; None:
    cubes, 0: whole-depth columns), over the corner `roi_vox` of the volume (None: all of it), one worker."""
    from cellseg.config.jobs import PredictVolumeJob, load_job

    members = ", ".join(str(r) for r in runs)
    edge, depth = block
    overrides = [f"dataset={DATASET}", f"out={out}", f"ensemble.members=[{members}]", f"infer.data_root={root}",
                 f"infer.tta={tta}", "infer.checkpoint=last", "infer.compile=off", f"volume.block_vox={edge}",
                 f"volume.block_z_vox={'null' if depth is None else depth}", f"volume.chunk_vox={chunk}",
                 "volume.workers=1", "volume.cpu_workers=2"]
    if roi_vox is not None:
        roi = ",".join(f"0:{n * TARGET_NM:g}" for n in roi_vox)  # the tiled volume's grid starts at 0 nm
        overrides.append(f"volume.roi_nm='{roi}'")
    if quick:
        overrides += ["infer.device=cpu", "infer.overlap=0"]
    if instances:
        overrides.append("volume.instances=default")
    return load_job(PredictVolumeJob, None, overrides)


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



def plan(runs: list[Path], *, quick: bool, cubes: int, columns: int, size: tuple[int, int, int]
         ) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """The measurements of each group: (name, settings) with settings members, tta, block (edge, depth),
    engine ("daisy", "one process": the same blocks, "one piece": the ROI as one box, "MONAI": its
    sliding_window_inference), roi_vox and instances. Cubes of 512³ are the 512² columns on a volume 384 deep."""
    cube, column = (cubes, None), (columns, 0)
    corner = tuple(min(n, m) for n, m in zip(size, TTA8_MAX_VOX, strict=True))
    slab = tuple(min(n, m) for n, m in zip(size, ENSEMBLE_MAX_VOX, strict=True))
    one, every = runs[:1], runs

    def m(members: list[Path], block: tuple[int, int | None], engine: str = "daisy", *, tta: int = 1,
          roi: tuple[int, ...] | None = None, instances: bool = False) -> dict[str, Any]:
        return {"members": members, "tta": tta, "block": block, "engine": engine, "roi_vox": roi,
                "instances": instances}

    groups = {
        "single": [("single columns", m(one, column)), ("single columns, one process", m(one, column, "one process")),
                   ("single cubes", m(one, cube)), ("single cubes, one process", m(one, cube, "one process")),
                   ("single one piece", m(one, column, "one piece")), ("single MONAI", m(one, column, "MONAI"))],
        "ensemble": [("ensemble columns", m(every, column, roi=slab)),
                     ("ensemble columns, one process", m(every, column, "one process", roi=slab))],
        "tta8": [("single columns tta8", m(one, column, tta=8, roi=corner)),
                 ("ensemble columns tta8", m(every, column, tta=8, roi=corner)),
                 ("ensemble columns tta1 corner", m(every, column, roi=corner))],
        "instances": [("single columns + instances", m(one, column, instances=True))],
    }
    if quick:
        groups["tta8"] = []
    return groups


def expected(quick: bool) -> list[str]:
    """The names of every measurement of the record (all groups)."""
    groups = plan([Path("run")], quick=quick, cubes=1, columns=1, size=(1, 1, 1))
    return [name for g in GROUPS for name, _ in groups[g]]


def measure(name: str, spec: dict[str, Any], root: Path, stores: Path, *, chunk: int, quick: bool) -> dict[str, Any]:
    """One measurement into its own store, removed once measured (this benchmark's own output)."""
    out = stores / f"{name.replace(' ', '_').replace(',', '').replace('+', 'plus')}.zarr"
    if out.exists():
        shutil.rmtree(out)
    config = job(spec["members"], root, out, tta=spec["tta"], block=spec["block"], chunk=chunk, quick=quick,
                 roi_vox=spec["roi_vox"], instances=spec["instances"])
    engines = {"daisy": blockwise, "one process": single_process,
               "one piece": lambda c: single_process(c, one_piece=True), "MONAI": monai_sliding_window}
    with GpuUtilisation() as gpu:
        row = engines[spec["engine"]](config)
    row["gpu_util_mean"] = gpu.mean
    if out.exists():
        shutil.rmtree(out)  # measured: a store of 10⁸-10⁹ voxels × every channel is not kept (disk)
    edge, depth = spec["block"]
    return {**row, "members": len(spec["members"]), "tta": spec["tta"], "engine": spec["engine"],
            "block": "columns" if depth == 0 else "cubes", "block_vox": edge}


def ratios(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """daisy against one process on the same blocks (wall and predicting), and cubes against columns."""
    out: dict[str, dict[str, float]] = {}
    for who in ("single", "ensemble"):
        daisy, alone = runs.get(f"{who} columns"), runs.get(f"{who} columns, one process")
        if daisy and alone:
            out[who] = {"daisy_wall": daisy["wall_s"] / alone["wall_s"] - 1,
                        "daisy_predicting": daisy["predict_span_s"] / alone["predict_span_s"] - 1,
                        "rate_vs_one_process": daisy["steady_mvox_s"] / alone["steady_mvox_s"]}
        engine = ", one process" if f"{who} cubes, one process" in runs else ""  # like against like
        cubes, columns = runs.get(f"{who} cubes{engine}"), runs.get(f"{who} columns{engine}")
        if cubes and columns:
            out.setdefault(who, {})["cubes_vs_columns"] = cubes["predict_span_s"] / columns["predict_span_s"] - 1
        piece, monai, daisy = runs.get(f"{who} one piece"), runs.get(f"{who} MONAI"), runs.get(f"{who} columns")
        if piece and monai:
            out.setdefault(who, {})["one_piece_vs_monai"] = piece["steady_mvox_s"] / monai["steady_mvox_s"]
        if daisy and monai:
            out.setdefault(who, {})["columns_vs_monai"] = daisy["steady_mvox_s"] / monai["steady_mvox_s"]
    return out


def markdown(doc: dict[str, Any]) -> str:
    rows = ["| measurement | members | TTA | engine | blocks | voxels | wall s | start-up s | predicting s | "
            "pyramid worker-s | Mvox/s (wall) | Mvox/s predicting | GPU % |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in doc["runs"].items():
        shape = f"{r['blocks']} × {r['block']} of {r['block_vox']}" + ("²" if r["block"] == "columns" else "³")
        if r["engine"] in ("one piece", "MONAI"):
            shape = "one piece" + (f", output on {r['output_on']}" if "output_on" in r else "")
        rows.append(f"| {name} | {r['members']} | {r['tta']} | {r['engine']} | {shape} | "
                    f"{r['voxels']:.3g} | {r['wall_s']} | {r['startup_s']} | {r['predict_span_s']} | "
                    f"{r.get('pyramid_s', '–')} | {r['mvox_s']} | {r['steady_mvox_s']} | "
                    f"{r.get('gpu_util_mean') if r.get('gpu_util_mean') is not None else '–'} |")
    lines = [f"# predict-volume ({doc['hardware']}, {doc['date']})", "",
             f"Volume: {DATASET}, {'×'.join(map(str, doc['size_vox']))} voxels at 8 nm tiled from the synthetic "
             f"{SOURCE}; runs trained {doc['steps']} steps (speed does not depend on the weights). Wall: from the "
             "driver's start (worker start-up and model loading included); predicting: from the first block's start "
             "to the last block's end in the worker (one process: after loading the models); start-up: the "
             "worker's process start to its first block (imports, models; one process: the checks, the store and the "
             "models); pyramid worker-s: the probability levels s1.., inside blocks (CPU workers, overlapping the "
             "prediction; one process builds none). "
             f"{doc['versions']}.", "", *rows, ""]
    for who, r in doc["ratios"].items():
        parts = []
        if "daisy_predicting" in r:
            parts.append(f"daisy (1 worker) vs the same columns in one process: wall {r['daisy_wall']:+.1%}, "
                         f"predicting {r['daisy_predicting']:+.1%} (rate {r['rate_vs_one_process']:.1%} of the "
                         "single-process rate)")
        if "cubes_vs_columns" in r:
            parts.append(f"cubic blocks vs columns {r['cubes_vs_columns']:+.1%} predicting time")
        if "one_piece_vs_monai" in r:
            parts.append(f"cellseg in one piece predicts {r['one_piece_vs_monai']:.2f}× as fast as MONAI's "
                         "sliding_window_inference (same model, forward, overlap, volume)")
        if "columns_vs_monai" in r:
            parts.append(f"the daisy column run {r['columns_vs_monai']:.2f}× MONAI's rate")
        lines += [f"- **{who}**: " + "; ".join(parts) + ".", ""]
    if "instances_s" in doc:
        lines += [f"Instance stitching (decode + merge + relabel + label pyramid): {doc['instances_s']:.1f} "
                  f"worker-seconds inside blocks, {doc['instances_s_per_mvox']} s per Mvoxel (wall time of the run "
                  f"{doc['instances_wall_extra_s']:+.1f} s against the one without).", ""]
    for key, label in (("projection", "no TTA"), ("projection_tta8", "TTA 8")):
        if key in doc:
            p = doc[key]
            lines += [f"Projection at the ensemble's {p['mvox_s_per_gpu']} Mvox/s per GPU while predicting "
                      f"({label}): {p['gpu_hours_per_1e10_vox']} GPU-hours per 10¹⁰ voxels; {HELA} ≥ "
                      f"{p[HELA]['gpu_hours_lower_bound']} GPU-hours (≥ {p[HELA]['voxels_lower_bound']:.3g} voxels at "
                      f"8 nm); all {p['datasets']} datasets ≥ {p['all']['gpu_hours_lower_bound']} GPU-hours (lower "
                      "bounds: the box around each dataset's crops).", ""]
    return "\n".join(lines)


def _size(text: str) -> tuple[int, int, int]:
    values = tuple(int(v) for v in text.split(","))
    if len(values) != 3 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--size {text!r}: three positive voxel counts Z,Y,X")
    return values  # type: ignore[return-value]


def _groups(text: str) -> tuple[str, ...]:
    names = tuple(g.strip() for g in text.split(",") if g.strip())
    unknown = [g for g in names if g not in GROUPS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--only {text!r}: groups are {', '.join(GROUPS)}")
    return names


def versions() -> str:
    import daisy
    import torch

    return f"torch {torch.__version__}, daisy {getattr(daisy, '__version__', '?')}"


def record(done: dict[str, Any], out: Path, *, command: str) -> None:
    """OUT/predict_volume.json and .md from the measurements `done` (the partial record's layout)."""
    measured = done["runs"]
    doc: dict[str, Any] = {"bench": "predict_volume", "hardware": done["hardware"], "date": done["date"],
                           "versions": done["versions"], **done["settings"], "runs": measured,
                           "ratios": ratios(measured),
                           "projection": projection(measured["ensemble columns"]["steady_mvox_s"]), "command": command}
    if "ensemble columns tta8" in measured:
        doc["projection_tta8"] = projection(measured["ensemble columns tta8"]["steady_mvox_s"])
    inst = measured["single columns + instances"]
    stitching = ("decode", "merge", "relabel", *(t for t in inst["timing"] if t.startswith("pyramid-labels")))
    extra = sum(inst["timing"].get(t, {}).get("busy_s", 0.0) for t in stitching)  # worker seconds inside blocks
    doc.update(instances_s=round(extra, 2), instances_s_per_mvox=sig(extra / (inst["voxels"] / 1e6)),
               instances_wall_extra_s=round(inst["wall_s"] - measured["single columns"]["wall_s"], 2))
    json_path, md_path = record_paths(out, "predict_volume")
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    md_path.write_text(markdown(doc))
    say(f"wrote {json_path} and {md_path}")


def merge(paths: Sequence[Path]) -> dict[str, Any]:
    """The partial records of several jobs (each on a fresh node) as one: same settings and hardware, or an error.

    Raises:
        ValueError: records measured with other settings or on other hardware (named).
    """
    docs = [json.loads(p.read_text()) for p in paths]
    first = docs[0]
    for path, doc in zip(paths, docs, strict=True):
        for key in ("settings", "hardware"):
            if doc.get(key) != first.get(key):
                raise ValueError(f"{path}: {key} {doc.get(key)} differs from {paths[0]}'s {first.get(key)}")
    runs: dict[str, Any] = {}
    for doc in docs:
        runs.update(doc["runs"])
    return {**first, "runs": runs, "date": max(d["date"] for d in docs),
            "versions": " / ".join(sorted({d["versions"] for d in docs}))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the data, runs, stores and the record")
    parser.add_argument("--quick", action="store_true", help="tiny data and smoke models on the CPU")
    parser.add_argument("--size", type=_size, default=None, metavar="Z,Y,X",
                        help="the volume in voxels at 8 nm (default 384,768,768; quick 32,48,64)")
    parser.add_argument("--steps", type=int, default=2, help="training steps per run (default 2)")
    parser.add_argument("--block-vox", type=int, default=None, help="cubic block edge (default 256; quick 16)")
    parser.add_argument("--column-vox", type=int, default=None,
                        help="column edge in y and x (default 512; quick 32)")
    parser.add_argument("--only", type=_groups, default=GROUPS, metavar="G,...",
                        help=f"measure these groups only ({', '.join(GROUPS)}; default all)")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="PARTIAL",
                        help="write the record from the partial records of several jobs (nothing is measured)")
    args = parser.parse_args(argv)
    command = " ".join(sys.argv)
    if args.merge:
        args.out.mkdir(parents=True, exist_ok=True)
        done = merge(args.merge)
        missing = [name for name in expected(done["settings"]["quick"]) if name not in done["runs"]]
        if missing:
            raise SystemExit(f"--merge: not measured in {', '.join(map(str, args.merge))}: {', '.join(missing)}")
        record(done, args.out, command=command)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    size = args.size or ((32, 48, 64) if args.quick else (384, 768, 768))
    chunk = 16 if args.quick else 64
    cubes, columns = args.block_vox or (16 if args.quick else 256), args.column_vox or (32 if args.quick else 512)
    root = build_root(args.out, args.quick, size)
    names = ("unet_3d", "unet_2d") if args.quick else NAMES
    if not {"ensemble", "tta8"} & set(args.only):
        names = names[:1]  # the single model's groups train that model only
    runs = build_runs(args.out, root, args.quick, args.steps, names)
    groups = plan(runs, quick=args.quick, cubes=cubes, columns=columns, size=size)
    partial = args.out / "predict_volume.partial.json"
    settings = {"size_vox": list(size), "cubes": cubes, "columns": columns, "chunk_vox": chunk, "steps": args.steps,
                "quick": args.quick}
    done = json.loads(partial.read_text()) if partial.is_file() else {}
    if done.get("settings") != settings:  # measured with other settings: measure again
        done = {"settings": settings, "hardware": hardware(), "versions": versions(), "runs": {}}
    done["date"] = datetime.date.today().isoformat()
    for group in args.only:
        for name, spec in groups[group]:
            if name in done["runs"]:
                say(f"{name}: measured before ({done['runs'][name]['steady_mvox_s']} Mvox/s predicting)")
                continue
            say(f"{name} ({len(spec['members'])} members, TTA {spec['tta']}, {spec['engine']})")
            done["runs"][name] = row = measure(name, spec, root, args.out / "stores", chunk=chunk, quick=args.quick)
            partial.write_text(json.dumps(done, indent=2) + "\n")
            say(f"  {row['steady_mvox_s']} Mvox/s predicting, {row['mvox_s']} Mvox/s wall, {row['wall_s']} s")
    missing = [name for name in expected(args.quick) if name not in done["runs"]]
    if missing:
        say(f"not yet measured: {', '.join(missing)}; run again (with --only) to add them, or --merge the partial "
            "records of separate jobs")
        return 0
    record(done, args.out, command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
