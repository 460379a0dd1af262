"""Host memory of a training job over a long run: does the resident set of the job (loader workers included) stay
flat, or does it grow with the steps?

    python bench/host_memory.py --root DATA_ROOT --out OUT [--config configs/demo/unet_2d.yaml] [--minutes 30]
                                [--every 15] [key=value ...]
    python bench/host_memory.py --quick --out /tmp/hm          # seconds: tiny synthetic root, smoke model

`cellseg train CONFIG` runs in a process of its own for `--minutes` of its training clock
(`train.time_budget_min`, so set-up is not charged; `train.max_steps` is lifted), with `key=value` overrides
(e.g. `data.resident=host`, `loader.num_workers=2`). Every `--every` seconds the resident set size (RSS) of
the job's whole process tree is sampled, with the last optimizer step logged in its `metrics.jsonl`. RSS of
forked workers counts pages they share with the parent twice, so the absolute number is an upper bound; growth
is what this measures.

Verdict: after a warm-up (the first `WARMUP_SHARE` of the samples: data set-up, first validation, allocator
pools filling; and, where the model compiled in the background, until training switched to the compiled model
and that process ended), the growth is the median RSS over the last tenth of the samples minus the median over
the tenth right after warm-up, and the slope is the median of the slopes between every two samples after warm-up
(Theil-Sen, MiB per minute: the last sample, taken while the job ends, does not tilt it). The run is called flat
when the growth stays under `FLAT_SHARE` of the post-warm-up level (a fall is no leak): a leak of one batch per
step would exceed it within minutes.

Writes OUT/host_memory.json (every sample) and OUT/host_memory.md (summary), keeps the run in OUT/run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WARMUP_SHARE = 0.2  # share of the samples treated as warm-up (set-up, first validation)
FLAT_SHARE = 0.05  # growth under 5 % of the post-warm-up RSS counts as flat
MIB = 2**20


def tree_rss_bytes(pid: int) -> int:
    """Resident bytes of a process and all its descendants, from /proc (Linux; 0 once the process is gone)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        except OSError:  # a process that exited while listing
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    page, total, todo = os.sysconf("SC_PAGE_SIZE"), 0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += int(Path(f"/proc/{current}/statm").read_text().split()[1]) * page  # field 2: resident pages
        except OSError:
            continue
        todo.extend(children.get(current, []))
    return total


def logged_steps(metrics: Path) -> tuple[int | None, int | None]:
    """The last optimizer step logged in a run's metrics.jsonl (None before the first log line), and the step at
    which training switched to the model compiled in the background (None: no switch logged)."""
    if not metrics.is_file():
        return None, None
    step = switch = None
    for line in metrics.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        step = record.get("step", step)
        if "compile" in record:
            switch = record.get("step")
    return step, switch


def summarise(samples: list[dict[str, Any]], switch_step: int | None = None) -> dict[str, Any]:
    """Levels after warm-up and at the end, growth, slope after warm-up, and the verdict (module docstring)."""
    import numpy as np

    t = np.array([s["t_s"] for s in samples]) / 60.0
    rss = np.array([s["rss_mib"] for s in samples])
    start = int(len(samples) * WARMUP_SHARE)
    if switch_step is not None:  # the background compile's process lives until the switch
        start = max(start, next((i for i, s in enumerate(samples) if (s["step"] or 0) > switch_step), len(samples)))
    if len(samples) - start < 10:
        raise ValueError(f"only {len(samples) - start} memory samples after warm-up: run longer or sample more "
                         "often (--every)")
    window = max(2, len(samples) // 10)  # levels are medians over a tenth of the samples: one validation's spike
    baseline = float(np.median(rss[start:start + window]))  # does not set them
    end = float(np.median(rss[-window:]))
    i, j = np.triu_indices(len(samples) - start, k=1)
    tail_t, tail_rss = t[start:], rss[start:]
    slope = float(np.median((tail_rss[j] - tail_rss[i]) / (tail_t[j] - tail_t[i])))
    growth = end - baseline
    return {"warmup_samples": start, "rss_mib_after_warmup": baseline, "rss_mib_end": end,
            "rss_mib_peak": float(rss.max()), "growth_mib": growth, "slope_mib_per_min": slope,
            "warmup_minutes": float(t[start]), "minutes_after_warmup": float(t[-1] - t[start]),
            "switch_step": switch_step, "flat": growth < FLAT_SHARE * baseline}


def run(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    if run_dir.exists():
        raise SystemExit(f"{run_dir} exists: choose a new --out (a resumed run would not measure a fresh job)")
    cmd = [sys.executable, "-m", "cellseg", "train", args.config, f"data.root={args.root}", f"run_dir={run_dir}",
           f"train.time_budget_min={args.minutes}", "train.max_steps=1000000000", *args.overrides]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    print("==>", " ".join(cmd), flush=True)
    began = time.time()
    with open(out / "train.log", "w") as log:
        job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        samples = []
        while job.poll() is None:
            rss = tree_rss_bytes(job.pid)
            if rss:
                samples.append({"t_s": round(time.time() - began, 2), "rss_mib": round(rss / MIB, 1),
                                "step": logged_steps(run_dir / "metrics.jsonl")[0]})
                print(f"  {samples[-1]['t_s']:8.1f} s  {samples[-1]['rss_mib']:9.1f} MiB  step {samples[-1]['step']}",
                      flush=True)
            time.sleep(args.every)
    if job.returncode != 0:
        raise SystemExit(f"training exited with status {job.returncode}: see {out / 'train.log'}")
    import torch

    return {"benchmark": "host_memory", "command": " ".join(cmd), "config": args.config, "overrides": args.overrides,
            "minutes": args.minutes, "every_s": args.every, "wall_s": round(time.time() - began, 1),
            "env": {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
                    "torch": torch.__version__, "cpu_count": os.cpu_count(), "machine": platform.machine()},
            "summary": summarise(samples, logged_steps(run_dir / "metrics.jsonl")[1]), "samples": samples}


def write_markdown(result: dict[str, Any], path: Path) -> None:
    s, env = result["summary"], result["env"]
    steps = [x["step"] for x in result["samples"] if x["step"] is not None]
    lines = [f"# Host memory of a training job ({env['date']}, {env['cpu_count']} CPU cores, torch {env['torch']})",
             "", f"`{result['command']}`", "",
             "| minutes | steps | warm-up (min) | RSS after warm-up (MiB) | RSS at end (MiB) | peak (MiB) | "
             "growth (MiB) | slope (MiB/min) | flat |", "|---|---|---|---|---|---|---|---|---|",
             f"| {result['minutes']} | {steps[-1] if steps else '-'} | {s.get('warmup_minutes', 0):.1f} | "
             f"{s['rss_mib_after_warmup']:.1f} | "
             f"{s['rss_mib_end']:.1f} | {s['rss_mib_peak']:.1f} | {s['growth_mib']:+.1f} | "
             f"{s['slope_mib_per_min']:+.2f} | {'yes' if s['flat'] else 'no'} |", ""]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", help="data root (a `cellseg synth` or fetched root); --quick makes a tiny one")
    parser.add_argument("--out", required=True, help="output directory (OUT/host_memory.json, .md, the run)")
    parser.add_argument("--config", default=str(REPO / "configs/demo/unet_2d.yaml"), help="training config")
    parser.add_argument("--minutes", type=float, default=30.0, help="training-clock minutes (default 30)")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between memory samples (default 15)")
    parser.add_argument("--quick", action="store_true", help="tiny synthetic root, smoke model, a few seconds")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for the training job")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.every <= 0:
        parser.error("--minutes and --every must be > 0")
    if args.quick:
        args.root = args.root or str(Path(args.out) / "data")
        if not Path(args.root).is_dir():
            subprocess.run([sys.executable, "-m", "cellseg", "synth", "--preset", "tiny", "--seed", "0",
                            "--out", args.root], check=True, cwd=REPO)
        args.config = str(REPO / "configs/smoke/unet_2d.yaml")
        args.minutes, args.every = min(args.minutes, 0.1), min(args.every, 0.4)
    elif not args.root:
        parser.error("--root is required (or --quick)")
    result = run(args)
    out = Path(args.out)
    (out / "host_memory.json").write_text(json.dumps(result, indent=1) + "\n")
    write_markdown(result, out / "host_memory.md")
    print((out / "host_memory.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
