"""Command line and orchestration: parse the options, run the stages in order (saving the report after each),
or recompute the projection of an earlier report (`--reproject`)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import cellseg
from bench.studies.test_set.downstream import ensemble_stage, postprocess_stage, submit_stage, validate_stage
from bench.studies.test_set.layout import (
    DEFAULT_SCALE,
    DOWNSTREAM,
    EXPERIMENTS,
    QUICK_MODELS,
    QUICK_SCALE,
    REPO,
    SMOKE,
)
from bench.studies.test_set.predict import fused_stage, predict_model
from bench.studies.test_set.projection import probe_channels, project
from bench.studies.test_set.records import attempt, timed
from bench.studies.test_set.report import NOTES, fmt_vox, markdown, write_report
from bench.studies.test_set.runs import build_run, make_data
from bench.studies.test_set.steady import steady_rates
from cellseg.cache import INDUCTOR_ENV
from cellseg.data.crops import Catalog, Crop


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (see `--help`; its text is the package docstring's first and last paragraphs)."""
    doc = sys.modules[__package__].__doc__ or ""
    parser = argparse.ArgumentParser(prog="python -m bench.studies.test_set", description=doc.split("\n\n")[0],
                                     epilog=doc.split("\n\n")[-1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    parser.add_argument("--scale", type=float, default=None,
                        help=f"real crop shape / synthetic crop shape (default {DEFAULT_SCALE:g}; --quick {QUICK_SCALE:g})")
    parser.add_argument("--workers", type=int, default=1, help="processes generating the synthetic data")
    parser.add_argument("--models", help="comma-separated architectures (default: every configs/experiments/*.yaml)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--work", type=Path, help="folder for data, runs and stores (default: temporary, deleted)")
    parser.add_argument("--seed", type=int, default=0, help="synthetic data seed")
    parser.add_argument("--predict-only", action="store_true",
                        help="stop after predict (keep --work; a later --downstream-from run ensembles the stores)")
    parser.add_argument("--downstream-from", type=Path, nargs="+", metavar="JSON",
                        help="no data or predict: take the predict records of these --predict-only reports (same "
                             "--seed and --scale, one per GPU: the models split among them), ensemble all their "
                             "stores and run the stages after it in --work")
    parser.add_argument("--rates", type=Path, metavar="JSON",
                        help="a bench/ensemble_steady.py report: project the ensemble and post-processing with its "
                             "costs per channel-voxel (measured on a large crop)")
    parser.add_argument("--reproject", type=Path, metavar="JSON",
                        help="run nothing: recompute the projection of this report (e.g. with --rates) into --out")
    parser.add_argument("--steady", type=Path, nargs="+", metavar="JSON",
                        help="bench/forward_probe.py reports whose engine seconds per tile (measured at the "
                             "projection's overlap 0.25) replace the models' steady-state probes (--reproject) or "
                             "price the members of --fused")
    parser.add_argument("--fused", action="store_true",
                        help="predict the ensemble in one pass (`cellseg predict-ensemble`) instead of a store per "
                             "model + `cellseg ensemble`; members are projected with the --steady rates")
    parser.add_argument("--warm-compile-cache", action="store_true",
                        help="with --fused on a GPU: a `cellseg predict-ensemble` of the smallest crop in a process "
                             "of its own first (a validation job: it fills the compile cache), so the warm-up "
                             "measures a test-set job that loads its compiled members; without it the cache is cold")
    parser.add_argument("--quick", action="store_true",
                        help=f"CPU smoke run: scale {QUICK_SCALE:g}, {' and '.join(QUICK_MODELS)} from configs/smoke")
    args = parser.parse_args(argv)
    if args.quick:
        args.device = "cpu"
        args.models = args.models or ",".join(QUICK_MODELS)
    args.scale = args.scale or (QUICK_SCALE if args.quick else DEFAULT_SCALE)
    return args


def environment(device: str) -> dict[str, Any]:
    """Where and with what the benchmark ran."""
    import torch

    from cellseg.runtime.checkpoint import git_commit

    return {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "cuda": torch.version.cuda, "cellseg": cellseg.__version__,
            "git_commit": git_commit(REPO), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "cudnn_benchmark": "on in predict_run (as `cellseg predict`)",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def run_models(args: argparse.Namespace, names: Sequence[str], work: Path, device: str, warm_crop: str,
               stages: dict[str, Any], save: Callable[[], None], real: Mapping[int, Crop]) -> None:
    """Build every run and predict the test crops with it, saving the report after each; failures are recorded."""
    builds, predicts = stages.setdefault("build_runs", {}), stages.setdefault("predict", {})
    import torch

    for name in names:
        print(f"==> {name}", flush=True)
        torch._dynamo.reset()  # architectures sharing code must not turn each other's shapes dynamic
        run_dir = work / "runs" / name
        builds[name], predicts[name] = {}, {"status": "skipped (no run)"}
        with timed(builds[name]):
            ok = attempt(builds[name], lambda n=name, r=run_dir: build_run(n, root=work / "data", run_dir=r,
                                                                          device=device, quick=args.quick))
        if ok:
            warmup = (warm_crop, work / "warmup" / f"{name}.zarr") if device == "cuda" else None
            attempt(predicts[name], lambda n=name, r=run_dir, w=warmup: predict_model(
                r, work / "predictions" / f"{n}.zarr", device=device, warmup=w, patch_vox=builds[n]["patch_shape_vox"],
                probe_channels=probe_channels(real, builds[n]["channel_names"]), quick=args.quick))
        r = predicts[name]
        if r.get("status") == "ok":
            print(f"    {r['seconds']:.1f} s ({r['load_seconds']:.1f} s load), {fmt_vox(r['voxels'])} voxels, "
                  f"{r['mvox_per_s']:.3g} Mvox/s, {r['tiles_per_s']:.3g} tiles/s", flush=True)
        save()


def run_downstream(work: Path, device: str, crop_id: int, stages: dict[str, Any], save: Callable[[], None]) -> None:
    """Ensemble → post-process → submit → validate, saving the report after each; a stage runs only when the
    one before it succeeded. `crop_id`: the smallest test crop, timed alone for each stage's cost per crop."""
    manifest = work / "data" / "test_crop_manifest.csv"
    members = [Path(r.get("store", work / "predictions" / f"{n}.zarr")) for n, r in stages.get("predict", {}).items()
               if r.get("status") == "ok"]
    seg, zip_path = work / "segmentation.zarr", work / "submission.zip"
    fused = stages.get("predict_ensemble", {}).get("status") == "ok"  # the ensemble is already written
    probs = work / ("fused.zarr" if fused else "ensemble.zarr")
    steps = {"ensemble": lambda: ensemble_stage(members, probs, f"crop{crop_id}"),
             "postprocess": lambda: postprocess_stage(probs, seg, "auto" if device == "cuda" else "cpu"),
             "submit": lambda: submit_stage(seg, manifest, zip_path, crop_id),
             "validate": lambda: validate_stage(zip_path, seg, manifest, crop_id)}
    ok = bool(members) or fused
    for stage in DOWNSTREAM:
        if fused and stage == "ensemble":
            continue
        stages[stage] = {"status": "skipped"}
        if ok:
            print(f"==> {stage}", flush=True)
            ok = attempt(stages[stage], steps[stage])
            if ok:
                print(f"    {stages[stage]['seconds']:.1f} s", flush=True)
        save()


def combine_predictions(paths: Sequence[Path], report: dict[str, Any], work: Path) -> int:
    """Fill `report` from `--predict-only` reports (one per GPU, each a share of the models, the same synthetic
    data): their data and build records, every predict record pointing at its store; `work` gets the first
    one's data (the manifest). Returns the smallest synthetic crop's id."""
    parts = [json.loads(p.read_text()) for p in paths]
    first = parts[0]
    if any(p["synthetic"]["crops"] != first["synthetic"]["crops"] for p in parts[1:]):
        raise SystemExit("--downstream-from: the reports were made on different synthetic data (--seed/--scale)")
    stages = report["stages"]
    stages["generate"], report["synthetic"] = first["stages"]["generate"], first["synthetic"]
    for part in parts:
        part_work = Path(part["args"]["work"])
        for name, record in part["stages"]["predict"].items():
            stages.setdefault("predict", {})[name] = {**record, "store": str(part_work / "predictions" / f"{name}.zarr")}
        stages.setdefault("build_runs", {}).update(part["stages"].get("build_runs", {}))
    work.mkdir(parents=True, exist_ok=True)
    shutil.copytree(Path(first["args"]["work"]) / "data", work / "data", dirs_exist_ok=True)
    report["combined_from"] = [str(p) for p in paths]
    return min(report["synthetic"]["crops"], key=lambda c: c["model_voxels"])["synthetic_id"]


def reproject(args: argparse.Namespace, rates: Mapping[str, Any] | None) -> None:
    """`--reproject`: the projection of an earlier report recomputed (with `--rates` and `--steady`), into --out."""
    report = json.loads(args.reproject.read_text())
    for name, rate in steady_rates(args.steady or []).items():
        if name in report["stages"].get("predict", {}):
            report["stages"]["predict"][name]["steady"].update(rate)
        if name in report["stages"].get("predict_ensemble", {}).get("members", {}):
            report["stages"]["predict_ensemble"]["members"][name]["steady"] = rate
    report["projection"] = project(report["stages"], Catalog.official().test("2026"), rates)
    report["rates"] = rates
    write_report(report, args.out)
    print(markdown(report))


def model_names(args: argparse.Namespace) -> list[str]:
    """The architectures to run: `--models`, or every config of configs/experiments (configs/smoke: `--quick`).

    Raises:
        SystemExit: a name has no config.
    """
    configs = SMOKE if args.quick else EXPERIMENTS
    names = args.models.split(",") if args.models else sorted(p.stem for p in configs.glob("*.yaml"))
    unknown = [n for n in names if not (configs / f"{n}.yaml").is_file()]
    if unknown:
        raise SystemExit(f"--models: no {configs.relative_to(REPO)}/<name>.yaml for {unknown}")
    return names


def run_fused(args: argparse.Namespace, names: Sequence[str], work: Path, device: str, warm_crop: str,
              stages: dict[str, Any], save: Callable[[], None]) -> None:
    """`--fused`: build every run, then one `predict_ensemble` of those that built, saving the report after each."""
    builds = stages.setdefault("build_runs", {})
    for name in names:
        builds[name] = {}
        with timed(builds[name]):
            attempt(builds[name], lambda n=name: build_run(n, root=work / "data", run_dir=work / "runs" / n,
                                                          device=device, quick=args.quick))
    save()
    print("==> predict-ensemble", flush=True)
    ok = {n: b for n, b in builds.items() if b.get("status") == "ok"}
    stages["predict_ensemble"] = {}
    attempt(stages["predict_ensemble"], lambda: fused_stage(
        ok, work, device=device, warm_crop=warm_crop, steady=steady_rates(args.steady or []),
        previous_job=args.warm_compile_cache))
    save()


def main(argv: Sequence[str] | None = None) -> int:
    """Generate, build, predict, ensemble, post-process, submit, validate, project; the report is rewritten
    after every stage (a run stopped by a time limit keeps what it measured)."""
    import torch

    args = parse_args(argv)
    rates = json.loads(args.rates.read_text()) if args.rates else None
    if args.reproject:
        reproject(args, rates)
        return 0
    device = "cuda" if (torch.cuda.is_available() if args.device == "auto" else args.device == "cuda") else "cpu"
    names = model_names(args)
    if args.predict_only and not args.work:
        raise SystemExit("--predict-only needs --work (the stores must outlive the run)")
    if args.work and args.work.exists() and any(args.work.iterdir()):
        raise SystemExit(f"--work {args.work}: not empty (runs and stores are written fresh)")
    work = args.work or Path(tempfile.mkdtemp(prefix="cellseg-test-set-"))
    os.environ[INDUCTOR_ENV] = str(work / "inductor")  # a compile cache of this run's own: cold at the start
    real = Catalog.official().test("2026")
    stages: dict[str, Any] = {}
    report = {"benchmark": "test_set", "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "environment": environment(device), "stages": stages, "notes": list(NOTES), "rates": rates}

    def save() -> None:
        report["projection"] = project(stages, real, rates)
        write_report(report, args.out)

    try:
        if args.downstream_from:
            smallest = combine_predictions(args.downstream_from, report, work)
        else:
            stages["generate"], report["synthetic"] = make_data(args, work / "data", real)
            save()
            smallest = min(report["synthetic"]["crops"], key=lambda c: c["model_voxels"])["synthetic_id"]
            if args.fused:
                run_fused(args, names, work, device, str(smallest), stages, save)
            else:
                run_models(args, names, work, device, str(smallest), stages, save, real)
        if not args.predict_only:
            run_downstream(work, device, smallest, stages, save)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(markdown(report))
    print(f"wrote {args.out}.json and {args.out}.md")
    return 0
