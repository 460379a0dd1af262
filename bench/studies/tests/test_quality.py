"""bench/studies/quality runs end to end on CPU (`--quick`), so that the GPU run is known to start, train, report and
write its result files; bad input fails before any training; the scheduler stops jobs at the step limit and a
later step resumes them."""

from __future__ import annotations

import importlib
import json
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest

from cellseg.data.write import process_alive

REPO = Path(__file__).resolve().parents[3]


def load(module: str = "bench.studies.quality"):
    """A module of the `bench.studies.quality` package of this checkout (run from the repository root)."""
    return importlib.import_module(module)


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(out, work) of one `--quick` run of every step."""
    root = tmp_path_factory.mktemp("quality")
    out, work = root / "out", root / "work"
    assert load().main(["--quick", "--out", str(out), "--work", str(work)]) == 0
    return out, work


def test_quick_run_writes_the_result_files(quick: tuple[Path, Path]) -> None:
    out, work = quick
    assert {p.name for p in out.iterdir()} >= {"quality.md", "quality.json", "quality_curves.png", "quality_setup.json",
                                               "quality_train.json", "quality_overall.png", "quality_report.md"}
    doc = json.loads((out / "quality.json").read_text())
    assert [c["arch"] for c in doc["curves"]] == ["unet_3d", "unet_2d"]
    for curve in doc["curves"]:
        minutes = [p["train_min"] for p in curve["points"]]
        assert len(minutes) == 3 and minutes == sorted(minutes) and minutes[-1] >= 0.15  # 3 validations, the last at the budget
        assert all(p["job_min"] > p["train_min"] for p in curve["points"])  # set-up and validation are not charged
        assert curve["plateaued"] in (True, False) and curve["steps"] > 0
        assert 0.0 <= curve["data_wait_frac"] <= 1.0  # the loop's median share waiting for batches
        assert curve["data_placement"] == "host"  # resident in host memory: the CPU run's default (data.resident auto)
        assert all(p["val_s"] > 0 for p in curve["points"])  # each validation's wall seconds
        up = curve["startup"]  # where the time before the first step went, from the run's metrics.jsonl
        assert "data" in up["setup"] and 0 < up["first_step"] <= up["job_to_first_step"]
    assert len(doc["ablation"]) == 5 and set(doc["singles"]) == {"unet_3d", "unet_2d"}
    assert doc["crops"]["tuning"] == ["crop2", "crop3"] and doc["crops"]["scored"] == ["crop501", "crop502"]
    assert {e["event"] for e in doc["schedule"]} == {"start", "exit"}
    md = (out / "quality.md").read_text()
    for heading in ("**Ablation**", "**Single models**", "**Time to score**", "**Per-class test scores, 2026 metric**",
                    "**Start-up and validation**", "**Schedule**", "**Report cost**"):
        assert heading in md
    assert "| 0.05 min | 0.1 min | 0.15 min | plateaued |" in md
    assert "| steps | samples/s | waiting for data |" in md
    # The train step's console line per job (what the tail of a step's log shows first).
    curve = load("bench.studies.quality.curves").read_curve(work / "runs" / "unet_3d", "unet_3d")
    line = load("bench.studies.quality.document").progress_line(curve)
    assert line.startswith("validation ") and " samples/s, waiting for data " in line and line.endswith(", data host")
    assert len(doc["report_timings"]) == 1 and "| report step | call 1 (s) |" in md  # the report's one call
    weights = doc["ensemble_weights"]  # stage 3's, per scored class, named by architecture
    assert weights and set(weights) <= set(doc["final_classes"]["2026"])
    for entry in weights.values():
        assert list(entry["weights"]) == ["unet_3d", "unet_2d"] and abs(sum(entry["weights"].values()) - 1) < 1e-6
    assert "**Ensemble weights**" in md and "Weight 0 for every class (not predicted with TTA in stage 4):" in md
    assert "Switched off per class on the validation crops: 2. uniform ensemble for " in md
    assert "5. post-processing for" in md
    # Every step is idempotent: a second `all` finds everything done and only rewrites the result files.
    assert load().main(["--quick", "--out", str(out), "--work", str(work)]) == 0


@pytest.mark.parametrize(("args", "message"), [
    (["--budget-min", "0.1", "--val-every-min", "0.05"], "too short for 3 validations"),
    (["--budget-min", "0.2", "--val-every-min", "0.06"], "not a multiple of train.val_every_min"),
    (["--set", "unet_2d:data.classes=[mito]"], "differ in data.classes"),
    (["--set", "vit_9d:optim.lr=1"], "'vit_9d' is not one of the jobs"),
    (["--cores", "1,99"], "a 2d job needs 99 cores"),
    (["--gpus", "0"], "--gpus 0: at least 1"),
    (["--mps"], "--mps shares a GPU between processes"),
    (["--architectures", "unet_3d,unet_2d,unet_3d"], "jobs named more than once: ['unet_3d']"),
    (["--architectures", "unet_3d,unet_4d+sgd"], "unet_4d+sgd"),
])
def test_bad_input_fails_before_training(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                         message: str) -> None:
    code = load().main(["check", "--quick", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), *args])
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


def test_a_report_with_too_little_time_left_is_left_to_the_next_call(quick: tuple[Path, Path], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    shutil.copytree(quick[1] / "runs", work / "runs")
    shutil.copy(quick[1] / "plan.json", work / "plan.json")
    assert load().main(["report", "--step-limit-min", "1", "--out", str(tmp_path / "out"), "--work", str(work)]) == 75
    assert "run the report step next" in capsys.readouterr().err
    assert not (work / "report").exists()  # nothing started


def test_steps_may_follow_the_options() -> None:
    # `bash bench/gpu/quality.sh train report` passes the second step after the script's own options
    args = load("bench.studies.quality.cli").parse_args(["train", "--out", "o", "--work", "w", "report"])
    assert args.steps == ["train", "report"] and args.out == Path("o")


def test_report_refuses_a_run_that_never_validated(quick: tuple[Path, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    shutil.copytree(quick[1] / "runs", work / "runs")
    shutil.copy(quick[1] / "plan.json", work / "plan.json")
    metrics = work / "runs" / "unet_2d" / "metrics.jsonl"
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines() if '"val"' not in line))
    assert load().main(["report", "--out", str(tmp_path / "out"), "--work", str(work)]) == 2
    assert "unet_2d" in (err := capsys.readouterr().err) and "never validated" in err
    assert not (work / "report").exists()  # nothing was predicted


def test_report_without_a_plan_and_setup_with_other_settings_fail(quick: tuple[Path, Path], tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    main = load().main
    assert main(["report", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "empty")]) == 2
    assert "nothing trained there" in capsys.readouterr().err
    assert main(["setup", "--quick", "--budget-min", "0.3", "--out", str(tmp_path / "o"), "--work", str(quick[1])]) == 2
    assert "budget_min: plan 0.15, given 0.3" in capsys.readouterr().err


def test_setup_links_an_existing_data_root_of_the_same_preset_and_seed(quick: tuple[Path, Path], tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    main, data = load().main, quick[1] / "data"
    work = tmp_path / "probe"
    assert main(["setup", "--quick", "--data-from", str(data), "--out", str(tmp_path / "o"), "--work", str(work)]) == 0
    assert (work / "data").is_symlink() and (work / "data").resolve() == data.resolve()
    out = capsys.readouterr().out
    assert f"data: {work / 'data'} -> " in out and "synthetic CellMap root" not in out  # linked, not made again
    # another seed, or a folder that is not a finished synthetic root: refused before the work folder is claimed
    other = tmp_path / "other"
    other.mkdir()
    (other / "synth.json").write_text(json.dumps({**json.loads((data / "synth.json").read_text()), "seed": 7}))
    for root, message in ((other, "seed 7, the plan's 0"), (tmp_path, "no synth.json there")):
        assert main(["setup", "--quick", "--data-from", str(root), "--out", str(tmp_path / "o"),
                     "--work", str(tmp_path / "w2")]) == 2
        assert f"--data-from {root}" in (err := capsys.readouterr().err) and message in err
        assert not (tmp_path / "w2").exists()


def test_a_step_limit_too_short_to_start_a_job_is_refused(quick: tuple[Path, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # A job is started only with MIN_START_S (quick: 30 s) left before the jobs are stopped: a limit that leaves
    # less says so and how much to give, instead of a step that starts nothing.
    work = tmp_path / "work"
    shutil.copytree(quick[1], work, ignore=shutil.ignore_patterns("report"))
    (work / "runs" / "unet_2d" / "result.json").unlink()  # not finished: the step would start it
    assert load().main(["train", "--step-limit-min", "1", "--out", str(tmp_path / "out"), "--work", str(work)]) == 2
    err = capsys.readouterr().err
    assert "--step-limit-min 1 leaves too little time to start a job" in err
    assert float(err.split("give at least ")[1].split()[0]) >= 1.5  # 30 + 45 s grace + 15 s status, and the check


FAKE_TRAIN = """
import pathlib, signal, sys, time
run = pathlib.Path(sys.argv[1]); run.mkdir(parents=True, exist_ok=True)
progress = run / "progress"
done = int(progress.read_text()) if progress.is_file() else 0
signal.signal(signal.SIGTERM, lambda *_: (progress.write_text(str(done)), sys.exit(75)))
while done < int(sys.argv[2]):
    time.sleep(0.05)
    done += 1
(run / "result.json").write_text("{}")
"""


def test_scheduler_stops_jobs_at_the_deadline_and_the_next_step_resumes_them(tmp_path: Path) -> None:
    """Two slots (one per kind), three jobs: the third waits for a free slot; the deadline stops what runs with
    SIGTERM (a checkpoint, exit 75: "stopped"); the next step finishes the stopped jobs and starts the waiting one."""
    plan, schedule = load("bench.studies.quality.plan"), load("bench.studies.quality.schedule")
    settings = plan.Settings(quick=True, architectures=("unet_3d", "unet_2d", "resnet_3d"), preset="tiny",
                             concurrent={"3d": 1, "2d": 1}, cores={"3d": 1, "2d": 1}, device="cpu",
                             budget_min=0.15, val_every_min=0.05)
    jobs = plan.make_jobs(settings, tmp_path)
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    ticks = {"unet_3d": 200, "unet_2d": 10, "resnet_3d": 20}  # 50 ms each: unet_3d needs 10 s

    def fake(job, workers: int) -> list[str]:
        return [sys.executable, str(script), str(job.run_dir), str(ticks[job.arch])]

    def step(seconds: float) -> dict[str, str]:
        return schedule.Scheduler(jobs=jobs, settings=settings, work=tmp_path, deadline=time.monotonic() + seconds,
                                  grace_s=10.0, min_start_s=0.5, command=fake).run()

    first = step(4.0)
    assert first["unet_3d"] == "stopped" and first["unet_2d"] == "done" and first["resnet_3d"] == "not started"
    assert 0 < int((jobs[0].run_dir / "progress").read_text()) < 200
    assert step(60.0) == {"unet_3d": "done", "unet_2d": "done", "resnet_3d": "done"}
    events = schedule.read_schedule(tmp_path)
    assert [e["arch"] for e in events if e["event"] == "start"] == ["unet_3d", "unet_2d", "unet_3d", "resnet_3d"]
    assert [e["arch"] for e in events if e["event"] == "sigterm"] == ["unet_3d"]


FAKE_GPU_JOB = """
import os, pathlib, sys, time
run = pathlib.Path(sys.argv[1]); run.mkdir(parents=True, exist_ok=True)
(run / "gpu").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
(run / "mps").write_text(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "unset"))
time.sleep(float(sys.argv[2]))
(run / "result.json").write_text("{}")
"""


def test_two_gpus_run_their_slots_side_by_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With 2 GPUs each has its own slots and half the cores; a job sees only its GPU (CUDA_VISIBLE_DEVICES)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    plan, schedule = load("bench.studies.quality.plan"), load("bench.studies.quality.schedule")
    settings = plan.Settings(quick=True, architectures=("unet_3d", "resnet_3d", "unet_2d"), preset="tiny",
                             concurrent={"3d": 1, "2d": 1}, cores={"3d": 1, "2d": 1}, gpus=2, device="cpu",
                             budget_min=0.15, val_every_min=0.05)
    jobs = plan.make_jobs(settings, tmp_path)
    script = tmp_path / "fake_gpu_job.py"
    script.write_text(FAKE_GPU_JOB)

    def fake(job, workers: int) -> list[str]:
        return [sys.executable, str(script), str(job.run_dir), "1.5" if job.kind == "3d" else "0.2"]

    sched = schedule.Scheduler(jobs=jobs, settings=settings, work=tmp_path, deadline=time.monotonic() + 60,
                               grace_s=10.0, min_start_s=0.5, command=fake, env={"CUDA_MPS_PIPE_DIRECTORY": "p"})
    assert len(sched.free) == 2 and all(len(cores) >= 1 for cores in sched.free)
    assert sched.run() == {"unet_3d": "done", "resnet_3d": "done", "unet_2d": "done"}
    starts = [e for e in schedule.read_schedule(tmp_path) if e["event"] == "start"]
    assert [(e["arch"], e["gpu"]) for e in starts][:2] == [("unet_3d", 0), ("resnet_3d", 1)]  # one per GPU at once
    for job in jobs:
        gpu = next(e["gpu"] for e in starts if e["arch"] == job.arch)
        assert (job.run_dir / "gpu").read_text() == str(gpu)
        assert (job.run_dir / "mps").read_text() == "p"  # the scheduler's extra environment (an MPS client's)


def test_a_variant_is_a_second_job_of_the_same_config(tmp_path: Path) -> None:
    """"unet_3d+b2" runs unet_3d's config in its own run directory, with only its own `--set`s on top."""
    plan = load("bench.studies.quality.plan")
    settings = plan.Settings(quick=True, architectures=("unet_3d", "unet_3d+b2", "unet_2d"), device="cpu",
                             sets=("unet_3d+b2:train.batch_size=3", "unet_3d:optim.lr=0.5"),
                             budget_min=0.15, val_every_min=0.05)
    base, variant, _ = plan.make_jobs(settings, tmp_path)
    assert variant.config == base.config and variant.kind == "3d"
    assert variant.run_dir == tmp_path / "runs" / "unet_3d+b2" != base.run_dir
    assert variant.cfg.train.batch_size == 3 != base.cfg.train.batch_size
    assert base.cfg.optim.lr == 0.5 != variant.cfg.optim.lr


def test_plateau_rule() -> None:
    plateaued = load("bench.studies.quality.curves").plateaued
    assert plateaued([0.1, 0.30, 0.305]) is True and plateaued([0.2, 0.3]) is False
    assert plateaued([0.0, 0.0]) is True and plateaued([0.5]) is None and plateaued([0.4, float("nan")]) is None


def test_learning_rule() -> None:
    """A flat curve from the first validation on is not learning, though the plateau test calls it plateaued."""
    curves = load("bench.studies.quality.curves")
    flat = [0.0589, 0.0633, 0.0544, 0.0553]  # resnet_3d after 1-4 minutes on a shared H100
    assert curves.plateaued(flat) is True and curves.learning(flat) is False
    assert curves.learning([0.059, 0.116, 0.174, 0.172]) is True  # unet_2d: learned, then plateaued
    assert curves.learning([0.0, 0.0]) is False and curves.learning([0.0, 0.02]) is True
    assert curves.learning([0.3]) is None and curves.learning([float("nan"), 0.2]) is None


DOCUMENTED = {"run_dir", "data.split_margin_nm", "train.time_budget_min", "train.max_steps", "train.val_every_min",
              "train.val_every", "train.checkpoint_every", "train.num_gpus", "train.compile",
              "optim.warmup_steps", "optim.warmup_min"}  # configs/quality/_budget.yaml and docs/quality.md
RECIPE = {"unet_3d": {"data.patch_shape_vox", "train.batch_size", "optim.lr"},  # docs/quality.md, 3D recipe
          "resnet_3d": {"data.patch_shape_vox", "train.batch_size", "optim.lr"},  # ... and every architecture's patch
          "swin_3d": {"data.patch_shape_vox", "train.batch_size", "optim.lr"},
          "vit_3d": {"data.patch_shape_vox", "train.batch_size", "model.params.patch_size", "optim.lr",
                     "model.params.hidden_size", "model.params.num_heads",  # ... and ViT-S
                     "model.params.embed", "model.params.skips"},  # docs/quality.md, the ViTs' token embedding
          "swin_2d": {"data.patch_shape_vox", "train.batch_size", "optim.lr"},
          "resnet_2d": {"optim.lr"}, "unet_2d": {"optim.lr"},  # docs/quality.md, 2D learning rate
          "vit_2d": {"optim.lr", "model.params.hidden_size", "model.params.num_heads", "model.params.embed",
                     "model.params.skips"}}


def _flat(doc: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in doc.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}": value})
    return out


def test_quality_configs_differ_from_the_experiments_only_where_documented(tmp_path: Path) -> None:
    from cellseg.config import load_run_config
    from cellseg.config.load import to_dict

    plan = load("bench.studies.quality.plan")
    jobs = plan.make_jobs(plan.Settings(), tmp_path)  # the GPU plan passes its own checks
    assert [j.kind for j in jobs] == ["3d"] * 4 + ["2d"] * 4
    for job in jobs:
        quality = _flat(to_dict(load_run_config(job.config)))
        experiment = _flat(to_dict(load_run_config(REPO / "configs" / "experiments" / f"{job.arch}.yaml")))
        differ = {k for k in quality.keys() | experiment.keys() if quality.get(k) != experiment.get(k)}
        documented = DOCUMENTED | RECIPE.get(job.arch, set())
        assert differ <= documented, f"{job.arch}: undocumented differences {sorted(differ - documented)}"
        assert job.cfg.train.time_budget_min == 3.0 and job.cfg.optim.ema_decay is None


def test_a_later_step_names_only_the_settings_its_command_line_gives() -> None:
    # A step after setup uses the plan's settings; it names those its own options set otherwise (not the defaults
    # of the options it leaves out, e.g. --gpus of a two-GPU plan).
    cli = load("bench.studies.quality.cli")
    plan = cli.settings_from(cli.parse_args(["setup", "--gpus", "2", "--out", "o"]))
    later = cli.parse_args(["train", "--out", "o"])
    assert cli.settings_from(later) != plan and cli._differences(plan, cli.settings_from(later), later) == ""
    given = cli.parse_args(["train", "--out", "o", "--budget-min", "5"])
    assert cli._differences(plan, cli.settings_from(given), given) == "budget_min: plan None, given 5.0"
    assert cli._differences(plan, cli.settings_from(later)) == "gpus: plan 2, given 1"  # setup compares all


LEADER_WITH_WORKER = """
import pathlib, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # a pool worker, say
pathlib.Path(sys.argv[1]).write_text(str(worker.pid))
time.sleep(120)
"""


def test_a_report_stopped_at_the_step_limit_leaves_no_worker_behind(tmp_path: Path) -> None:
    # The step limit stops the report's whole process group: a worker it spawned (scoring pools) must not
    # outlive it, keep the step's log pipe open or compute into the next step.
    cli = load("bench.studies.quality.cli")
    pid_file = tmp_path / "worker.pid"
    began = time.monotonic()
    code = cli.run_in_session([sys.executable, "-c", LEADER_WITH_WORKER, str(pid_file)], timeout_s=3.0, grace_s=2.0)
    assert code is None and time.monotonic() - began < 30
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while process_alive(socket.gethostname(), worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process_alive(socket.gethostname(), worker)
    assert cli.run_in_session([sys.executable, "-c", "raise SystemExit(3)"], timeout_s=30) == 3


def test_report_cost_table_spans_the_calls():
    """A report cut by the step limit and resumed: each step's seconds in the call that did it, '—' where a call
    did not reach it, 'r' where it found its outputs made, and each call's total."""
    from bench.studies.quality.document import timings_table

    calls = [[{"step": "1. single", "seconds": 60.0, "resumed": False}],
             [{"step": "1. single", "seconds": 0.5, "resumed": True},
              {"step": "2. uniform", "seconds": 30.0, "resumed": False}]]
    assert timings_table(calls) == [
        "| report step | call 1 (s) | call 2 (s) |", "|---|---|---|",
        "| 1. single | 60.0 | 0.5 r |", "| 2. uniform | — | 30.0 |",
        "| **total** | **60.0** | **30.5** |", ""]


# A stand-in for NVIDIA's MPS control program: `-d` creates the control pipe (as a file) and records a client
# connection the way control.log does; "quit" on stdin removes the pipe; FAIL in the environment fails `-d`;
# STUCK makes `-d` leave a daemon process behind that ignores "quit" (a server waiting for clients that are gone).
FAKE_MPS_CONTROL = """#!/bin/sh
pipe="$CUDA_MPS_PIPE_DIRECTORY/control"
if [ "$1" = serve ]; then
  while :; do sleep 0.2; done
fi
if [ -n "$STUCK" ] && [ "$1" != -d ]; then
  read -r command; echo "$command" >> "$CUDA_MPS_LOG_DIRECTORY/calls"; exit 0
fi
if [ "$1" = -d ] && [ -n "$STUCK" ]; then
  "$0" serve > /dev/null 2>&1 &
fi
if [ "$1" = -d ]; then
  [ -n "$FAIL" ] && { echo "cannot start daemon" >&2; exit 1; }
  [ -e "$pipe" ] && { echo "already running" >&2; exit 1; }
  echo start >> "$CUDA_MPS_LOG_DIRECTORY/calls"; touch "$pipe"
  echo "[INFO] NEW CLIENT 0 from user 1000: Server already exists" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
  exit 0
fi
read -r command; echo "$command" >> "$CUDA_MPS_LOG_DIRECTORY/calls"; [ "$command" = quit ] && rm -f "$pipe"
"""


def test_mps_daemon_starts_quits_and_replaces_a_stale_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mps = load("bench.studies.quality.mps")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"), prepend=":")
    with pytest.raises(ValueError, match="nvidia-cuda-mps-control is not on PATH"):
        mps.control_binary()
    (tmp_path / "bin").mkdir()
    control = tmp_path / "bin" / mps.CONTROL
    control.write_text(FAKE_MPS_CONTROL)
    control.chmod(0o755)
    folder = tmp_path / "mps"
    (folder / "pipe").mkdir(parents=True)
    (folder / "pipe" / "control").touch()  # a daemon left by a killed step: quit before starting
    with pytest.raises(RuntimeError, match="job failed"), mps.mps_daemon(folder) as env:
        assert env == mps.client_env(folder) and (folder / "pipe" / "control").exists()
        raise RuntimeError("job failed")
    assert not (folder / "pipe" / "control").exists()  # quit even when the block fails
    assert (folder / "log" / "calls").read_text().split() == ["quit", "start", "quit"]
    assert mps.clients_served(folder) == 1
    monkeypatch.setenv("FAIL", "1")
    with pytest.raises(ValueError, match=r"-d failed \(exit 1\): cannot start daemon"), mps.mps_daemon(folder):
        pass


def _fake_control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mps) -> Path:
    (tmp_path / "bin").mkdir()
    control = tmp_path / "bin" / mps.CONTROL
    control.write_text(FAKE_MPS_CONTROL)
    control.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"), prepend=":")
    return control


def test_a_stuck_daemon_a_killed_step_left_is_ended_at_set_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import subprocess

    mps = load("bench.studies.quality.mps")
    control = _fake_control(tmp_path, monkeypatch, mps)
    folder = tmp_path / "mps"
    env = mps.client_env(folder)
    for path in env.values():
        Path(path).mkdir(parents=True)
    # What a step killed outright (SIGKILL at its time limit) leaves: a daemon that no longer quits.
    subprocess.run([str(control), "-d"], env={**os.environ, **env, "STUCK": "1"}, check=True)
    stale = mps.owned_daemons(folder / "pipe")
    assert stale and (folder / "pipe" / "control").exists()
    other = subprocess.Popen([str(control), "serve"], env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    try:
        with mps.mps_daemon(folder, quit_timeout_s=1.0) as client:
            assert client == env and mps.owned_daemons(folder / "pipe") == []  # the stale one is gone
            assert (folder / "pipe" / "control").exists()  # the new daemon's pipe
        assert other.poll() is None  # a daemon of another pipe folder is not this step's: untouched
    finally:
        other.kill()
        other.wait()
    assert (folder / "log" / "calls").read_text().split() == ["start", "quit", "start", "quit"]
    assert not (folder / "pipe" / "control").exists()


MPS_STEP = """
import sys, time
from pathlib import Path
from bench.studies.quality.mps import mps_daemon

with mps_daemon(Path(sys.argv[1])):
    print("ready", flush=True)
    time.sleep(60)
"""


def test_sigterm_to_a_step_quits_its_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import signal
    import subprocess

    mps = load("bench.studies.quality.mps")
    _fake_control(tmp_path, monkeypatch, mps)
    folder = tmp_path / "mps"
    with subprocess.Popen([sys.executable, "-c", MPS_STEP, str(folder)], stdout=subprocess.PIPE, text=True,
                          cwd=Path(__file__).resolve().parents[3]) as step:
        assert step.stdout is not None and step.stdout.readline().strip() == "ready"
        assert (folder / "pipe" / "control").exists()
        step.send_signal(signal.SIGTERM)  # the step's time limit
        assert step.wait(timeout=30) == 128 + signal.SIGTERM
    assert not (folder / "pipe" / "control").exists()  # quit before the step ended: the next one can start
    assert (folder / "log" / "calls").read_text().split() == ["start", "quit"]


def test_the_product_step_submits_what_the_report_scored_as_stage_5(quick: tuple[Path, Path]) -> None:
    out, work = quick
    assert load().main(["product", "--quick", "--out", str(out), "--work", str(work)]) == 0
    doc = json.loads((out / "quality_product.json").read_text())
    for era, row in doc["eras"].items():
        assert row["largest_class_difference"] == 0.0, era
        assert row["submission_overall"] == pytest.approx(row["report_stage5_overall"], abs=1e-12), era
