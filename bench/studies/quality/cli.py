"""Command line and the steps: `check`, `setup`, `train`, `report` (or `all`), and `product` (the report's decisions
through the product commands: `bench.studies.quality.product`), each resuming from the work folder."""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.studies.quality.curves import read_curve
from bench.studies.quality.document import progress_line, write_outputs
from bench.studies.quality.mps import clients_served, control_binary, mps_daemon
from bench.studies.quality.plan import (
    ARCHITECTURES,
    PLAN_FILE,
    QUICK_ARCHITECTURES,
    Job,
    Settings,
    load_plan,
    make_jobs,
    save_plan,
)
from bench.studies.quality.schedule import EXIT_RESUMABLE, Scheduler, job_done, read_schedule

STEPS = ("check", "setup", "train", "report", "product")
REPORT_FIGURES = {"overall.png": "quality_overall.png", "classes_2026.png": "quality_classes_2026.png",
                  "report.md": "quality_report.md"}  # cellseg report's files worth bringing back, renamed
EXIT_BAD_INPUT = 2
MIN_START_S = 150.0  # the least time before a train step's deadline at which a job is still started
# the least time a report is started with (a judgement): before it keeps anything it imports, builds the truth of the
# scored crops (5.7 s on the GPU host) and loads the members; with less, a `train report` call leaves it to the next
MIN_REPORT_S = 60.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (`--help`)."""
    doc = sys.modules[__package__].__doc__ or ""
    p = argparse.ArgumentParser(prog="python -m bench.studies.quality", description=doc.split("\n\n")[0],
                                epilog=doc.split("\n\n")[-1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("steps", nargs="*", metavar="STEP",
                   help=f"steps to run in order, of {', '.join(STEPS)} and all (default: all = setup, train, report)")
    p.add_argument("--out", type=Path, required=True, help="result files (JSON, Markdown, PNG)")
    p.add_argument("--work", type=Path, help="data, runs and report stores, kept between steps "
                   "(default: OUT/../quality_work)")
    p.add_argument("--quick", action="store_true", help="CPU smoke run: tiny preset, the smoke unet_3d and unet_2d")
    p.add_argument("--fresh", action="store_true", help="setup: delete an earlier plan's work folder and start over")
    p.add_argument("--architectures", help=f"comma-separated (default: {','.join(ARCHITECTURES)}); ARCH+NAME "
                   "is a second job of ARCH's config, changed by --set ARCH+NAME:KEY=VALUE (recipes side by side)")
    p.add_argument("--budget-min", type=float, help="training minutes per job (default: the configs', 3)")
    p.add_argument("--val-every-min", type=float, help="validation period in training minutes (default: the configs')")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="[ARCH:]KEY=VALUE",
                   help="a config override for every job or one architecture, e.g. unet_3d:optim.name=sgd")
    p.add_argument("--concurrent", default=None, metavar="N3D,N2D", help="3D and 2D jobs at a time (default 2,2)")
    p.add_argument("--cores", default=None, metavar="C3D,C2D", help="CPU cores per 3D and 2D job (default 3,5)")
    p.add_argument("--gpus", type=int, default=None,
                   help="GPUs to spread the jobs over, each with its own N3D,N2D slots and an equal share of the "
                        "cores (default 1; 2 runs the two waves at once)")
    p.add_argument("--mps", action="store_true",
                   help="run the jobs sharing a GPU as clients of CUDA MPS (a daemon of this user, started and "
                        "quit by the train step): their kernels run at once instead of taking turns")
    p.add_argument("--synth-workers", type=int, default=None, help="processes generating the data (default 16)")
    p.add_argument("--data-from", type=Path, metavar="ROOT",
                   help="setup: link this data root (made by cellseg synth with the plan's preset and seed, e.g. "
                        "an earlier plan's WORK/data) instead of generating it: probes on a machine that already "
                        "ran the benchmark skip the ~2 minutes of generation")
    p.add_argument("--device", choices=("auto", "cpu"), default=None, help="default auto (--quick: cpu)")
    p.add_argument("--step-limit-min", type=float, default=9.5,
                   help="wall minutes this invocation may take; training jobs are stopped (and resume in the next "
                        "train step) and the report is cut (and resumes) before it")
    p.add_argument("--predict-jobs", metavar="N|auto",
                   help="report: processes predicting the members (cellseg report --predict-jobs; default auto)")
    p.add_argument("--allow-missing", action="store_true",
                   help="report: leave out runs that did not finish their budget instead of failing")
    args = p.parse_intermixed_args(argv)  # steps after options too: `train --out O report`
    unknown = [s for s in args.steps if s not in (*STEPS, "all")]
    if unknown:
        p.error(f"unknown step(s) {unknown}: choose from {', '.join(STEPS)} or all")
    return args


def _pair(text: str | None, default: dict[str, int]) -> dict[str, int]:
    if text is None:
        return default
    try:
        a, b = (int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"expected two integers N3D,N2D, got {text!r}") from None
    return {"3d": a, "2d": b}


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings a new plan gets from the command line."""
    quick = args.quick
    archs = tuple(args.architectures.split(",")) if args.architectures else (
        QUICK_ARCHITECTURES if quick else ARCHITECTURES)
    ones = {"3d": 1, "2d": 1}
    return Settings(quick=quick, architectures=archs, preset="tiny" if quick else "quality", seed=0,
                    synth_workers=args.synth_workers or (1 if quick else 16),
                    budget_min=args.budget_min if args.budget_min is not None else (0.15 if quick else None),
                    val_every_min=args.val_every_min if args.val_every_min is not None else (0.05 if quick else None),
                    sets=tuple(args.sets), concurrent=_pair(args.concurrent, ones if quick else {"3d": 2, "2d": 2}),
                    cores=_pair(args.cores, ones if quick else {"3d": 3, "2d": 5}), gpus=1 if args.gpus is None else args.gpus,
                    mps=args.mps, device=args.device or ("cpu" if quick else "auto"))


# -------------------------------------------------------------------------------------------------------- steps


def check(settings: Settings, work: Path) -> list[Job]:
    """Resolve and check the jobs (bad input fails here, before any GPU time), and the machine's cores."""
    jobs = make_jobs(settings, work)
    available = len(os.sched_getaffinity(0))
    if settings.gpus < 1:
        raise ValueError(f"--gpus {settings.gpus}: at least 1")
    if settings.gpus > 1 and settings.device != "cpu":
        import torch

        if torch.cuda.device_count() < settings.gpus:
            raise ValueError(f"--gpus {settings.gpus}: this machine has {torch.cuda.device_count()} GPU(s)")
    if settings.mps:
        if settings.device == "cpu":
            raise ValueError("--mps shares a GPU between processes: it needs --device auto on a machine with a GPU")
        control_binary()
    share = available // settings.gpus
    for kind, cores in settings.cores.items():
        if cores < 1 or cores > share:
            raise ValueError(f"--cores: a {kind} job needs {cores} cores, this machine has {available}"
                             + (f" ({share} per GPU)" if settings.gpus > 1 else ""))
    tc = jobs[0].cfg.train
    kinds = {k: sum(j.kind == k for j in jobs) for k in ("3d", "2d")}
    waves = max(math.ceil(n / max(settings.concurrent[k] * settings.gpus, 1)) for k, n in kinds.items())
    sharing = " under MPS" if settings.mps else ""
    print(f"plan: {len(jobs)} jobs ({kinds['3d']} 3D, {kinds['2d']} 2D), {tc.time_budget_min:g} training minutes "
          f"each, validated every {tc.val_every_min:g}; {settings.concurrent['3d']} 3D + {settings.concurrent['2d']} "
          f"2D at a time on each of {settings.gpus} GPU(s){sharing}, on {settings.cores['3d']} / "
          f"{settings.cores['2d']} cores: {waves} wave(s) of {tc.time_budget_min:g} min + set-up, compilation and "
          "validation each")
    return jobs


def setup(settings: Settings, work: Path, out: Path, args: argparse.Namespace) -> int:
    """Check the plan, claim the work folder (plan.json), generate the data (once; or link `--data-from`), build
    the boundary caches."""
    old = load_plan(work)
    if old is not None and old != settings and not args.fresh:
        raise ValueError(f"{work} holds a plan made with other settings ({_differences(old, settings)}); pass "
                         "--fresh to start over, or run the later steps without changing options")
    if old is None and work.is_dir() and any(work.iterdir()):
        raise ValueError(f"--work {work} is not empty and holds no {PLAN_FILE}: choose another folder")
    jobs = check(settings, work)
    linked = None if args.data_from is None else linked_data(args.data_from, settings)
    if args.fresh and old is not None:
        shutil.rmtree(work)
    save_plan(settings, work)  # first: a setup cut short is finished by the next one
    data = work / "data"
    if linked is not None and not (data / "synth.json").is_file():
        data.symlink_to(linked, target_is_directory=True)
        print(f"data: {data} -> {linked}")
    if not (data / "synth.json").is_file():
        from cellseg.synth import generate

        # atomic: `data` appears complete or not at all, and a killed run's leftovers are removed by the next
        summary = generate(data, preset=settings.preset, seed=settings.seed, workers=settings.synth_workers)
        print(summary.format())
    warm_caches(jobs[0], settings.synth_workers)
    _write(out / "quality_setup.json", {"settings": settings.to_json(), "jobs": [_job_doc(j) for j in jobs],
                                        "data": json.loads((data / "synth.json").read_text())})
    return 0


def linked_data(root: Path, settings: Settings) -> Path:
    """`root` resolved, once its `synth.json` shows it was made with the plan's preset and seed.

    Raises:
        ValueError: naming the root and what differs (or that it is not a finished synthetic root).
    """
    made = root / "synth.json"
    if not made.is_file():
        raise ValueError(f"--data-from {root}: no synth.json there (not a finished `cellseg synth` root)")
    doc = json.loads(made.read_text())
    differs = [f"{key} {doc.get(key)!r}, the plan's {want!r}" for key, want in
               (("preset", settings.preset), ("seed", settings.seed)) if doc.get(key) != want]
    if differs:
        raise ValueError(f"--data-from {root}: made with {'; '.join(differs)}")
    return root.resolve()


def ready(work: Path) -> bool:
    """A finished setup: the plan and the data are there."""
    return (work / PLAN_FILE).is_file() and (work / "data" / "synth.json").is_file()


def warm_caches(job: Job, workers: int) -> None:
    """Build the training crops' instance-boundary caches now, in parallel, so that no training job (of the first
    wave more than of the second) spends its start on them: every job reads the same files (same crops, classes
    and voxel size; `cellseg.data.boundary_cache`)."""
    from cellseg.data.loader import make_split

    data = job.cfg.data
    if not (data.instance_boundaries and data.boundary_cache):
        return
    entries = [e for e in make_split(data) if e.split == "train"]
    context = multiprocessing.get_context("spawn")  # no inherited threads; each worker imports what it needs
    with concurrent.futures.ProcessPoolExecutor(min(workers, len(entries)), mp_context=context) as pool:
        list(pool.map(_warm_one, [(data, e) for e in entries]))


def _warm_one(task: tuple[Any, Any]) -> None:
    from cellseg.data.loader import open_crops, warm_boundary_caches

    data, entry = task
    warm_boundary_caches(open_crops([entry], data), data.voxel_size_nm)


# The settings a command line gives only when their options (of the same names) are given; the others' defaults
# would differ from a plan's without anyone asking
_GIVEN_BY_OPTIONS = ("quick", "architectures", "budget_min", "val_every_min", "sets", "concurrent", "cores", "gpus",
                     "mps", "synth_workers", "device")


def _differences(plan: Settings, asked: Settings, args: argparse.Namespace | None = None) -> str:
    """The settings `asked` gives otherwise than `plan`; with `args`, only those whose option it gives (a later
    step's command line leaves the others at their defaults)."""
    da, db = plan.to_json(), asked.to_json()
    keys = list(da) if args is None else [k for k in _GIVEN_BY_OPTIONS if getattr(args, k) not in (None, False, [])]
    return "; ".join(f"{k}: plan {da[k]!r}, given {db[k]!r}" for k in keys if da[k] != db.get(k))


def _job_doc(job: Job) -> dict[str, Any]:
    return {"arch": job.arch, "kind": job.kind, "config": str(job.config), "overrides": list(job.overrides)}


def train(settings: Settings, work: Path, out: Path, args: argparse.Namespace, *, started: float) -> int:
    """Run the jobs until they finish or the step limit; 75 when some must continue in another train step."""
    jobs = check(settings, work)
    grace_s = 45.0  # a stopped job checkpoints (a validation in flight finishes first)
    deadline = started + 60 * args.step_limit_min - grace_s - 15  # 15 s: this process's own status writing
    # A job started with MIN_START_S left reaches its first step (67-146 s after its start on an H200 shared by
    # four jobs) and trains until the deadline's checkpoint; the next `train` resumes it, so the slot is not idle.
    min_start_s = 30.0 if settings.quick else MIN_START_S
    short_s = time.monotonic() - (deadline - min_start_s)
    if short_s > 0 and not all(job_done(j) for j in jobs):
        need = args.step_limit_min + short_s / 60
        raise ValueError(f"--step-limit-min {args.step_limit_min:g} leaves too little time to start a job (one is "
                         f"started only with {min_start_s:.0f} s left before the jobs are stopped): give at least "
                         f"{math.ceil(10 * need) / 10:g}")
    with mps_daemon(work / "mps") if settings.mps else contextlib.nullcontext({}) as env:
        outcomes = Scheduler(jobs=jobs, settings=settings, work=work, deadline=deadline, grace_s=grace_s,
                             min_start_s=min_start_s, env=env).run()
    if settings.mps:
        print(f"MPS: {clients_served(work / 'mps')} client connection(s) in {work / 'mps' / 'log'}")
    progress, lines = {}, {}
    for job in jobs:
        try:
            curve = read_curve(job.run_dir, job.arch)
            progress[job.arch], lines[job.arch] = curve.to_json(), progress_line(curve)
        except (FileNotFoundError, ValueError) as err:
            progress[job.arch] = {"error": str(err)}
    _write(out / "quality_train.json", {"outcomes": outcomes, "progress": progress, "schedule": read_schedule(work)})
    width = max(map(len, outcomes), default=0)
    for arch, outcome in outcomes.items():
        print(f"{arch:{width}} {outcome:11} {lines.get(arch, '')}".rstrip())
    if all(job_done(j) for j in jobs):
        return 0
    print("some jobs have not finished their budget: run the train step again (they resume)", file=sys.stderr)
    return EXIT_RESUMABLE


def report(settings: Settings, work: Path, out: Path, args: argparse.Namespace, *, started: float) -> int:
    """The ablation over the finished runs (`cellseg report`) and the result files."""
    jobs = make_jobs(settings, work)
    missing = [j.arch for j in jobs if not job_done(j)]
    if missing and not args.allow_missing:
        raise ValueError(f"runs that have not finished their budget: {missing} (run the train step again, or pass "
                         "--allow-missing to report on the others)")
    jobs = [j for j in jobs if j.arch not in missing]
    curves = [read_curve(j.run_dir, j.arch) for j in jobs]  # a run that never validated fails here
    tuning = decision_crops(jobs)
    # INFO: the report's step lines ("==> step", "    step: N s") reach the log as they happen (no progress bars
    # off a terminal); its seconds per step are in work/report/timings.json even when the step limit cuts it
    cmd = [sys.executable, "-m", "cellseg", "report", "--runs", *(str(j.run_dir) for j in jobs),
           "--out", str(work / "report"), "--crops", "test", "--tune-crops", ",".join(tuning),
           "--device", settings.device]
    if args.predict_jobs:
        cmd += ["--predict-jobs", args.predict_jobs]
    remaining = started + 60 * args.step_limit_min - time.monotonic() - 20  # 20 s: the result files after it
    if remaining < MIN_REPORT_S:  # after `train` in the same call: too little left to load a member
        print(f"{max(remaining, 0):.0f} s left of the step limit: run the report step next", file=sys.stderr)
        return EXIT_RESUMABLE
    code = run_in_session(cmd, timeout_s=remaining)
    if code is None:
        print("the report was cut by the step limit: run the report step again (it resumes)", file=sys.stderr)
        return EXIT_RESUMABLE
    if code:
        print(f"cellseg report failed (exit {code}; its messages are above)", file=sys.stderr)
        return code
    from cellseg.report.ablation import TIMINGS_FILE

    doc = json.loads((work / "report" / "report.json").read_text())
    timings = work / "report" / TIMINGS_FILE  # every call's steps (report.json: the last call's)
    write_outputs(out, _run_doc(settings, jobs, work, missing), curves, doc,
                  json.loads(timings.read_text()) if timings.is_file() else None)
    for name, target in REPORT_FIGURES.items():
        if (work / "report" / name).is_file():
            shutil.copyfile(work / "report" / name, out / target)
    print(f"wrote {out}/quality.md, quality.json, quality_curves.png")
    return 0


def run_in_session(cmd: Sequence[str], *, timeout_s: float, grace_s: float = 10.0) -> int | None:
    """Run `cmd` in a session (process group) of its own; its exit code, or None when it was stopped at
    `timeout_s`. Stopped (at the limit, or when this process gets SIGTERM/SIGINT, as from SLURM or `timeout`):
    SIGTERM to the whole group, SIGKILL `grace_s` later, so that no worker it spawned (scoring pools) outlives
    it, holds the log's pipe open or keeps computing into the next step."""
    import signal

    proc = subprocess.Popen(list(cmd), start_new_session=True)

    def stop_group() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError):  # what is left of the group, the leader's workers included
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def on_signal(signum: int, _frame: Any) -> None:
        stop_group()
        raise SystemExit(128 + signum)

    handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_group()
        return None
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def decision_crops(jobs: Sequence[Job]) -> list[str]:
    """The ids of every validation crop, of both roles ("tuning" and "report"; every run has the same roles):
    the report scores the held-out test crops, so the validation crops the runs kept for an unbiased report are
    free for decisions, and twice as many crops make the weights and thresholds less noisy.

    Raises:
        ValueError: runs whose validation roles differ, or no validation crop.
    """
    from cellseg.data.split import ROLES_FILE, read_roles

    roles = {j.arch: read_roles(j.run_dir / ROLES_FILE) for j in jobs}
    first = jobs[0].arch
    differ = [arch for arch, r in roles.items() if r != roles[first]]
    if differ:
        raise ValueError(f"runs {differ} have other validation roles than {first} ({ROLES_FILE})")
    crops = [name.removeprefix("crop") for name in roles[first]]
    if not crops:
        raise ValueError(f"{jobs[0].run_dir / ROLES_FILE}: no validation crop to fit weights on")
    return crops


def _run_doc(settings: Settings, jobs: Sequence[Job], work: Path, missing: Sequence[str]) -> dict[str, Any]:
    import torch

    cfg = jobs[0].cfg
    return {"created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU",
            "torch": torch.__version__, "settings": settings.to_json(), "jobs": [_job_doc(j) for j in jobs],
            "missing": list(missing), "schedule": read_schedule(work),
            "setup": {"budget_min": cfg.train.time_budget_min, "val_every_min": cfg.train.val_every_min,
                      "val_metric": cfg.val.metric, "preset": settings.preset, "seed": settings.seed}}


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the requested steps; 0 when all finished, 75 when a step must be run again, 2 on bad input."""
    started = time.monotonic()
    args = parse_args(argv)
    work = args.work or args.out.resolve().parent / "quality_work"
    steps = ["setup", "train", "report"] if not args.steps or "all" in args.steps else list(dict.fromkeys(args.steps))
    try:
        asked = settings_from(args)
        for step in steps:
            if step == "check":
                check(asked, work)
                continue
            if step == "setup":
                setup(asked, work, args.out, args)
                continue
            if step in ("report", "product") and load_plan(work) is None:
                raise FileNotFoundError(f"{work}: no {PLAN_FILE}, nothing trained there: run setup and train")
            if step == "train" and not ready(work):
                setup(load_plan(work) or asked, work, args.out, args)  # nothing there: start over cleanly
            settings = load_plan(work) or asked
            differences = _differences(settings, asked, args)
            if differences:
                print(f"using the settings of {work / PLAN_FILE} ({differences}); setup --fresh changes them",
                      file=sys.stderr)
            if step == "product":
                from bench.studies.quality.product import product

                code = product(work, args.out, settings.device,
                               lambda cmd, left: run_in_session(cmd, timeout_s=max(left, 1.0)),
                               deadline=started + 60 * args.step_limit_min - 20)
                if code:
                    return code
                continue
            run = train if step == "train" else report
            code = run(settings, work, args.out, args, started=started)
            if code:
                return code
    except (ValueError, FileNotFoundError) as err:
        print(f"bench.studies.quality: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0
