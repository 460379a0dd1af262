"""Benchmark: scores of decoding on the model's grid (then nearest-upsampled at submission, as before) vs on each
crop's annotation grid (`cellseg postprocess --grid annotation`), per crop voxel size, in both eras.

    PYTHONPATH=. python bench/native_grids.py --out OUT/native_grids      # ~15 minutes on 2 CPU cores
    PYTHONPATH=. python bench/native_grids.py --quick --out /tmp/ng          # seconds: the test's smoke run

Steps (what `scripts/demo.sh` does, through the library):
1. `cellseg synth --preset small --seed SEED` (`--quick`: `tiny`), unless `--data` names an existing root;
2. the three demo models `configs/demo/{unet_3d,resnet_3d,unet_2d}.yaml` trained on the CPU side by side, one
   process each (`--quick`: `configs/smoke/unet_3d.yaml` and `resnet_3d.yaml`, 2 steps, 16³ patches);
3. each predicts the validation and test crops with 8× TTA (`--quick`: 1), and the members are averaged
   (uniform weights);
4. the ensemble is post-processed with the default parameters twice, `--grid model` and `--grid annotation`,
   each written as a submission at the truth's geometry and scored by `cellseg evaluate`'s code in both eras
   against the truth of the scored crops (the test crops' held-out truth and the validation crops' labels,
   built as `cellseg report` builds it);
5. the per-crop scores are pooled per annotation voxel size with each era's own rule
   (`cellseg.eval.crop_score.combine`), and over all crops;
6. the same for ideal probabilities: each truth label of the scored crops (every tested class it has), its
   area fraction on the ensemble's 8 nm grid, as a probability store decoded both ways: what the decoding alone
   changes, whatever the models' quality.
Writes `OUT.json` and `OUT.md` (the table), and keeps the work in `OUT_work/` (reused by a re-run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from anywhere, with or without PYTHONPATH=.

DEMO_MODELS = ("unet_3d", "resnet_3d", "unet_2d")
QUICK_MODELS = ("unet_3d", "resnet_3d")
QUICK_OVERRIDES = ("data.patch_shape_vox=[16,16,16]", "train.max_steps=2", "train.val_every=2",
                   "train.checkpoint_every=2")
ERAS = ("2025", "2026")
MODES = ("model", "annotation")


def make_data(work: Path, *, preset: str, seed: int) -> Path:
    """The synthetic data root (generated once)."""
    from cellseg.synth import generate

    root = work / "data"
    if not (root / "train_crop_manifest.csv").is_file():
        generate(root, preset=preset, seed=seed, workers=1)
    return root


def train_runs(work: Path, root: Path, *, quick: bool) -> list[Path]:
    """The trained runs (finished ones reused): the demo models side by side, or the quick ones in turn."""
    runs = []
    procs = []
    for name in QUICK_MODELS if quick else DEMO_MODELS:
        run = work / "runs" / name
        runs.append(run)
        if (run / "result.json").is_file():
            continue
        config = REPO / "configs" / ("smoke" if quick else "demo") / f"{name}.yaml"
        argv = [sys.executable, "-m", "cellseg", "train", str(config), f"data.root={root}", f"run_dir={run}",
                "train.device=cpu", *(QUICK_OVERRIDES if quick else ()), "--resume", "auto"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        log = open(work / f"train_{name}.log", "w")
        procs.append((name, subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        if quick:  # one at a time: the smoke runs are seconds each
            procs[-1][1].wait()
    for name, proc, log in procs:
        if proc.wait() != 0:
            raise RuntimeError(f"training {name} failed; see {log.name}")
        log.close()
    return runs


def ensemble_store(work: Path, runs: list[Path], *, tta: int) -> Any:
    """Every run's predictions of the validation and test crops, averaged (uniform weights)."""
    from cellseg.config.inference import InferConfig
    from cellseg.infer.ensemble import ensemble
    from cellseg.infer.predict import predict_run
    from cellseg.infer.store import PredictionStore

    out = work / "ensemble.zarr"
    if out.is_dir():
        return PredictionStore.open(out)
    members = []
    for run in runs:
        store = work / "predictions" / f"{run.name}.zarr"
        for crops in ("val", "test"):
            predict_run(run, crops, store, InferConfig(tta=tta, device="cpu", progress=False))
        members.append(store)
    return ensemble(members, out, weights="uniform").store


def truth_store(path: Path, crops: list[str], classes: Any, root: Path) -> Path:
    """The truth of `crops` in the evaluator's layout, as `cellseg report` builds it (built once)."""
    from cellseg.report.truth import build_truth

    if not path.is_dir():
        build_truth(path, crops, classes, root)
    return path


def oracle_store(work: Path, prob: Any, truth: Path) -> Any:
    """Ideal probabilities on the ensemble's grids: each truth label's area fraction (step 6)."""
    import numpy as np
    import zarr

    from cellseg.classes import is_instance
    from cellseg.data.crops import Geometry
    from cellseg.eval.submit import read_single_scale
    from cellseg.infer.store import PredictionStore

    out = work / "oracle.zarr"
    if out.is_dir():
        return PredictionStore.open(out)
    crops = {c.name: sorted(p.name for p in c.iterdir() if (p / ".zarray").is_file())
             for c in sorted(truth.iterdir()) if c.is_dir() and not c.name.startswith(".")}
    classes = sorted({label for labels in crops.values() for label in labels})
    store = PredictionStore.create(out, kind="probabilities", channels=classes,
                                   instance_channels=[c for c in classes if is_instance(c)],
                                   provenance=dict(prob.provenance))
    for crop, labels in crops.items():
        grid = prob.grid(crop)
        target = Geometry(voxel_size_nm=grid.voxel_size_nm, translation_nm=grid.translation_nm,
                          shape_vox=grid.shape_vox)
        writer = store.crop_writer(crop, grid, channels=labels)
        for label in labels:
            array = zarr.open_array(str(truth / crop / label), mode="r")
            mask = (np.asarray(array[...]) > 0).astype(np.float32)
            step = grid.voxel_size_nm[0] / float(array.attrs["voxel_size"][0])
            writer.write(label, read_single_scale(mask, tuple(array.attrs["voxel_size"]),
                                                  tuple(array.attrs["translation"]), target,
                                                  "area" if step > 1 else "linear").astype(np.float32))
        writer.commit({**prob.crop_attrs(crop), "oracle": True})
    return store


def score(work: Path, prob: Any, truth: Path, tag: str) -> dict[str, Any]:
    """Per mode and era: the evaluation's per-crop scores (step 4)."""
    from cellseg.eval.io import open_source
    from cellseg.eval.score import evaluate
    from cellseg.eval.submit import write_submission
    from cellseg.eval.validate import crops_from_truth
    from cellseg.postprocess.apply import postprocess_store
    from cellseg.postprocess.params import ParamSet

    crops = crops_from_truth(open_source(truth))
    out: dict[str, Any] = {}
    for mode in MODES:
        seg = postprocess_store(prob, work / f"seg_{tag}_{mode}.zarr", params=ParamSet(), device="cpu",
                                progress=False, grid=mode)
        submission = work / f"submission_{tag}_{mode}.zip"
        write_submission(seg.path, crops, submission, overwrite=True)
        out[mode] = {era: evaluate(submission, truth, metric=era).crop_scores for era in ERAS}
    return out


def band_of(scores: dict[str, Any]) -> str:
    """A crop's voxel-size band: its labels' voxel size (z×y×x nm; "mixed" when they differ)."""
    sizes = {"×".join(f"{float(v):g}" for v in s["voxel_size"]) for s in scores.values()}
    return sizes.pop() if len(sizes) == 1 else "mixed"


def pool(crop_scores: dict[str, Any]) -> dict[str, Any]:
    """Step 5: per band and over all crops, each era's pooled scores of both modes."""
    from cellseg.eval.crop_score import combine

    bands: dict[str, list[str]] = defaultdict(list)
    for crop, labels in crop_scores["model"]["2026"].items():
        bands[band_of(labels)].append(crop)
    bands["all"] = sorted(c for crops in bands.values() for c in crops)
    table: dict[str, Any] = {}
    for band, crops in bands.items():
        table[band] = {"crops": sorted(crops), "voxels": sum(
            max(s["num_voxels"] for s in crop_scores["model"]["2026"][c].values()) for c in crops)}
        for era in ERAS:
            for mode in MODES:
                pooled = combine({c: crop_scores[mode][era][c] for c in crops}, era)
                table[band][f"{mode}_{era}"] = {k: pooled[k] for k in ("overall_score", "overall_instance_score",
                                                                       "overall_semantic_score")}
                table[band][f"{mode}_{era}"]["classes"] = {
                    name: s.get("combined_score", s.get("iou")) for name, s in pooled["label_scores"].items()}
    return table


def _finite(value: Any) -> Any:
    """`value` with NaN replaced by None, for JSON."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def markdown(doc: dict[str, Any]) -> str:
    """The tables of OUT.md: overall / semantic / instance scores per band, era and mode; per class."""
    lines = [f"Decoded on the model grid (then nearest-upsampled) vs on the annotation grid: {doc['preset']} preset, "
             f"seed {doc['seed']}, models {', '.join(doc['models'])}, TTA {doc['tta']}, uniform ensemble, default "
             "post-processing parameters.", ""]
    lines += _tables(doc["bands"], "the models' ensemble")
    lines += ["", "The same with ideal probabilities (each truth label's area fraction on the model's 8 nm grid: what "
              "the decoding alone changes, for every class with truth):", ""]
    lines += _tables(doc["oracle_bands"], "ideal probabilities")
    return "\n".join(lines) + "\n"


def _tables(bands: dict[str, Any], what: str) -> list[str]:
    lines = [f"| crop voxel size (nm) | crops | era | overall: model → annotation ({what}) | semantic | instance |",
             "|---|---|---|---|---|---|"]
    for band, row in bands.items():
        for era in ERAS:
            m, a = row[f"model_{era}"], row[f"annotation_{era}"]
            cells = [f"{_fmt(m[k])} → {_fmt(a[k])}" for k in ("overall_score", "overall_semantic_score",
                                                              "overall_instance_score")]
            lines.append(f"| {band} | {len(row['crops'])} | {era} | " + " | ".join(cells) + " |")
    lines += ["", f"Per class ({what}; 2026, all crops; IoU for semantic classes, combined score for instance "
              "classes):", "", "| class | model grid | annotation grid |", "|---|---|---|"]
    everything = bands["all"]
    for name, value in sorted(everything["model_2026"]["classes"].items()):
        lines.append(f"| {name} | {_fmt(value)} | {_fmt(everything['annotation_2026']['classes'][name])} |")
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output path without extension (OUT.json, OUT.md, OUT_work/)")
    parser.add_argument("--seed", type=int, default=11, help="seed of the synthetic data (default 11)")
    parser.add_argument("--data", help="an existing synthetic data root instead of generating one")
    parser.add_argument("--quick", action="store_true", help="tiny preset, two smoke models, 2 steps, no TTA")
    args = parser.parse_args(argv)
    from cellseg.classes import tested_classes

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out)
    work = out.parent / f"{out.name}_work"
    work.mkdir(parents=True, exist_ok=True)
    preset, tta = ("tiny", 1) if args.quick else ("small", 8)
    root = Path(args.data) if args.data else make_data(work, preset=preset, seed=args.seed)
    runs = train_runs(work, root, quick=args.quick)
    prob = ensemble_store(work, runs, tta=tta)
    truth = truth_store(work / "truth.zarr", prob.completed(), prob.classes, root)
    crop_scores = score(work, prob, truth, "ensemble")
    oracle_truth = truth_store(work / "truth_all.zarr", prob.completed(), tested_classes(), root)
    oracle_scores = score(work, oracle_store(work, prob, oracle_truth), oracle_truth, "oracle")
    import numpy as np
    import torch

    doc: dict[str, Any] = {"preset": preset, "seed": args.seed, "data": str(root), "models": [r.name for r in runs], "tta": tta,
           "bands": _finite(pool(crop_scores)), "oracle_bands": _finite(pool(oracle_scores)),
           "machine": f"{platform.node()} ({os.cpu_count()} cores)", "python": platform.python_version(),
           "load_average": os.getloadavg(),
           "numpy": np.__version__, "torch": torch.__version__, "date": datetime.date.today().isoformat()}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))
    return doc


if __name__ == "__main__":
    main()
