"""SIGTERM to the whole process group of `cellseg train` at random moments: every run must stay resumable.

    python -m bench.faults_sigterm --out OUT [--root DATA] [--trials 20] [--steps 10] [--workers 2] [--seed 0]

SLURM and `timeout` signal the whole process group, DataLoader workers included. Each trial starts a tiny CPU
training (configs/smoke/unet_3d.yaml, `--steps` steps, a checkpoint every 3 steps, `--workers` spawned loader
workers) in a new session, sends SIGTERM to its group after a random delay drawn uniformly from the wall time
of an uninterrupted run (start-up, steps, checkpoints, validation and exit all get hit), then resumes it with
`--resume auto` to the end. A trial passes when:

- the interrupted command ends by itself (no kill needed), with status 75 (stopped early with a checkpoint),
  0 (it had finished), or killed by the signal before `cellseg train` installed its handler (nothing written);
- its output holds no traceback, no result.json claims a finished run after a stop, and its lock is released;
- the resumed run ends with status 0, and every step's loss in metrics.jsonl equals the uninterrupted run's,
  bit for bit.

Writes OUT/faults_sigterm.json (one record per trial) and prints a summary; exit status 1 if any trial
failed. Without `--root`, a tiny synthetic data root is generated in OUT/synth first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke" / "unet_3d.yaml"
EXIT_RESUMABLE = 75
TIMEOUT_S = 300  # a run that takes longer than this has hung


def train_command(root: Path, run_dir: Path, steps: int, workers: int, *extra: str) -> list[str]:
    """`python -m cellseg train` of the tiny deterministic run."""
    return [sys.executable, "-m", "cellseg", "-q", "train", str(SMOKE), f"data.root={root}", f"run_dir={run_dir}",
            f"train.max_steps={steps}", "train.log_every=1", "train.checkpoint_every=3", "train.val_every=1000",
            "optim.schedule=constant", "optim.warmup_steps=0", f"loader.num_workers={workers}", *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1"}


def run(command: list[str], log: Path, *, signal_after: float | None = None,
        signal_when: Callable[[], bool] | None = None) -> tuple[int, float]:
    """Run `command` in its own process group; (status, seconds).

    SIGTERM goes to the group after `signal_after` seconds, or as soon as `signal_when()` holds.
    """
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
        if signal_after is not None or signal_when is not None:
            deadline = start + (signal_after if signal_after is not None else TIMEOUT_S)
            while proc.poll() is None and time.perf_counter() < deadline and not (signal_when and signal_when()):
                time.sleep(0.02)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        try:
            status = proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = -9  # needed a kill: a failure
    return status, time.perf_counter() - start


def losses(run_dir: Path) -> dict[int, float]:
    """step → training loss (the last record of a step wins)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["step"]: r["train"]["loss"] for r in records if "train" in r}


def trial(root: Path, run_dir: Path, *, steps: int, workers: int, reference: dict[int, float],
          delay: float | None = None, after_steps: int | None = None) -> dict[str, Any]:
    """One interrupted-and-resumed run, judged as the module docstring says; the signal comes after `delay`
    seconds or once `after_steps` steps are logged."""
    shutil.rmtree(run_dir, ignore_errors=True)
    when = (lambda: len(losses(run_dir)) >= after_steps) if after_steps else None
    status, _ = run(train_command(root, run_dir, steps, workers), run_dir.with_suffix(".stop.log"), signal_after=delay,
                    signal_when=when)
    text = run_dir.with_suffix(".stop.log").read_text()
    problems = []
    if status not in (EXIT_RESUMABLE, 0, -signal.SIGTERM):
        problems.append(f"interrupted run ended with status {status}")
    if "Traceback" in text:
        problems.append("traceback in the interrupted run's output")
    if status == EXIT_RESUMABLE and (run_dir / "result.json").exists():
        problems.append("result.json written by a stopped run")
    if (run_dir / "train.lock").exists():
        problems.append("lock left behind")
    before = losses(run_dir)
    resumed, _ = run(train_command(root, run_dir, steps, workers, "--resume", "auto"), run_dir.with_suffix(".resume.log"))
    if resumed != 0:
        problems.append(f"resumed run ended with status {resumed}")
    after = losses(run_dir)
    wrong = [s for s in reference if after.get(s) != reference[s]]
    if wrong:
        problems.append(f"losses differ from the uninterrupted run at steps {wrong}")
    return {"delay_s": None if delay is None else round(delay, 3), "status": status, "steps_before": max(before, default=0),
            "ok": not problems, "problems": problems}


def main(argv: list[str] | None = None) -> int:
    """Run the trials; 0 when every one passed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--root", type=Path, help="a data root (default: a tiny synthetic one in OUT/synth)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="loader workers per run (they get the signal too)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    root = args.root
    if root is None:
        from cellseg.synth import generate

        root = args.out / "synth"
        if not (root / "synth.json").is_file():
            generate(root, preset="tiny", seed=0, workers=1)
    ref_dir = args.out / "reference"
    shutil.rmtree(ref_dir, ignore_errors=True)
    status, seconds = run(train_command(root, ref_dir, args.steps, args.workers), args.out / "reference.log")
    if status != 0:
        print(f"the uninterrupted run failed ({status}): see {args.out / 'reference.log'}")
        return 1
    reference = losses(ref_dir)
    rng = random.Random(args.seed)
    records = []
    for i in range(args.trials):
        record = trial(root, args.out / f"trial{i:02d}", steps=args.steps, workers=args.workers,
                       delay=rng.uniform(0.0, seconds), reference=reference)
        records.append(record)
        print(f"trial {i:2d}: SIGTERM after {record['delay_s']:6.2f} s -> status {record['status']:3d}, "
              f"{record['steps_before']:2d} steps before; {'ok' if record['ok'] else '; '.join(record['problems'])}")
    summary = {"uninterrupted_s": round(seconds, 2), "steps": args.steps, "workers": args.workers,
               "passed": sum(r["ok"] for r in records), "trials": records}
    (args.out / "faults_sigterm.json").write_text(json.dumps(summary, indent=1))
    print(f"{summary['passed']}/{len(records)} trials passed (uninterrupted run: {seconds:.1f} s)")
    return 0 if summary["passed"] == len(records) else 1


if __name__ == "__main__":
    sys.exit(main())
