"""The benchmark's pipeline: data, training, predictions, truth, ideal probabilities, scoring (the package
docstring has the steps)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]

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


def member_stores(work: Path, runs: list[Path], *, tta: int) -> list[Path]:
    """Every run's predictions of the validation and test crops (predicted once)."""
    from cellseg.config.inference import InferConfig
    from cellseg.infer.predict import predict_run

    members = []
    for run in runs:
        store = work / "predictions" / f"{run.name}.zarr"
        if not (work / "predictions" / f"{run.name}.done").is_file():
            for crops in ("val", "test"):
                predict_run(run, crops, store, InferConfig(tta=tta, device="cpu", progress=False))
            (work / "predictions" / f"{run.name}.done").write_text("")
        members.append(store)
    return members


def uniform_store(work: Path, members: list[Path]) -> Any:
    """The members averaged with uniform weights (the default-parameter rows)."""
    from cellseg.config.inference import EnsembleConfig
    from cellseg.data.prediction_store import PredictionStore
    from cellseg.infer.ensemble import ensemble

    out = work / "ensemble.zarr"
    if out.is_dir():
        return PredictionStore.open(out)
    return ensemble(EnsembleConfig(members=tuple(map(str, members))), out).store


def crop_roles(runs: list[Path], root: Path) -> dict[str, str]:
    """Crop → "tuning" (decisions are made on it), "report" (scored) or "test" (scored, held-out truth), as
    `cellseg report` plans them (`cellseg.decide.inputs`: the runs' validation_roles.csv, the root's test crops)."""
    from cellseg.data.crops import Catalog
    from cellseg.decide.inputs import check_runs, test_crops, validation_crops

    infos = check_runs(runs, checkpoint="last")
    roles = {c: "tuning" for c in validation_crops(infos, None, "tuning")}
    try:
        roles.update({c: "report" for c in validation_crops(infos, None, "report")})
    except ValueError:  # a split too small to set report crops aside: the test crops alone are scored
        pass
    roles.update({c: "test" for c in test_crops(Catalog.from_dir(root), root)})
    return roles


def truth_store(path: Path, crops: list[str], classes: Any, root: Path) -> Path:
    """The truth of `crops` in the evaluator's layout, as `cellseg report` builds it (built once)."""
    from cellseg.decide.truth import build_truth

    if not path.is_dir():
        build_truth(path, crops, classes, root)
    return path


def oracle_store(work: Path, prob: Any, truth: Path) -> Any:
    """Ideal probabilities on the ensemble's grids: each truth label's area fraction (step 6)."""
    import numpy as np
    import zarr

    from cellseg.classes import is_instance
    from cellseg.data.crops import Geometry
    from cellseg.data.prediction_store import PredictionStore
    from cellseg.eval.submit import read_single_scale

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


def score(work: Path, prob: Any, truth: Path, tag: str, *, params: Any = None,
          modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    """Per decoding grid ("model", "annotation") and era: the evaluation's per-crop scores of `prob`
    post-processed with `params` (default parameters without)."""
    from cellseg.eval.io import open_source
    from cellseg.eval.score import evaluate
    from cellseg.eval.submit import write_submission
    from cellseg.eval.validate import crops_from_truth
    from cellseg.postprocess.apply import postprocess_store
    from cellseg.postprocess.params import ParamSet

    crops = crops_from_truth(open_source(truth))
    out: dict[str, Any] = {}
    for mode in modes:
        seg = postprocess_store(prob, work / f"seg_{tag}_{mode}.zarr", params=params or ParamSet(),
                                device="cpu", progress=False, grid=mode)
        submission = work / f"submission_{tag}_{mode}.zip"
        write_submission(seg.path, crops, submission, overwrite=True)
        out[mode] = {era: evaluate(submission, truth, metric=era).crop_scores for era in ERAS}
    return out
