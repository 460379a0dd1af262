"""`cellseg export` at the architectures' default presets: how long exporting takes, how large the graphs are, how
close each format stays to PyTorch, and how fast ONNX Runtime and TorchScript run a tile on the CPU beside eager
PyTorch (what a microscopist without a GPU predicts with).

    python -m bench.export [--models unet_3d,unet_2d] [--repeats 3] [--out OUT]

Per architecture (randomly initialised at its default preset, 14 output channels, seed 0; the graphs do not depend
on the weights' values): the seconds `to_torchscript` and `to_onnx` take (trace or export, plus the parity check on
the CPU, as `cellseg export` runs them), the serialised sizes, the largest difference from PyTorch on a batch of one
and two tiles, and the median of `--repeats` forwards of one tile (fp32, the training patch) in eager PyTorch, the
TorchScript graph and ONNX Runtime, measured one after the other in one process with the same threads; and the
peak resident memory of that process (each architecture runs in a fresh one). Writes OUT/export.json (default
bench/results/export_cpu.json).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.record import record_paths

CHANNELS = 14  # a typical multi-class run: the classes and their boundary channels


def _median_s(fn: Any, repeats: int) -> float:
    fn()  # warm-up: allocations, ONNX Runtime's first run
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, repeats: int) -> dict[str, Any]:
    """One architecture's export times, sizes, parity and CPU forward times (module docstring)."""
    from cellseg.export.network import example_input, exported, to_onnx, to_torchscript
    from cellseg.infer.packaged import onnx_session, torchscript_quietly
    from cellseg.models import build_model

    torch.manual_seed(0)
    model = build_model(name, 1, CHANNELS)
    patch = tuple(model.spec.default_patch_vox)
    patch3 = patch if len(patch) == 3 else (1, *patch)
    example = example_input(patch3, model.spec.spatial_dims)
    wrapped = exported(model)
    start = time.perf_counter()
    traced, ts_diff = to_torchscript(wrapped, example)
    ts_s = time.perf_counter() - start
    start = time.perf_counter()
    graph, onnx_diff = to_onnx(wrapped, example)
    onnx_s = time.perf_counter() - start
    buffer = io.BytesIO()
    with torchscript_quietly():
        torch.jit.save(traced, buffer)
    session = onnx_session(graph)
    feed = {"em": example.numpy()}
    with torch.no_grad():
        eager = _median_s(lambda: wrapped(example), repeats)
        script = _median_s(lambda: traced(example), repeats)
    ort = _median_s(lambda: session.run(None, feed), repeats)
    row = {"model": name, "patch_vox": list(patch), "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
           "torchscript_s": round(ts_s, 1), "onnx_s": round(onnx_s, 1),
           "torchscript_mb": round(len(buffer.getvalue()) / 2**20, 1), "onnx_mb": round(len(graph) / 2**20, 1),
           "torchscript_max_diff": ts_diff, "onnx_max_diff": onnx_diff,
           "tile_s": {"pytorch": round(eager, 3), "torchscript": round(script, 3), "onnxruntime": round(ort, 3)},
           "onnxruntime_speedup": round(eager / ort, 2),
           "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 1)}
    return row


def in_child(name: str, repeats: int) -> dict[str, Any]:
    """`measure` in a fresh process: its peak memory is the architecture's alone."""
    done = subprocess.run([sys.executable, "-m", "bench.export", "--one", name, "--repeats", str(repeats)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: exit {done.returncode}: {done.stderr.strip()[-600:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    from cellseg.models import list_models

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(list_models()), help="comma-separated (default: all eight)")
    parser.add_argument("--repeats", type=int, default=3, help="timed forwards per engine (median; default 3)")
    parser.add_argument("--out", type=Path, default=None, help="folder of the record (default bench/results)")
    parser.add_argument("--one", metavar="MODEL", help=argparse.SUPPRESS)  # the child process of one architecture
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.repeats)))
        return 0
    import onnxruntime

    rows = [in_child(name.strip(), args.repeats) for name in args.models.split(",") if name.strip()]
    doc = {"bench": "export", "date": datetime.date.today().isoformat(), "torch": torch.__version__.split("+")[0],
           "onnxruntime": onnxruntime.__version__, "threads": torch.get_num_threads(),
           "cpu_cores": len(os.sched_getaffinity(0)), "channels": CHANNELS, "repeats": args.repeats,
           "models": {r["model"]: r for r in rows}}
    json_path, _ = record_paths(args.out, "export", cpu=True)
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
