"""`cellseg view --screenshot` on the demo's output: the pictures docs/viewing.md shows, and how long each took.

    bash scripts/demo.sh demo_out                                   # once (minutes on 2 CPU cores)
    python -m bench.view_screenshots demo_out [--images docs/images] [--out OUT]

Each picture is one `cellseg view ... --screenshot` command, timed as a user waits for it, from the command's start
to its exit (Python's start, the server, Chromium's start, every visible chunk loaded and drawn, the PNG written):

    view_validation.png   a validation crop: its EM, the first model's 8x TTA probabilities and the crop's truth
    view_ensemble.png     a test crop: its EM, the decided ensemble's probabilities and its 2026 segmentation (the
                          test crops' labels are held out, so no truth)

Writes the PNGs into --images and the record OUT/view_screenshots.json (default
bench/results/view_screenshots_cpu.json): seconds, chunks and size per picture, Chromium's version, the CPU cores,
the date. The goal (docs/viewing.md): each picture in under `GOAL_S` seconds on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.record import record_paths

GOAL_S = 60.0
SIZE = "1200x900"
WROTE = re.compile(r"wrote .*: (\d+) × (\d+) pixels, (\d+) chunks")


def _first_model(demo: Path) -> str:
    stores = sorted((demo / "predictions" / "tta8").glob("*.zarr"))
    if not stores:
        raise FileNotFoundError(f"{demo}/predictions/tta8: no prediction store (run scripts/demo.sh {demo} first)")
    return stores[0].stem


def _crops(demo: Path, model: str) -> tuple[str, str]:
    """A validation crop the model predicted (a training crop of the root, with truth) and a test crop the ensemble
    predicted."""
    from cellseg.data.crops import Catalog
    from cellseg.data.prediction_store import PredictionStore

    train = {f"crop{n}" for n in Catalog.from_dir(demo / "data").train}
    predicted = PredictionStore.open(demo / "predictions" / "tta8" / f"{model}.zarr").completed()
    validation = next(c for c in predicted if c in train)
    test = PredictionStore.open(demo / "ensemble.zarr").completed()[0]
    return validation.removeprefix("crop"), test.removeprefix("crop")


def _shoot(name: str, args: list[str], images: Path, demo: Path) -> dict[str, Any]:
    out = images / f"{name}.png"
    command = [sys.executable, "-m", "cellseg", "-q", "view", *args, "--screenshot", str(out), "--size", SIZE,
               "--overwrite"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    width, height, chunks = (int(v) for v in WROTE.search(done.stdout).groups())  # type: ignore[union-attr]
    print(f"{name}: {seconds:.1f} s, {chunks} chunks, {width} × {height}", flush=True)
    return {"picture": out.name, "seconds": round(seconds, 2), "chunks": chunks, "width": width, "height": height,
            "command": ["cellseg", "view", *(a.replace(str(demo), "demo_out") for a in args), "--screenshot",
                        out.name, "--size", SIZE]}


def _browser_version() -> str:
    from cellseg.viz.view_screenshot import find_browser

    return subprocess.run([find_browser(), "--version"], capture_output=True, text=True, check=False).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("demo", type=Path, help="the output folder of scripts/demo.sh")
    parser.add_argument("--images", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "images",
                        help="where the PNGs go (default docs/images)")
    parser.add_argument("--out", type=Path, default=None, help="folder of the record (default bench/results)")
    args = parser.parse_args(argv)
    demo, data = args.demo, str(args.demo / "data")
    model = _first_model(demo)
    validation, test = _crops(demo, model)
    pictures = [
        _shoot("view_validation", [data, str(demo / "predictions" / "tta8" / f"{model}.zarr"), "--crop", validation,
                                   "--layers", f"*EM,{model}/*,truth/crop{validation}/*"], args.images, demo),
        _shoot("view_ensemble", [data, str(demo / "ensemble.zarr"), str(demo / "segmentation_2026.zarr"), "--crop",
                                 test], args.images, demo),
    ]
    doc = {"bench": "view_screenshots", "date": datetime.date.today().isoformat(), "browser": _browser_version(),
           "cpu_cores": len(os.sched_getaffinity(0)), "goal_s": GOAL_S, "model": model,
           "slowest_s": max(p["seconds"] for p in pictures),
           "met": all(p["seconds"] < GOAL_S for p in pictures), "pictures": pictures}
    json_path, _ = record_paths(args.out, "view_screenshots", cpu=True)
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {json_path}")
    return 0 if doc["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
