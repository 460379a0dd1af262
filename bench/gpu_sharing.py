"""Jobs sharing one GPU: time-sliced (the default) against CUDA MPS clients, side by side in one run.

    python -m bench.gpu_sharing --out OUT [--jobs unet_3d:2,resnet_3d:2,unet_2d,swin_2d] [--seconds 40]
    python -m bench.gpu_sharing --quick --out /tmp/gs   # CPU, tiny models, time-sliced only (checks the script)

The quality benchmark trains four jobs on each GPU at once (bench/studies/quality). Here the same mix trains in memory
(random batches already on the GPU, cellseg's step: bf16 autocast, channels-last, compiled, fused AdamW, the
masked BCE + Dice loss; `bench/train_step.py`), each job in its own process, first time-sliced, then as clients of
an MPS daemon (`bench/studies/quality/mps.py`). Every process compiles and warms up, then all start together and count
their steps for `--seconds`. Per job: samples/s in each mode and their ratio; overall: the mean ratio (each job's
share of the GPU weighs the same). A job is NAME or NAME:BATCH (default batch: the experiment config's).
Writes OUT/gpu_sharing.json and OUT/gpu_sharing.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.record import record_paths

READY_TIMEOUT_S = 600.0  # compilation of four models at once on a shared host
REPO = Path(__file__).resolve().parents[1]  # the jobs import `bench` from here, whatever the working directory


def worker(args: argparse.Namespace) -> None:
    """One job: build, compile, warm up, say ready, wait for the start, count steps for `seconds`."""
    import torch

    from bench.train_step import cellseg_step, make_model, preset

    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    batch, patch, params = preset(args.worker, args.quick)
    batch = args.batch or batch
    g = torch.Generator(device=device).manual_seed(0)
    image = torch.rand((batch, 1, *patch), device=device, generator=g)
    target = torch.rand((batch, 16, *patch), device=device, generator=g) > 0.9
    step, record = cellseg_step(make_model(args.worker, params, device), image, target, torch.ones_like(target),
                                device, "off" if args.quick else "on")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        step()
    sync()
    Path(args.ready).touch()
    while not Path(args.start).exists():
        time.sleep(0.01)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        step()
        steps += 1
        if steps % 5 == 0:
            sync()
    sync()
    elapsed = time.perf_counter() - t0
    Path(args.result).write_text(json.dumps({"job": args.worker, "batch": batch, "patch": list(patch),
                                             "steps": steps, "seconds": elapsed,
                                             "samples_per_s": steps * batch / elapsed, **record}))


def run_mode(jobs: list[tuple[str, int | None]], args: argparse.Namespace, env: dict[str, str], folder: Path
             ) -> list[dict]:
    """Every job at once in its own process; their results."""
    folder.mkdir(parents=True)
    start = folder / "start"
    procs = []
    for i, (name, batch) in enumerate(jobs):
        cmd = [sys.executable, "-m", "bench.gpu_sharing", "--out", str(folder), "--worker", name,
               "--seconds", str(args.seconds), "--ready", str(folder / f"{i}.ready"), "--start", str(start),
               "--result", str(folder / f"{i}.json"), *(["--batch", str(batch)] if batch else []),
               *(["--quick"] if args.quick else [])]
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        procs.append(subprocess.Popen(cmd, env={**os.environ, **env, "PYTHONPATH": path}))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all((folder / f"{i}.ready").exists() for i in range(len(jobs))):
        if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
            for p in procs:
                p.kill()
            raise RuntimeError(f"a job failed or did not get ready within {READY_TIMEOUT_S:.0f} s (its output is "
                               "above)")
        time.sleep(0.2)
    start.touch()
    codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"jobs exited with {codes} (their output is above)")
    return [json.loads((folder / f"{i}.json").read_text()) for i in range(len(jobs))]


def parse_jobs(text: str) -> list[tuple[str, int | None]]:
    """"unet_3d:2,unet_2d" → [("unet_3d", 2), ("unet_2d", None)]."""
    jobs = []
    for item in text.split(","):
        name, _, batch = item.partition(":")
        jobs.append((name, int(batch) if batch else None))
    return jobs


def markdown(doc: dict) -> str:
    """The table for docs/benchmarks.md."""
    modes = list(doc["modes"])
    lines = [f"{doc['device']}, torch {doc['torch']}, {doc['date']}; {len(doc['jobs'])} jobs at once, each "
             f"counting its steps for {doc['seconds']:g} s after compiling and warming up.", "",
             "| job | batch × patch | " + " | ".join(f"{m} samples/s" for m in modes)
             + (" | MPS / time-sliced |" if len(modes) > 1 else " |"),
             "|---|---|" + "---|" * (len(modes) + (len(modes) > 1))]
    for i, job in enumerate(doc["modes"][modes[0]]):
        rates = [doc["modes"][m][i]["samples_per_s"] for m in modes]
        ratio = f" | {rates[1] / rates[0]:.2f}×" if len(modes) > 1 else ""
        lines.append(f"| {job['job']} | {job['batch']} × {'×'.join(map(str, job['patch']))} | "
                     + " | ".join(f"{r:.1f}" for r in rates) + ratio + " |")
    if "mean_ratio" in doc:
        lines.append(f"| **mean** | | | | **{doc['mean_ratio']:.2f}×** |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(prog="python -m bench.gpu_sharing", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="folder for gpu_sharing.json and .md (default: bench/results/gpu_sharing_<hardware>.*)")
    p.add_argument("--jobs", default="unet_3d:2,resnet_3d:2,unet_2d,swin_2d",
                   help="NAME[:BATCH],... trained at once (default: the quality benchmark's first wave)")
    p.add_argument("--seconds", type=float, default=40.0, help="steps counted for this long in each mode")
    p.add_argument("--quick", action="store_true", help="CPU, tiny models, time-sliced only")
    for hidden in ("--worker", "--ready", "--start", "--result"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    import torch

    from bench.studies.quality.mps import mps_daemon

    jobs = parse_jobs(args.jobs)
    doc = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "seconds": args.seconds,
           "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.quick else "CPU",
           "jobs": [f"{n}:{b}" if b else n for n, b in jobs], "modes": {}}
    with tempfile.TemporaryDirectory(prefix="gpu_sharing_") as tmp:
        print("time-sliced ...", flush=True)
        doc["modes"]["time-sliced"] = run_mode(jobs, args, {}, Path(tmp) / "sliced")
        if not args.quick:
            print("MPS ...", flush=True)
            with mps_daemon(Path(tmp) / "mps") as env:
                doc["modes"]["MPS"] = run_mode(jobs, args, env, Path(tmp) / "clients")
    if "MPS" in doc["modes"]:
        ratios = [b["samples_per_s"] / a["samples_per_s"]
                  for a, b in zip(doc["modes"]["time-sliced"], doc["modes"]["MPS"], strict=True)]
        doc["mean_ratio"] = math.fsum(ratios) / len(ratios)
    json_path, md_path = record_paths(args.out, "gpu_sharing")
    json_path.write_text(json.dumps(doc, indent=1) + "\n")
    md_path.write_text(markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
