"""Training-loader throughput: patches/s and MB/s vs workers, 3D 128³ and 2D 256², with and without
augmentation, peak and growth of host RSS — optionally side by side with cellmap-data on the same data.

    python -m bench.loader --root DATA --out OUT [--workers 0,2,4,8,16] [--seconds 8] [--peer-python PY]
    python -m bench.loader --root DATA --out OUT --resident off,host[,gpu]   # streaming vs resident data

`--resident` compares the streaming loader (`off`: DataLoader workers read zarr) with resident data
(`cellseg.data.resident`: the crops read once into host or GPU memory, batches cut from them in the main
process while up to 2 workers compute the samples' windows); its set-up time and bytes are recorded too.

DATA is a `cellseg synth` root (the `medium` preset for GPU nodes); `--synth medium` generates it first.
"With augmentation" runs our batched GPU augmentation on each batch (on the CPU when there is no GPU);
without it the loader alone is timed. `--rss-samples 10000` measures RSS growth over a long run.
`--peer-python` runs bench/peer_cellmap_data.py in another interpreter (cellmap-data needs zarr < 3).
Writes OUT/loader.json and OUT/loader.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.record import record_paths
from cellseg.config.schema import AugmentConfig, DataConfig, LoaderConfig
from cellseg.data.loader import build_train_data

BOUNDARY_CACHE: list[str | None] = [None]  # set by --boundary-cache
SHAPES = {"3d": ((128, 128, 128), (8.0, 8.0, 8.0)), "2d": ((1, 256, 256), (8.0, 8.0, 8.0))}


def rss_bytes() -> int:
    """Memory of this process and its children (DataLoader workers): the sum of PSS where available
    (shared library pages counted once across processes), else of RSS."""
    try:
        import psutil
    except ImportError:  # /proc fallback, Linux only
        return _proc_rss(os.getpid())
    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            total += getattr(p.memory_full_info(), "pss", p.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def _proc_rss(pid: int) -> int:
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().split()
            if int(entry.name) == pid or int(stat[3]) == pid:
                total += int(stat[23]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError):
            continue
    return total


def classes_of(root: Path) -> tuple[str, ...]:
    """The tested classes annotated somewhere in the root's catalogue."""
    from cellseg.classes import tested_classes
    from cellseg.data.crops import Catalog

    present = {c for crop in Catalog.from_dir(root).train.values() for c in crop.labels}
    return tuple(c for c in tested_classes() if c in present)


def time_loader(root: Path, shape: str, workers: int, augment: bool, seconds: float, batch: int, seed: int = 0,
                boundaries: bool = True, resident: str = "off") -> dict[str, float]:
    """Run one configuration for ~`seconds` after warm-up."""
    patch, vs = SHAPES[shape]
    data = DataConfig(root=str(root), classes=classes_of(root), voxel_size_nm=vs, patch_shape_vox=patch,
                      slice_axes=("z", "y", "x") if shape == "2d" else ("z",), instance_boundaries=boundaries,
                      boundary_cache=BOUNDARY_CACHE[0], resident=resident)
    loader_cfg = LoaderConfig(num_workers=workers, samples_per_epoch=10**6, prefetch_factor=4)
    start = time.perf_counter()
    td = build_train_data(data, loader_cfg, AugmentConfig(enabled=augment), batch_size=batch, seed=seed)
    setup_s = time.perf_counter() - start
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    it = iter(td.loader)
    for _ in range(2 + workers):  # warm-up: workers started, first batches through
        next(it)
    rss0, n, nbytes, start = rss_bytes(), 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        b = next(it)
        nbytes += sum(v.numel() * v.element_size() for v in b.values() if isinstance(v, torch.Tensor))
        if augment:
            b = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in b.items()}
            td.augment(b, n)
        if device.type == "cuda":  # resident batches are cut asynchronously on the GPU: count finished ones
            torch.cuda.synchronize()
        n += 1
    elapsed = time.perf_counter() - start
    result = {"shape": shape, "workers": workers, "augment": augment, "batch": batch, "boundaries": boundaries,
              "channels": data.num_target_channels, "data": td.resident, "setup_s": setup_s,
              "resident_GB": td.loader.data.nbytes / 1e9 if td.resident != "off" else 0.0,
              "patches_per_s": n * batch / elapsed, "MB_per_s": nbytes / elapsed / 1e6,
              "rss_GB": rss_bytes() / 1e9, "rss_start_GB": rss0 / 1e9, "batches": n}
    del it, td
    return result


def rss_growth(root: Path, samples: int, workers: int, shape: str = "2d") -> dict[str, float]:
    """RSS after warm-up vs after `samples` patches (2D by default: 10,000 of them take seconds)."""
    patch, vs = SHAPES[shape]
    data = DataConfig(root=str(root), classes=classes_of(root), voxel_size_nm=vs, patch_shape_vox=patch,
                      slice_axes=("z", "y", "x") if shape == "2d" else ("z",))
    data = dataclasses.replace(data, resident="off")  # the streaming loader's workers
    td = build_train_data(data, LoaderConfig(num_workers=workers, samples_per_epoch=samples + 64),
                          AugmentConfig(), batch_size=4, seed=1)
    it = iter(td.loader)
    for _ in range(16):
        next(it)
    rss0, done = rss_bytes(), 64
    for b in it:
        done += b["image"].shape[0]
    rss1 = rss_bytes()
    return {"samples": done, "workers": workers, "shape": shape, "rss_after_warmup_GB": rss0 / 1e9,
            "rss_end_GB": rss1 / 1e9,
            "growth_percent": 100 * (rss1 - rss0) / rss0}


def run_peer(python: str, root: Path, shape: str, workers: int, seconds: float, batch: int) -> dict | None:
    """cellmap-data on the same data, in its own interpreter (see bench/peer_cellmap_data.py)."""
    script = Path(__file__).with_name("peer_cellmap_data.py")
    cmd = [python, str(script), "--root", str(root), "--shape", shape, "--workers", str(workers),
           "--seconds", str(seconds), "--batch", str(batch), "--classes", ",".join(classes_of(root))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        print(f"peer failed ({shape}, {workers} workers): {proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def markdown(results: dict) -> str:
    """The results as a markdown table."""
    lines = [f"Loader benchmark, {results['date']}, {results['host']}, torch {results['torch']}, "
             f"{results['cpus']} CPU cores, GPU: {results['gpu']}", "",
             "| patch | channels | data | workers | GPU aug | batch | cellseg patches/s | MB/s | memory GB | set-up s "
             "| resident GB | cellmap-data patches/s | ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    peers = {(p["shape"], p["workers"]): p for p in results["peer"] if p}
    for r in results["runs"]:
        data = r.get("data", "off")
        p = peers.get((r["shape"], r["workers"])) if not r["augment"] and data == "off" else None
        peer, ratio = (f"{p['patches_per_s']:.1f}", f"{r['patches_per_s'] / p['patches_per_s']:.1f}×") if p else ("", "")
        where = "streamed" if data == "off" else f"resident ({data})"
        lines.append(f"| {r['shape']} | {r.get('channels', '')} | {where} | {r['workers']} | "
                     f"{'yes' if r['augment'] else 'no'} | {r['batch']} | {r['patches_per_s']:.1f} | "
                     f"{r['MB_per_s']:.0f} | {r['rss_GB']:.2f} | {r.get('setup_s', 0):.1f} | "
                     f"{r.get('resident_GB', 0):.2f} | {peer} | {ratio} |")
    if results.get("rss"):
        g = results["rss"]
        lines += ["", f"RSS over {g['samples']} {g.get('shape', '3d')} samples with {g['workers']} workers: "
                      f"{g['rss_after_warmup_GB']:.2f} → {g['rss_end_GB']:.2f} GB ({g['growth_percent']:+.1f} %)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="data root (generated with --synth if missing)")
    parser.add_argument("--synth", choices=["tiny", "small", "medium"], help="generate ROOT with this preset first")
    parser.add_argument("--out", type=Path, help="folder for loader.json and .md (default: bench/results/loader_<hardware>.*)")
    parser.add_argument("--workers", default="0,2,4,8,16")
    parser.add_argument("--shapes", default="3d,2d")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds per configuration")
    parser.add_argument("--batch-3d", type=int, default=2)
    parser.add_argument("--batch-2d", type=int, default=16)
    parser.add_argument("--rss-samples", type=int, default=0, help="also measure RSS growth over this many samples")
    parser.add_argument("--peer-python", help="interpreter with cellmap-data installed (side-by-side run)")
    parser.add_argument("--peer-workers", help="worker counts for the peer (default: --workers)")
    parser.add_argument("--boundaries", choices=["on", "off", "both"], default="on",
                        help="instance-boundary target channels (10 extra id-array reads per 3D sample)")
    parser.add_argument("--boundary-cache", default=None, metavar="DIR|auto",
                        help="data.boundary_cache for the runs (default: none, boundaries per sample)")
    parser.add_argument("--augment", default="no,yes", help="runs without and/or with the GPU augmentation")
    parser.add_argument("--resident", default="off",
                        help="data.resident values to compare: off (streaming), host, gpu (e.g. off,host)")
    parser.add_argument("--no-runs", action="store_true", help="only the RSS measurement")
    args = parser.parse_args(argv)
    BOUNDARY_CACHE[0] = args.boundary_cache
    if args.synth and not (args.root / "train_crop_manifest.csv").is_file():
        from cellseg.synth import generate

        generate(args.root, preset=args.synth, seed=0, workers=os.cpu_count() or 1)
    results = {"date": datetime.date.today().isoformat(), "host": platform.node(), "torch": torch.__version__,
               "cpus": os.cpu_count(), "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
               "runs": [], "peer": []}
    peer_workers = {int(w) for w in (args.peer_workers or args.workers).split(",")}
    modes = args.resident.split(",")
    for shape in [] if args.no_runs else args.shapes.split(","):
        batch = args.batch_3d if shape == "3d" else args.batch_2d
        workers_list = [int(w) for w in args.workers.split(",")]
        # Resident data runs once, with the most workers asked for (it starts at most SPEC_WORKERS, which only
        # compute the samples' windows).
        runs = [(mode, workers) for mode in modes for workers in (workers_list if mode == "off" else [max(workers_list)])]
        for mode, workers in runs:
            for augment in [a == "yes" for a in args.augment.split(",")]:
                for boundaries in {"on": [True], "off": [False], "both": [True, False]}[args.boundaries]:
                    r = time_loader(args.root, shape, workers, augment, args.seconds, batch, boundaries=boundaries,
                                    resident=mode)
                    print(json.dumps(r), flush=True)
                    results["runs"].append(r)
                    save(args.out, results)
            if args.peer_python and mode == "off" and workers in peer_workers:
                p = run_peer(args.peer_python, args.root, shape, workers, args.seconds, batch)
                print(json.dumps(p), flush=True)
                results["peer"].append(p)
                save(args.out, results)
    if args.rss_samples:
        results["rss"] = rss_growth(args.root, args.rss_samples, max(int(w) for w in args.workers.split(",")))
        print(json.dumps(results["rss"]), flush=True)
    save(args.out, results)
    print(markdown(results))
    return 0


def save(out: Path | None, results: dict) -> None:
    """Write JSON and markdown into `out` (default: this hardware's record in bench/results), after every
    configuration, so a cut-short run keeps what it measured."""
    json_path, md_path = record_paths(out, "loader")
    json_path.write_text(json.dumps(results, indent=2))
    md_path.write_text(markdown(results))


if __name__ == "__main__":
    sys.exit(main())
