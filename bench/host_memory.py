"""Host memory of a training job over a long run: does the resident set of the job (loader workers included) stay
flat, or does it grow with the steps?

    python -m bench.host_memory --root DATA_ROOT --out OUT [--config configs/demo/unet_2d.yaml] [--minutes 30]
                                [--every 15] [key=value ...]
    python -m bench.host_memory --quick --out /tmp/hm          # seconds: tiny synthetic root, smoke model

`cellseg train CONFIG` runs in a process of its own for `--minutes` of its training clock
(`train.time_budget_min`, so set-up is not charged; `train.max_steps` is lifted), with `key=value` overrides
(e.g. `data.resident=host`, `loader.num_workers=2`). Every `--every` seconds the resident set size (RSS) of
the job's whole process tree is sampled, with the last optimizer step logged in its `metrics.jsonl`. RSS of
forked workers counts pages they share with the parent twice, so the absolute number is an upper bound; growth
is what this measures. Compile processes are counted apart (`compile_mib`; `rss_mib` is the rest): the
background compile's child and inductor's compile-worker pool (shut down by the trainer once a step has run
compiled: `cellseg.runtime.compile.release_compile_workers`) hold several GiB while they live and say nothing about
a leak.

Verdict: after a warm-up (the first `WARMUP_SHARE` of the samples: data set-up, first validation, allocator
pools filling; and, where the model compiled in the background, until training switched to the compiled model
and that process ended), the growth is the median RSS over the last tenth of the samples minus the median over
the tenth right after warm-up, and the slope is the median of the slopes between every two samples after warm-up
(Theil-Sen, MiB per minute: the last sample, taken while the job ends, does not tilt it); the late slope is the
same over the second half of the time after warm-up, so growth that levels off shows as such. The run is called flat
when the growth stays under `FLAT_SHARE` of the post-warm-up level (a fall is no leak): a leak of one batch per
step would exceed it within minutes.

Writes OUT/host_memory.json (every sample, rewritten after each, so a run cut short keeps its samples with
`"complete": false`) and OUT/host_memory.md (summary), keeps the run in OUT/run.
`--summarize FILE [--warmup-min M]` summarises a stored result again with the current rules (and a warm-up of at
least M minutes, for samples taken before compile processes were counted apart).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cellseg.runtime.checkpoint import save_atomic_text

REPO = Path(__file__).resolve().parents[1]

WARMUP_SHARE = 0.2  # share of the samples treated as warm-up (set-up, first validation)
FLAT_SHARE = 0.05  # growth under 5 % of the post-warm-up RSS counts as flat
MIB = 2**20
STOP_WAIT_S = 120  # how long a stopped job may take to save its state before it is killed
# A process whose command line holds one of these, and everything below it, is compile machinery: the background
# compile's child (`python -m cellseg.train.background`) and inductor's compile-worker pool (its __main__.py)
COMPILE_MARKERS = ("cellseg.train.background", "_inductor/compile_worker")


def tree_rss_bytes(pid: int) -> tuple[int, int, int]:
    """Resident bytes of a process and all its descendants, from /proc (Linux; zeros once the process is gone),
    as (the job's processes, its compile processes: `COMPILE_MARKERS`, the process `pid` alone)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        except OSError:  # a process that exited while listing
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    page, totals, todo, own = os.sysconf("SC_PAGE_SIZE"), [0, 0], [(pid, False)], 0
    while todo:
        current, compiling = todo.pop()
        try:
            resident = int(Path(f"/proc/{current}/statm").read_text().split()[1]) * page  # field 2: resident pages
            cmdline = Path(f"/proc/{current}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        compiling = compiling or any(marker in cmdline for marker in COMPILE_MARKERS)
        totals[compiling] += resident
        own = resident if current == pid else own
        todo.extend((child, compiling) for child in children.get(current, []))
    return totals[0], totals[1], own


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


def _theil_sen(t_min: Any, rss_mib: Any) -> float:
    """The median of the slopes between every two samples (MiB per minute)."""
    import numpy as np

    i, j = np.triu_indices(len(t_min), k=1)
    return float(np.median((rss_mib[j] - rss_mib[i]) / (t_min[j] - t_min[i])))


def summarise(samples: list[dict[str, Any]], switch_step: int | None = None,
              warmup_min: float = 0.0) -> dict[str, Any]:
    """Levels after warm-up and at the end, growth, slope after warm-up, and the verdict (module docstring);
    `warmup_min`: a warm-up of at least that many minutes."""
    import numpy as np

    t = np.array([s["t_s"] for s in samples]) / 60.0
    rss = np.array([s["rss_mib"] for s in samples])
    start = max(int(len(samples) * WARMUP_SHARE), int(np.searchsorted(t, warmup_min)))
    if switch_step is not None:  # the background compile's process lives until the switch
        start = max(start, next((i for i, s in enumerate(samples) if (s["step"] or 0) > switch_step), len(samples)))
    if len(samples) - start < 10:
        raise ValueError(f"only {len(samples) - start} memory samples after warm-up: run longer or sample more "
                         "often (--every)")
    window = max(2, len(samples) // 10)  # levels are medians over a tenth of the samples: one validation's spike

    def levels(series: Any) -> tuple[float, float]:  # does not set them
        """The level right after warm-up and at the end."""
        return float(np.median(series[start:start + window])), float(np.median(series[-window:]))

    baseline, end = levels(rss)
    trainer_growth = None  # the training process alone; samples taken before it was recorded: the tree only
    if all("trainer_mib" in s for s in samples):
        trainer_start, trainer_end = levels(np.array([s["trainer_mib"] for s in samples]))
        trainer_growth = trainer_end - trainer_start
    slope = _theil_sen(t[start:], rss[start:])
    late = t >= (t[start] + t[-1]) / 2  # the second half of the time after warm-up: at least 5 of >= 10 samples
    late_slope = _theil_sen(t[late], rss[late])
    growth = end - baseline
    return {"warmup_samples": start, "rss_mib_after_warmup": baseline, "rss_mib_end": end,
            "rss_mib_peak": float(rss.max()), "growth_mib": growth, "slope_mib_per_min": slope,
            "late_slope_mib_per_min": late_slope, "trainer_growth_mib": trainer_growth,
            "warmup_minutes": float(t[start]), "minutes_after_warmup": float(t[-1] - t[start]),
            "switch_step": switch_step, "compile_mib_peak": max(s.get("compile_mib", 0.0) for s in samples),
            "flat": growth < FLAT_SHARE * baseline}


def run(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    if run_dir.exists():
        raise SystemExit(f"{run_dir} exists: choose a new --out (a resumed run would not measure a fresh job)")
    cmd = [sys.executable, "-m", "cellseg", "train", args.config, f"data.root={args.root}", f"run_dir={run_dir}",
           f"train.time_budget_min={args.minutes}", "train.max_steps=1000000000", *args.overrides]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result: dict[str, Any] = {
        "benchmark": "host_memory", "command": " ".join(cmd), "config": args.config, "overrides": args.overrides,
        "minutes": args.minutes, "every_s": args.every, "wall_s": 0.0, "complete": False, "switch_step": None,
        "env": {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
                "torch": importlib.metadata.version("torch"), "cpu_count": os.cpu_count(), "machine": platform.machine()},
        "summary": None, "samples": []}
    print("==>", " ".join(cmd), flush=True)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # a scheduler's stop still ends the job and keeps the samples
    began = time.time()
    with open(out / "train.log", "w") as log:
        job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            while job.poll() is None:
                rss, compiling, trainer = tree_rss_bytes(job.pid)
                if rss:
                    step, result["switch_step"] = logged_steps(run_dir / "metrics.jsonl")
                    sample = {"t_s": round(time.time() - began, 2), "rss_mib": round(rss / MIB, 1),
                              "compile_mib": round(compiling / MIB, 1), "trainer_mib": round(trainer / MIB, 1),
                              "step": step}
                    result["samples"].append(sample)
                    result["wall_s"] = sample["t_s"]
                    _write_json(result, out / "host_memory.json")  # every sample: a cut run keeps what it saw
                    print(f"  {sample['t_s']:8.1f} s  {sample['rss_mib']:9.1f} MiB  "
                          f"(compiling {sample['compile_mib']:.1f} MiB)  step {step}", flush=True)
                time.sleep(args.every)
        finally:
            if job.poll() is None:  # this process was stopped: so is the job it started
                job.terminate()  # the trainer's stop request: it saves its state and exits
                try:
                    job.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    job.kill()
                    job.wait()
    if job.returncode != 0:
        raise SystemExit(f"training exited with status {job.returncode}: see {out / 'train.log'}; the samples so far "
                         f"are in {out / 'host_memory.json'} (--summarize reads them)")
    result.update(wall_s=round(time.time() - began, 1), complete=True,
                  summary=summarise(result["samples"], result["switch_step"]))
    _write_json(result, out / "host_memory.json")
    write_markdown(result, out / "host_memory.md")
    return result


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(f"host_memory: stopped by signal {signum}")


def _write_json(result: dict[str, Any], path: Path) -> None:
    """Replace `path` whole (a reader never sees half a file)."""
    save_atomic_text(json.dumps(result, indent=1) + "\n", path)


def write_markdown(result: dict[str, Any], path: Path) -> None:
    s, env = result["summary"], result["env"]
    steps = [x["step"] for x in result["samples"] if x["step"] is not None]
    counted_apart = any("compile_mib" in x for x in result["samples"])  # results before: in the RSS columns
    end_compiling = result["samples"][-1].get("compile_mib", 0.0)
    compiling = f"{s['compile_mib_peak']:.1f} → {end_compiling:.1f}" if counted_apart else "counted in RSS"
    late = f"{s['late_slope_mib_per_min']:+.2f}" if "late_slope_mib_per_min" in s else "-"  # older summaries
    trainer = "-" if s.get("trainer_growth_mib") is None else f"{s['trainer_growth_mib']:+.1f}"
    lines = [f"# Host memory of a training job ({env['date']}, {env['cpu_count']} CPU cores, torch {env['torch']})",
             "", f"`{result['command']}`", "",
             "| minutes | steps | warm-up (min) | RSS after warm-up (MiB) | RSS at end (MiB) | peak (MiB) | "
             "growth (MiB) | of which the training process (MiB) | slope (MiB/min) | late slope (MiB/min) | flat | "
             "compile processes, peak → end (MiB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|",
             f"| {result['minutes']} | {steps[-1] if steps else '-'} | {s.get('warmup_minutes', 0):.1f} | "
             f"{s['rss_mib_after_warmup']:.1f} | "
             f"{s['rss_mib_end']:.1f} | {s['rss_mib_peak']:.1f} | {s['growth_mib']:+.1f} | {trainer} | "
             f"{s['slope_mib_per_min']:+.2f} | {late} | {'yes' if s['flat'] else 'no'} | {compiling} |", ""]
    path.write_text("\n".join(lines))


def resummarise(path: Path, warmup_min: float) -> int:
    """`--summarize`: the stored samples summarised by the current rules; the summary it replaces is kept under
    `summary_as_run` (the first time) and the warm-up floor is recorded."""
    result = json.loads(path.read_text())
    if result.get("summary") is not None:  # a run that was cut has none
        result.setdefault("summary_as_run", result["summary"])
    switch = result.get("switch_step", (result.get("summary") or {}).get("switch_step"))
    result["summary"] = {**summarise(result["samples"], switch, warmup_min), "warmup_min_floor": warmup_min}
    _write_json(result, path)
    write_markdown(result, path.with_suffix(".md"))
    print(path.with_suffix(".md").read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", help="data root (a `cellseg synth` or fetched root); --quick makes a tiny one")
    parser.add_argument("--out", help="output directory (OUT/host_memory.json, .md, the run); required to run")
    parser.add_argument("--config", default=str(REPO / "configs/demo/unet_2d.yaml"), help="training config")
    parser.add_argument("--minutes", type=float, default=30.0, help="training-clock minutes (default 30)")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between memory samples (default 15)")
    parser.add_argument("--quick", action="store_true", help="tiny synthetic root, smoke model, a few seconds")
    parser.add_argument("--summarize", metavar="FILE", type=Path,
                        help="summarise a stored host_memory.json again (rewrites it and the .md beside it)")
    parser.add_argument("--warmup-min", type=float, default=0.0,
                        help="with --summarize: a warm-up of at least this many minutes (default 0)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for the training job")
    args = parser.parse_args(argv)
    if args.summarize:
        return resummarise(args.summarize, args.warmup_min)
    if not args.out:
        parser.error("--out is required (or --summarize FILE)")
    if args.minutes <= 0 or args.every <= 0:
        parser.error("--minutes and --every must be > 0")
    if args.quick:
        args.root = args.root or str(Path(args.out) / "data")
        if not Path(args.root).is_dir():
            subprocess.run([sys.executable, "-m", "cellseg", "synth", "--preset", "tiny", "--seed", "0",
                            "--out", args.root], check=True, cwd=REPO)
        args.config = str(REPO / "configs/smoke/unet_2d.yaml")
        args.minutes, args.every = min(args.minutes, 0.05), min(args.every, 0.3)
    elif not args.root:
        parser.error("--root is required (or --quick)")
    run(args)
    print((Path(args.out) / "host_memory.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
