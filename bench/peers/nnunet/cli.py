"""`python -m bench.peers.nnunet STEP ... --out DIR`: nnU-Net v2 on a cellseg data root, for a stated GPU-time budget,
and cellseg beside it, scored by cellseg's evaluator.

    env      create (or reuse) nnU-Net's own environment                         (env.py)
    data     the data root as an nnU-Net raw dataset: the crops of a cellseg run  (cases.py)
    train    nnU-Net's planner and preprocessing (timed apart), then its trainer for --budget-min training minutes;
             with --step-limit-min (a job's time limit) or on SIGTERM it stops with a checkpoint and exits 75,
             and the same command resumes it
    predict  nnU-Net's predictor (sliding window, mirroring) on the tuning and test crops → two cellseg stores
    cellseg  a cellseg config trained for the same budget and predicted the same way → two stores (an arm)
    ensemble an arm of arms: `cellseg ensemble` weights fitted on the tuning crops (nnU-Net as one more member)
    score    every arm decoded plainly (nnU-Net's way) and with cellseg's tuned post-processing, every era, with
             crop-bootstrap intervals and paired differences from the first arm               (scoring.py)
    all      data, train, predict, score in turn

`--quick`: everything on the CPU in a few minutes (a tiny synthetic root, the smoke classes, nnU-Net's real trainer
for a handful of iterations): the end-to-end check of the conversions both ways and of the scoring.

Budget rule: minutes of the training clock — training iterations only, the first (autotuning, compilation),
validation, checkpoints, planning and preprocessing not charged (`trainers/nnUNetTrainerBudget.py`), as
`train.time_budget_min` charges cellseg's; every other time is recorded beside it in DIR/<step>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.peers.nnunet import cases as case_io
from bench.peers.nnunet import env as nnenv
from bench.peers.nnunet.scoring import Arm, score_arms
from bench.peers.nnunet.tables import markdown
from bench.studies.quality.plan import (
    QUICK_OVERRIDES,  # the smoke configs stop at a few steps: a budget instead
)
from cellseg.runtime.checkpoint import save_atomic_text

log = logging.getLogger("bench.peers.nnunet")

REPO = Path(__file__).resolve().parents[3]
TRAINERS = Path(__file__).resolve().parent / "trainers"
TRAINER = "nnUNetTrainerBudget"
CONFIGURATION = "3d_fullres"
QUALITY_CONFIG = REPO / "configs" / "quality" / "unet_3d.yaml"
QUICK_CONFIG = REPO / "configs" / "smoke" / "unet_3d.yaml"
QUICK = {"budget_min": 0.1, "iterations": 2, "val_iterations": 1}  # seconds of CPU training: a check, not a result
# The shortest budget accepted, before anything runs: one epoch (250 iterations) took 111 s of training on an H200
# (bench/results/nnunet_peer_h200.json), so below a minute no epoch ends on any GPU measured, and nnU-Net's
# validation and checkpoint choice work per epoch. The quick mode's epochs are 2 iterations: it has its own floor.
MIN_BUDGET_MIN = 1.0
MIN_QUICK_BUDGET_MIN = 0.05
SETTINGS_FILE = "peer.json"
STOPPED = 75  # exit status of a step stopped to be resumed (the trainer's, and cellseg's commands')
STOP_RESERVE_S = 60.0  # of a step's time limit, left for nnU-Net's checkpoint and exit after it is told to stop
TRAIN_PARTIAL = "nnunet_train.partial.json"  # the wall time of the starts of a stopped training


class Stopped(Exception):
    """A step stopped before its end, to be resumed by running it again."""


@contextlib.contextmanager
def _sigterm_waits():
    """While nnU-Net trains, a SIGTERM to this process (the job's whole process group gets one) only marks the
    step stopped: nnU-Net got it too and is writing its checkpoint, which this process waits for."""
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    save_atomic_text(json.dumps(doc, indent=1) + "\n", path)


def _settings(out: Path) -> dict[str, Any]:
    path = out / SETTINGS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no converted data here (run the `data` step with this --out first)")
    return json.loads(path.read_text())


def _config(settings: dict[str, Any]) -> Any:
    from cellseg.config import load_run_config

    return load_run_config(settings["config"], [f"data.root={settings['root']}", *settings["sets"]])


def _nnunet_environ(out: Path, *, budget_min: float | None = None, iterations: int | None = None,
                    val_iterations: int | None = None, compile_: bool = True) -> dict[str, str]:
    extra = {"nnUNet_raw": str(out / "raw"), "nnUNet_preprocessed": str(out / "preprocessed"),
             "nnUNet_results": str(out / "results"), "nnUNet_extTrainer": str(TRAINERS),
             "nnUNet_compile": "t" if compile_ else "f", "PYTHONUNBUFFERED": "1"}
    if budget_min is not None:
        extra["CELLSEG_NNUNET_BUDGET_MIN"] = str(budget_min)
    if iterations is not None:
        extra["CELLSEG_NNUNET_ITERATIONS"] = str(iterations)
    if val_iterations is not None:
        extra["CELLSEG_NNUNET_VAL_ITERATIONS"] = str(val_iterations)
    return extra


def step_data(args: argparse.Namespace) -> dict[str, Any]:
    """Convert the data root (refuses to convert over an existing dataset; reuses it)."""
    out: Path = args.out
    settings = {"root": str(Path(args.root).resolve()), "config": str(Path(args.config).resolve()),
                "sets": list(args.set)}
    dataset = out / "raw" / case_io.DATASET_NAME
    if dataset.exists():
        previous = _settings(out)
        if previous != settings:
            raise ValueError(f"{out}: converted from {previous}, not {settings}: use another --out")
        log.info("%s: converted before, reused", dataset)
        return case_io.read_cases(dataset)
    from cellseg.data.loader import make_split  # noqa: F401  (fail early on a broken cellseg install)

    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    doc = case_io.convert(_config(settings), out / "raw", progress=not args.quiet)
    _write_json(out / SETTINGS_FILE, settings)
    counts = {r: sum(c["role"] == r for c in doc["cases"]) for r in ("train", "tune", "test")}
    _write_json(out / "nnunet_data.json", {"seconds": time.perf_counter() - started, "cases": counts,
                                           **{k: doc[k] for k in ("kept_share", "crop_share_of_cases")}})
    return doc


ROOT_FILES = ("datasplit.csv", "manifest.csv", "train_crop_manifest.csv", "test_crop_manifest.csv")  # what the
# split and the crops are: their bytes identify the data every arm of a run used


def data_identity(out: Path) -> dict[str, Any]:
    """What every record says of the data: the root, a sha256 of its split and manifests, the crops per role."""
    import hashlib

    settings = _settings(out)
    root = Path(settings["root"])
    digest = hashlib.sha256()
    for name in ROOT_FILES:
        if (root / name).is_file():
            digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    cases = case_io.read_cases(out / "raw" / case_io.DATASET_NAME)["cases"]
    roles = {r: sorted(c["name"] for c in cases if c["role"] == r) for r in ("train", "tune", "test")}
    return {"root": str(root), "root_sha256": digest.hexdigest(), "crops": roles}


def resources(args: argparse.Namespace, *, workers: int | None) -> dict[str, Any]:
    """The CPU cores this step may use (its affinity: `--cores`), its data workers, and the GPU with the other
    processes on it when the step started (exclusive: 0)."""
    doc: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)), "data_workers": workers, "device": args.device}
    if args.device.startswith("cuda"):
        query = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                               capture_output=True, text=True)
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                              capture_output=True, text=True)
        doc["gpu"] = query.stdout.strip() or None
        doc["gpu_processes_at_start"] = len(apps.stdout.split()) if apps.returncode == 0 else None
    return doc


def augmentation_workers(args: argparse.Namespace) -> int:
    """nnU-Net's augmentation worker processes (`nnUNet_n_proc_DA`): `--da-workers`, else the cores given less one
    for the trainer itself (0 with --quick: augmentation in the training process on a small CPU)."""
    if args.quick:
        return 0
    if args.da_workers is not None:
        return args.da_workers
    return max(1, len(os.sched_getaffinity(0)) - 1)


def _plan(out: Path) -> dict[str, Any]:
    plans = json.loads((out / "preprocessed" / case_io.DATASET_NAME / "nnUNetPlans.json").read_text())
    conf = plans["configurations"][CONFIGURATION]
    return {"spacing_nm": conf["spacing"], "patch_size_vox": conf["patch_size"], "batch_size": conf["batch_size"],
            "median_image_size_vox": conf.get("median_image_size_in_voxels"),
            "features_per_stage": conf.get("architecture", {}).get("arch_kwargs", {}).get("features_per_stage")}


def check_budget(args: argparse.Namespace) -> None:
    """Refuse a training budget shorter than one nnU-Net epoch (`MIN_BUDGET_MIN`).

    Raises:
        ValueError: naming the budget and the floor.
    """
    floor = MIN_QUICK_BUDGET_MIN if args.quick else MIN_BUDGET_MIN
    if args.budget_min < floor:
        raise ValueError(f"--budget-min {args.budget_min}: shorter than one nnU-Net epoch (at least {floor} minutes; "
                         "an epoch of 250 iterations took 111 s of training on an H200)")


def step_train(args: argparse.Namespace, env: nnenv.Env) -> dict[str, Any]:
    """Plan and preprocess (timed), then train for the budget; a finished training is reused."""
    out: Path = args.out
    _settings(out)
    check_budget(args)
    record_path = out / "nnunet_train.json"
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if record["budget_min"] == args.budget_min:
            log.info("%s: trained before for %g minutes, reused", record_path, args.budget_min)
            return record
        raise ValueError(f"{out}: trained before for {record['budget_min']} minutes, not {args.budget_min}: "
                         "use another --out (the converted data can be copied)")
    step_started = time.perf_counter()
    quick = QUICK if args.quick else {}
    extra = _nnunet_environ(out, budget_min=args.budget_min, iterations=quick.get("iterations"),
                            val_iterations=quick.get("val_iterations"), compile_=not args.no_compile)
    started = time.perf_counter()
    if not (out / "preprocessed" / case_io.DATASET_NAME / "nnUNetPlans.json").is_file():
        env.run("plan_and_preprocess", ["-d", str(case_io.DATASET_ID), "-c", CONFIGURATION, "-np",
                                        str(args.processes), "--verify_dataset_integrity"], extra,
                log_file=out / "logs" / "plan_and_preprocess.log")
        _write_json(out / "nnunet_preprocess.json", {"seconds": time.perf_counter() - started})
    preprocess_s = json.loads((out / "nnunet_preprocess.json").read_text())["seconds"]
    plan = _plan(out)
    log.info("nnU-Net's plan (%s): spacing %s nm, patch %s, batch %d; planned and preprocessed in %.1f s",
             CONFIGURATION, plan["spacing_nm"], plan["patch_size_vox"], plan["batch_size"], preprocess_s)
    folder = out / "results" / case_io.DATASET_NAME / f"{TRAINER}__nnUNetPlans__{CONFIGURATION}" / "fold_all"
    resume = (folder / "budget_state.json").is_file() and (folder / "checkpoint_latest.pth").is_file()
    partial = json.loads((out / TRAIN_PARTIAL).read_text()) if resume and (out / TRAIN_PARTIAL).is_file() else \
        {"starts_wall_s": []}
    if args.step_limit_min is not None:  # told to stop in time to checkpoint inside the step's limit
        left = args.step_limit_min * 60 - (time.perf_counter() - step_started) - STOP_RESERVE_S
        extra["CELLSEG_NNUNET_STOP_AFTER_S"] = str(max(0.0, left))
    # the augmentation workers, for training only (the planner sets torch's threads from the same variable and
    # refuses 0, the quick mode's value)
    da_workers = augmentation_workers(args)
    training = {**extra, "nnUNet_n_proc_DA": str(da_workers)}
    started_resources = resources(args, workers=da_workers)
    if resume:
        log.info("%s: resuming the stopped training (`--c`)", folder)
    started = time.perf_counter()
    with _sigterm_waits() as sigterm:
        code = env.run("train", [str(case_io.DATASET_ID), CONFIGURATION, "all", "-tr", TRAINER, "-device",
                                 args.device, *(["--c"] if resume else [])], training,
                       log_file=out / "logs" / "train.log", allow=(STOPPED,))
    partial["starts_wall_s"].append(time.perf_counter() - started)
    if code == STOPPED or sigterm:
        _write_json(out / TRAIN_PARTIAL, partial)
        state = json.loads((folder / "budget_state.json").read_text())
        raise Stopped(f"nnU-Net's training stopped at {state['charged_s']:.0f} of {args.budget_min * 60:.0f} "
                      f"charged s ({'SIGTERM' if sigterm else 'the step limit'}), checkpointed: run the train step "
                      "again to resume it")
    clock = json.loads((folder / "budget.json").read_text())
    if clock["epochs"] < 1 or clock["iterations"] < 2:
        raise ValueError(f"--budget-min {args.budget_min}: training ended before one charged iteration "
                         f"({clock['iterations']} run); give a longer budget")
    record = {"budget_min": args.budget_min, "device": args.device, "compile": not args.no_compile, "plan": plan,
              "preprocess_s": preprocess_s, "train_wall_s": sum(partial["starts_wall_s"]),
              "starts": len(partial["starts_wall_s"]), "clock": clock, "resources": started_resources,
              "data": data_identity(out), "nnunetv2": nnenv.VERSION}
    _write_json(record_path, record)
    log.info("nnU-Net trained %.2f epochs (%d iterations) in %.1f charged s (%.1f s wall with start-up)",
             clock["iterations"] / clock["iterations_per_epoch"], clock["iterations"], clock["charged_s"],
             record["train_wall_s"])
    return record


def step_predict(args: argparse.Namespace, env: nnenv.Env) -> dict[str, Any]:
    """nnU-Net's predictor on every prediction case, then the probabilities as two cellseg stores."""
    from bench.peers.nnunet.probabilities import write_store

    out: Path = args.out
    dataset = out / "raw" / case_io.DATASET_NAME
    doc = case_io.read_cases(dataset)
    cases = [case_io.Case.from_json(c) for c in doc["cases"] if c["role"] != "train"]
    predictions = out / "predictions"
    started = time.perf_counter()
    if not all((predictions / f"{c.name}.npz").is_file() for c in cases):
        env.run("predict", ["-i", str(dataset / "imagesTs"), "-o", str(predictions), "-d", str(case_io.DATASET_ID),
                            "-c", CONFIGURATION, "-f", "all", "-tr", TRAINER, "--save_probabilities", "-device",
                            args.device, "-npp", str(args.processes), "-nps", str(args.processes)],
                _nnunet_environ(out, compile_=False), log_file=out / "logs" / "predict.log")
    predict_s = time.perf_counter() - started
    started = time.perf_counter()
    classes = doc["scheme"]["classes"]
    provenance = {"source": "nnunetv2", "nnunetv2": nnenv.VERSION, "trainer": TRAINER, "configuration": CONFIGURATION,
                  "fold": "all", "tta": "mirroring (nnU-Net's default)", "data_root": doc["data_root"],
                  "voxel_size_nm": doc["voxel_size_nm"]}
    for role in ("test", "tune"):
        write_store(predictions, [c for c in cases if c.role == role], classes, out / "stores" / f"nnunet_{role}.zarr",
                    provenance=provenance)
    record = {"predict_s": predict_s, "store_s": time.perf_counter() - started, "cases": len(cases),
              "resources": resources(args, workers=args.processes), "data": data_identity(out)}
    _write_json(out / "nnunet_predict.json", record)
    return record


def step_cellseg(args: argparse.Namespace) -> dict[str, Any]:
    """A cellseg arm: `args.config` trained for the budget (validations at a third of it), predicted on the tuning
    and test crops as the nnU-Net arm is (8x TTA, cellseg's default). With `--step-limit-min` the training gets
    SIGTERM a minute before the limit (it checkpoints and exits 75, as on a cluster) and the same command resumes
    it (`cellseg train --resume auto`); predictions resume crop by crop."""
    step_started = time.perf_counter()
    out: Path = args.out
    settings = _settings(out)
    name = Path(args.config).stem
    run_dir = out / "cellseg" / name
    third = args.budget_min / 3
    cli = [sys.executable, "-m", "cellseg"]
    partial_path = out / f"cellseg_{name}.partial.json"
    partial = json.loads(partial_path.read_text()) if partial_path.is_file() and run_dir.is_dir() else \
        {"starts_wall_s": []}  # the starts of the run in `run_dir`, not of one removed since
    workers = 0 if args.quick else augmentation_workers(args)  # the same data workers as nnU-Net's
    if not (run_dir / "result.json").is_file():
        command = [*cli, "train", "--resume", "auto", str(args.config), f"data.root={settings['root']}",
                   f"run_dir={run_dir}", f"train.time_budget_min={args.budget_min}", f"train.val_every_min={third}",
                   *(["train.device=cpu"] if args.device == "cpu" else []), *(QUICK_OVERRIDES if args.quick else ()),
                   *([] if args.quick else [f"loader.num_workers={workers}"]), *args.set]
        started = time.perf_counter()
        with _sigterm_waits() as sigterm:
            proc = subprocess.Popen(command)
            left = None if args.step_limit_min is None else \
                max(0.0, args.step_limit_min * 60 - STOP_RESERVE_S - (started - step_started))
            try:
                code = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)  # cellseg checkpoints after the current step and exits 75
                sigterm.append(signal.SIGTERM)
                code = proc.wait()
        partial["starts_wall_s"].append(time.perf_counter() - started)
        _write_json(partial_path, partial)
        if code == STOPPED or (sigterm and code in (-signal.SIGTERM, 128 + signal.SIGTERM)):  # (killed before it
            # could install its handler: nothing to resume, the next start begins again)
            raise Stopped(f"{run_dir}: cellseg's training stopped with a checkpoint: run the cellseg step again to "
                          "resume it")
        if code != 0:
            raise RuntimeError(f"{run_dir}: cellseg train failed (exit {code})")
    started = time.perf_counter()
    for role, crops in (("test", "test"), ("tune", "val")):
        store = out / "stores" / f"{name}_{role}.zarr"
        subprocess.run([*cli, "predict", str(run_dir), "--crops", crops, "--out", str(store), "--tta", str(args.tta),
                        "--device", args.device], check=True)
    record = {"config": str(args.config), "budget_min": args.budget_min,
              "train_wall_s": sum(partial["starts_wall_s"]), "starts": len(partial["starts_wall_s"]),
              "predict_s": time.perf_counter() - started, "result": json.loads((run_dir / "result.json").read_text()),
              "resources": resources(args, workers=workers), "data": data_identity(out)}
    _write_json(out / f"cellseg_{name}.json", record)
    return record


def step_ensemble(args: argparse.Namespace) -> dict[str, Any]:
    """An ensemble arm of other arms (e.g. cellseg's members and nnU-Net as one more): `cellseg ensemble` with
    per-class weights fitted on the tuning crops (`--weights auto`), then the same weights on the test crops. Members
    without a class's boundary channel (nnU-Net) are left out of that channel's mean (`--allow-partial`)."""
    from cellseg.data.crops import crop_id
    from cellseg.data.prediction_store import PredictionStore

    out: Path = args.out
    settings = _settings(out)
    members = [Arm.parse(a) for a in args.arm]
    if len(members) < 2:
        raise ValueError(f"ensemble: {len(members)} --arm given, an ensemble needs at least 2")
    name = args.name or "+".join(m.name for m in members)
    tune_out, test_out = out / "stores" / f"{name}_tune.zarr", out / "stores" / f"{name}_test.zarr"
    crops = ",".join(str(crop_id(c)) for c in PredictionStore.open(members[0].tune).completed())
    cli = [sys.executable, "-m", "cellseg", "ensemble", "--allow-partial", "--device", args.device]
    started = time.perf_counter()
    if not (tune_out / "weights.json").is_file():
        subprocess.run([*cli, *(str(m.tune) for m in members), "--out", str(tune_out), "--weights", "auto",
                        "--truth", settings["root"], "--crops", crops, "--overwrite"], check=True)
    if not test_out.exists():
        subprocess.run([*cli, *(str(m.test) for m in members), "--out", str(test_out), "--weights",
                        str(tune_out / "weights.json")], check=True)
    record = {"members": [m.name for m in members], "arm": f"{name}={test_out},{tune_out}",
              "seconds": time.perf_counter() - started,
              "weights": json.loads((tune_out / "weights.json").read_text())}
    _write_json(out / f"ensemble_{name}.json", record)
    print(f"ensemble arm: --arm {record['arm']}")
    return record


def step_score(args: argparse.Namespace) -> dict[str, Any]:
    """Score the arms (default: nnU-Net's) and write `scores.json` and `scores.md` in DIR/scores."""
    out: Path = args.out
    settings = _settings(out)
    stores = out / "stores"
    arms = [Arm.parse(a) for a in args.arm] or []
    if not any(a.name == "nnunet" for a in arms):
        arms.insert(0, Arm("nnunet", stores / "nnunet_test.zarr", stores / "nnunet_tune.zarr"))
    doc = score_arms(arms, Path(settings["root"]), out / "scores", device=args.device, workers=args.processes,
                     data=data_identity(out))
    records = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.name != SETTINGS_FILE}
    (out / "scores" / "scores.md").write_text(markdown(doc, records))
    print(markdown(doc, records))
    return doc


def _quick_root(out: Path) -> Path:
    root = out / "data"
    if not (root / "datasplit.csv").is_file():
        subprocess.run([sys.executable, "-m", "cellseg", "synth", "--out", str(root), "--preset", "tiny",
                        "--workers", "2"], check=True)
    return root


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.nnunet", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", nargs="?",
                        choices=("env", "data", "train", "predict", "cellseg", "ensemble", "score", "all"),
                        default="all", help="what to do (default all: data, train, predict, score)")
    parser.add_argument("--out", type=Path, help="work folder (data, nnU-Net folders, stores, scores); every step but env")
    parser.add_argument("--quick", action="store_true", help="the CPU check: tiny synthetic root, a few iterations")
    parser.add_argument("--root", help="data root (data step; default with --quick: a tiny synthetic one in OUT/data)")
    parser.add_argument("--config", type=Path, default=None,
                        help=f"cellseg config whose split and classes the data step takes, or the arm the cellseg "
                             f"step trains (default {QUALITY_CONFIG.relative_to(REPO)}; --quick: the smoke unet_3d)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="cellseg config overrides (data step: must not change the split or the classes)")
    parser.add_argument("--budget-min", type=float, default=3.0, help="training minutes (train, cellseg; default 3)")
    parser.add_argument("--device", default="cuda", help="cuda or cpu (default cuda; --quick: cpu)")
    parser.add_argument("--no-compile", action="store_true", help="train nnU-Net without torch.compile")
    parser.add_argument("--step-limit-min", type=float, default=None, metavar="MIN",
                        help="train, cellseg: the step's time limit (a job's); the training stops a minute before it "
                             "with a checkpoint, the step exits 75 and the same command resumes (0: stop nnU-Net "
                             "after its first iteration, a check of the resume)")
    parser.add_argument("--tta", type=int, default=8, choices=(1, 8), help="cellseg arm's test-time augmentation")
    parser.add_argument("--arm", action="append", default=[], metavar="NAME=TEST.zarr,TUNE.zarr",
                        help="score: another arm's probability stores of the test and tuning crops; ensemble: a member "
                        "(repeatable)")
    parser.add_argument("--name", help="ensemble: the arm's name (default the members' names joined by +)")
    parser.add_argument("--processes", type=int, default=max(1, min(8, (os.cpu_count() or 2))),
                        help="nnU-Net's preprocessing/export processes and cellseg's scoring processes")
    parser.add_argument("--cores", type=int, default=None, metavar="N",
                        help="the CPU cores every step may use (its affinity, recorded): give each arm the same "
                             "(default: all this process may use)")
    parser.add_argument("--da-workers", type=int, default=None, metavar="N",
                        help="data workers of either arm: nnU-Net's augmentation processes (nnUNet_n_proc_DA) and "
                             "cellseg's loader.num_workers (default: the cores less one; --quick: 0)")
    parser.add_argument("--env", type=Path, default=None, help=f"nnU-Net's environment (default {nnenv.default_env()})")
    parser.add_argument("--wheels", type=Path, default=None, help="env: install from this folder of wheels, offline")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if args.out is None and args.step != "env":
        parser.error(f"{args.step} needs --out DIR")
    if args.quick:
        args.device, args.no_compile = "cpu", True
        args.budget_min = QUICK["budget_min"] if args.budget_min == 3.0 else args.budget_min
        args.config = args.config or QUICK_CONFIG
    args.config = args.config or QUALITY_CONFIG
    if args.cores is not None:
        allowed = sorted(os.sched_getaffinity(0))
        if not 1 <= args.cores <= len(allowed):
            parser.error(f"--cores {args.cores}: between 1 and the {len(allowed)} this process may use")
        os.sched_setaffinity(0, allowed[:args.cores])  # the steps' subprocesses inherit it
    if args.da_workers is not None and args.da_workers < 0:
        parser.error(f"--da-workers {args.da_workers}: 0 or more")
    return args


def main(argv: list[str] | None = None) -> int:
    from cellseg import logs

    args = parse_args(argv)
    logs.configure(logging.INFO)
    logging.getLogger("bench").setLevel(logging.INFO)
    env_dir = args.env or nnenv.default_env()
    try:
        if args.step == "env":
            nnenv.create_env(env_dir, wheels=args.wheels)
            return 0
        if args.step == "cellseg":
            step_cellseg(args)
            return 0
        if args.step == "ensemble":
            step_ensemble(args)
            return 0
        # the budget and nnU-Net's environment are checked before anything is converted or trained
        if args.step in ("train", "all"):
            check_budget(args)
        env = nnenv.find_env(env_dir) if args.step in ("train", "predict", "all") else None
        if args.step in ("data", "all"):
            if args.root is None and not args.quick:
                raise ValueError("the data step needs --root DATA_ROOT (or --quick)")
            args.root = args.root or str(_quick_root(args.out))
            step_data(args)
        if args.step in ("train", "all"):
            step_train(args, env)  # type: ignore[arg-type]
        if args.step in ("predict", "all"):
            step_predict(args, env)  # type: ignore[arg-type]
        if args.step in ("score", "all"):
            step_score(args)
    except Stopped as stop:
        print(f"stopped: {stop}", file=sys.stderr)
        return STOPPED
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
