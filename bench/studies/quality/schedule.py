"""Running the training jobs on one GPU within one step's time limit.

Schedule: at most `concurrent["3d"]` 3D and `concurrent["2d"]` 2D jobs at a time on each GPU (default 2 + 2, one
GPU; with `gpus` > 1 each GPU has these slots, an equal share of the cores, and its jobs see only it through
`CUDA_VISIBLE_DEVICES`: the waves of one GPU run side by side), each pinned to its own CPU cores (`taskset`; default 3 cores for a 3D job, 5 for a 2D job: 16 in all) with `cores − 1` loader
workers. The 3D models are bound by GPU compute and need few patches per second; the 2D models are bound by
their loaders (tens of thousands of slices a minute) and leave the GPU mostly idle: a pair of each keeps the GPU
busy and gives the CPU cores to the jobs that use them. Jobs start in plan order within each kind, the heaviest
3D pair first, so that jobs sharing the GPU are of similar weight (the GPU time-slices between processes).

A step runs until every job is done or the step's deadline: then it sends SIGTERM to the running jobs, which
write a checkpoint and exit 75 (`cellseg train`), and waits `grace_s` before killing what is left. The next
`train` step resumes them (`--resume auto`: the training clock continues from the checkpoint). No job starts
with less than `min_start_s` left: it would pay its set-up and compilation for little training. A job that
fails is left for the next step (its log says why). Events go to `schedule.jsonl` in the work folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.studies.quality.plan import Job, Settings

EXIT_RESUMABLE = 75  # `cellseg train` stopped early with a checkpoint (cellseg.train.stop)
POLL_S = 2.0  # how often the scheduler looks at its jobs
SCHEDULE_FILE = "schedule.jsonl"


def job_done(job: Job) -> bool:
    """Training reached its budget (`cellseg train` writes result.json only then)."""
    return (job.run_dir / "result.json").is_file()


@dataclass
class Running:
    """A job in flight."""

    job: Job
    proc: subprocess.Popen
    cpus: list[int]
    gpu: int  # index into the GPUs the scheduler spreads over
    started: float
    log: Any  # the open log file
    stopping: float | None = None  # when SIGTERM was sent


@dataclass
class Scheduler:
    """Runs `jobs` (module docstring); `run` returns each job's outcome of this step.

    Attributes:
        deadline: `time.monotonic()` by which every job must have been told to stop.
        grace_s: how long a stopped job may take to checkpoint before it is killed.
        min_start_s: the least time before the deadline at which a job is still started.
        command: the job's command line given its loader workers (`train_command`).
        env: variables every job gets on top of this process's (the MPS client's, `bench/studies/quality/mps.py`).
    """

    jobs: Sequence[Job]
    settings: Settings
    work: Path
    deadline: float
    grace_s: float = 45.0
    min_start_s: float = 180.0
    command: Callable[[Job, int], list[str]] = field(default_factory=lambda: train_command)
    env: Mapping[str, str] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cores, n = sorted(os.sched_getaffinity(0)), self.settings.gpus
        share = len(cores) // n
        self.free = [cores[g * share:(g + 1) * share] for g in range(n)]  # each GPU's free cores

    def run(self) -> dict[str, str]:
        """Run until every job is done, failed this step, or stopped at the deadline."""
        queue = [j for j in self.jobs if not job_done(j)]
        self.outcomes = {j.arch: "done" for j in self.jobs if job_done(j)}
        running: list[Running] = []
        try:
            while queue or running:
                running = [r for r in running if not self._reap(r)]
                if time.monotonic() >= self.deadline:
                    self._stop_all(running)
                    running = [r for r in running if not self._reap(r)]
                else:
                    queue = self._start_ready(queue, running)
                if not running and (not queue or time.monotonic() >= self.deadline - self.min_start_s):
                    break
                time.sleep(POLL_S)
        finally:
            for r in running:  # an exception in the scheduler must not leave jobs holding the GPU
                self._kill(r)
        for job in queue:
            self.outcomes.setdefault(job.arch, "not started")
        return self.outcomes

    def _start_ready(self, queue: list[Job], running: list[Running]) -> list[Job]:
        """Start the queued jobs that have a free slot of their kind and enough cores; returns the rest."""
        if time.monotonic() > self.deadline - self.min_start_s:
            return queue
        left = []
        for job in queue:
            cores = self.settings.cores[job.kind]
            for gpu, free in enumerate(self.free):
                busy = sum(r.job.kind == job.kind and r.gpu == gpu for r in running)
                if busy < self.settings.concurrent[job.kind] and len(free) >= cores:
                    running.append(self._start(job, free[:cores], gpu))
                    del free[:cores]
                    break
            else:
                left.append(job)
        return left

    def _start(self, job: Job, cpus: list[int], gpu: int) -> Running:
        log_path = self.work / "logs" / f"{job.arch}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = log_path.open("a")
        cmd = self.command(job, len(cpus) - 1)
        if shutil.which("taskset"):
            cmd = ["taskset", "-c", ",".join(map(str, cpus)), *cmd]
        env = {**os.environ, **self.env, "OMP_NUM_THREADS": str(len(cpus)), "PYTHONUNBUFFERED": "1"}
        if self.settings.gpus > 1:  # the job sees its own GPU only (as cuda:0)
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
            env["CUDA_VISIBLE_DEVICES"] = visible[gpu] if len(visible) > gpu and visible[gpu] else str(gpu)
        # A session of its own: the stop signal reaches the job's loader workers too, never this process.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=Path.cwd(),
                                start_new_session=True)
        self._event("start", job, cpus=cpus, gpu=gpu, pid=proc.pid)
        return Running(job=job, proc=proc, cpus=cpus, gpu=gpu, started=time.monotonic(), log=log)

    def _reap(self, r: Running) -> bool:
        """True (and the job's cores freed) when the job has exited."""
        code = r.proc.poll()
        if code is None:
            if r.stopping is not None and time.monotonic() > r.stopping + self.grace_s:
                self._kill(r)
                code = r.proc.wait()
            else:
                return False
        r.log.close()
        self.free[r.gpu] = sorted(self.free[r.gpu] + r.cpus)
        if code == 0 and job_done(r.job):
            outcome = "done"
        elif code == EXIT_RESUMABLE or (r.stopping is not None and code != 0):  # checkpointed, or killed after SIGTERM
            outcome = "stopped"
        else:
            outcome = f"failed (exit {code}; see logs/{r.job.arch}.log)"
        self.outcomes[r.job.arch] = outcome
        self._event("exit", r.job, code=code, outcome=outcome, seconds=round(time.monotonic() - r.started, 1))
        return True

    def _stop_all(self, running: Sequence[Running]) -> None:
        for r in running:
            if r.stopping is None:
                r.stopping = time.monotonic()
                self._signal(r, signal.SIGTERM)
                self._event("sigterm", r.job)

    def _kill(self, r: Running) -> None:
        self._signal(r, signal.SIGKILL)
        r.proc.wait()

    @staticmethod
    def _signal(r: Running, sig: signal.Signals) -> None:
        try:
            os.killpg(r.proc.pid, sig)
        except ProcessLookupError:  # exited in the meantime
            pass

    def _event(self, kind: str, job: Job, **values: Any) -> None:
        entry = {"time": time.time(), "event": kind, "arch": job.arch, **values}
        with (self.work / SCHEDULE_FILE).open("a") as fh:
            fh.write(json.dumps(entry) + "\n")


def train_command(job: Job, workers: int) -> list[str]:
    """`cellseg train` of the job, resuming where a checkpoint exists."""
    return [sys.executable, "-m", "cellseg", "-q", "train", str(job.config), *job.overrides,
            f"loader.num_workers={workers}", "--resume", "auto"]


def read_schedule(work: Path) -> list[dict[str, Any]]:
    """The events of every step so far (empty before the first)."""
    path = work / SCHEDULE_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
