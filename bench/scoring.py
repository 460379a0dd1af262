"""Benchmark: scoring one test-sized crop with all 48 labels, both eras, against a straightforward reference.

    .venv/bin/python -m bench.scoring                 # 600³ crop at 4 nm (a few minutes on 2 cores)
    .venv/bin/python -m bench.scoring --size 200      # quick run

A synthetic crop (`--size`³ voxels at 4 nm, 10 instance classes with ~200 objects each, 38 semantic
classes) and an imperfect submission (objects shifted, some dropped, false positives added) are
written to a temporary directory; `cellseg.eval.evaluate` scores it for each era while a thread samples
the resident memory of the process and its workers. The reference (`bench/reference_scoring.py`: whole-volume
masks, per-object KD-trees / padded-box distance transforms, dense matrices) is timed on a smaller
crops (`--naive-sizes`, same object count), where both implementations' per-crop scores are compared
for equality; its time at `--size` is extrapolated with the exponent fitted between the two sizes.
Results go to `bench/results/scoring_cpu.json` and `bench/results/scoring_cpu.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.record import record_paths

VOXEL_NM = 4.0
OBJECTS = 200


def _balls(shape, rng, n, radius_range, first_id=1):
    out = np.zeros(shape, dtype=np.uint16)
    for k in range(n):
        r = int(rng.integers(*radius_range))
        c = [int(rng.integers(r, s - r)) for s in shape]
        box = tuple(slice(ci - r, ci + r + 1) for ci in c)
        z, y, x = np.ogrid[-r:r + 1, -r:r + 1, -r:r + 1]
        ball = z * z + y * y + x * x <= r * r
        out[box][ball] = first_id + k
    return out


def _perturb(truth, rng, radius_range):
    """Objects shifted by one voxel, 5 % dropped, 5 % false positives."""
    pred = np.roll(truth, 1, axis=int(rng.integers(0, 3)))
    ids = np.unique(truth)[1:]
    drop = rng.choice(ids, size=max(1, ids.size // 20), replace=False)
    pred[np.isin(pred, drop)] = 0
    extra = _balls(truth.shape, rng, max(1, ids.size // 20), radius_range, first_id=int(ids.max()) + 1)
    pred[(extra > 0) & (pred == 0)] = extra[(extra > 0) & (pred == 0)]
    return pred


def make_crop(root: Path, size: int, seed: int = 0) -> tuple[Path, Path]:
    """Write truth.zarr and submission.zarr (crop1, all 48 tested classes) under `root`."""
    from cellseg.classes import instance_classes, semantic_classes
    from cellseg.data.write import write_array

    rng = np.random.default_rng(seed)
    shape = (size,) * 3
    attrs = {"voxel_size": [VOXEL_NM] * 3, "translation": [0.0] * 3, "shape": list(shape)}
    radius_range = (max(2, size // 100), max(4, size // 30))
    masks = []
    for label in instance_classes():
        truth = _balls(shape, rng, OBJECTS, radius_range)
        write_array(root / "truth.zarr" / "crop1" / label, truth, attrs=attrs)
        write_array(root / "submission.zarr" / "crop1" / label, _perturb(truth, rng, radius_range), attrs=attrs)
        masks.append(truth > 0)
    for k, label in enumerate(semantic_classes()):
        truth = np.roll(masks[k % len(masks)], k, axis=k % 3).astype(np.uint8)
        write_array(root / "truth.zarr" / "crop1" / label, truth, attrs=attrs)
        write_array(root / "submission.zarr" / "crop1" / label, np.roll(truth, 1, axis=(k + 1) % 3), attrs=attrs)
    return root / "submission.zarr", root / "truth.zarr"


def _rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out.append(int(entry))
    return out


class PeakMemory:
    """Samples the resident memory of this process and its children (Linux /proc) every 50 ms."""

    def __init__(self):
        self._pid = os.getpid()
        self.peak = 0
        self.peak_worker = 0  # largest resident memory of a single worker process
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _rss(self) -> int:
        total = _rss_bytes(self._pid)
        for child in _children(self._pid):
            rss = _rss_bytes(child)
            total += rss
            self.peak_worker = max(self.peak_worker, rss)
        return total

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(0.05)

    def __enter__(self):
        self.baseline = self._rss()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def time_ours(submission: Path, truth: Path, era: str, workers: int):
    from cellseg.eval import evaluate

    with PeakMemory() as mem:
        start = time.perf_counter()
        ev = evaluate(submission, truth, metric=era, workers=workers)
        seconds = time.perf_counter() - start
    return ev, seconds, mem.peak - mem.baseline, mem.peak_worker


def time_reference(submission: Path, truth: Path, era: str):
    import zarr

    from bench import reference_scoring as ref
    from cellseg.eval.rules import is_scored_as_instance

    start = time.perf_counter()
    scores = {}
    t_root, s_root = zarr.open_group(str(truth / "crop1"), mode="r"), zarr.open_group(str(submission / "crop1"), mode="r")
    for label in sorted(t_root.array_keys()):
        t, p = t_root[label][...], s_root[label][...]
        vs = [VOXEL_NM] * 3
        if is_scored_as_instance(label):
            scores[label] = ref.instance_2025(p, t, vs) if era == "2025" else ref.instance_2026(p, t, vs)
        else:
            scores[label] = dict(zip(("tp", "fp", "fn"), ref.semantic(p, t), strict=True))
    return scores, time.perf_counter() - start


def _same(ours: dict, theirs: dict) -> bool:
    for label, want in theirs.items():
        got = ours["crop1"][label]
        for key, value in want.items():
            if key in got and not (got[key] == value or abs(float(got[key]) - float(value)) <= 1e-12 * abs(value)):
                if not (key == "iou" or key == "dice_score"):
                    print(f"  mismatch {label}.{key}: ours {got[key]} reference {value}")
                    return False
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=600, help="crop edge in voxels (default 600)")
    parser.add_argument("--naive-sizes", type=int, nargs=2, default=(64, 100),
                        help="two crop edges at which the reference is timed (default 64 100)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", help="folder for scoring.json / scoring.md (default: bench/results/scoring_cpu.*)")
    args = parser.parse_args(argv)
    results = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
               "size": args.size, "naive_sizes": list(args.naive_sizes), "workers": args.workers, "labels": 48,
               "objects_per_instance_class": OBJECTS, "eras": {}}
    with tempfile.TemporaryDirectory(prefix="cellseg-bench-") as tmp:
        smalls = [make_crop(Path(tmp) / f"small{n}", n) for n in args.naive_sizes]
        start = time.perf_counter()
        big = make_crop(Path(tmp) / "big", args.size)
        results["generate_seconds"] = time.perf_counter() - start
        voxels = args.size**3
        for era in ("2025", "2026"):
            ev, seconds, added, worker_peak = time_ours(*big, era, args.workers)
            small = []
            for n, crop in zip(args.naive_sizes, smalls, strict=True):
                ev_small, ours_small, _, _ = time_ours(*crop, era, 1)
                ref_scores, ref_small = time_reference(*crop, era)
                small.append({"size": n, "ours_seconds": ours_small, "reference_seconds": ref_small,
                              "speedup": ref_small / ours_small,
                              "same_numbers": _same(ev_small.crop_scores, ref_scores)})
            (n1, t1), (n2, t2) = [(s["size"], s["reference_seconds"]) for s in small]
            exponent = float(np.log(t2 / t1) / np.log((n2 / n1) ** 3))  # reference time ∝ voxels^exponent
            extrapolated = t2 * ((args.size / n2) ** 3) ** exponent
            results["eras"][era] = {
                "seconds_per_crop": seconds, "mvox_per_s": 48 * voxels / seconds / 1e6,
                "peak_added_bytes": added, "peak_bytes_per_voxel": added / voxels,
                "peak_worker_bytes_per_voxel": worker_peak / voxels, "overall_score": ev.overall_score,
                "small": small, "reference_exponent": exponent,
                "reference_seconds_extrapolated": extrapolated, "speedup_extrapolated": extrapolated / seconds,
            }
            print(era, json.dumps(results["eras"][era], indent=1), flush=True)
    json_path, md_path = record_paths(args.out, "scoring", cpu=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    md_path.write_text(markdown(results))
    print(md_path.read_text())
    return 0


def markdown(r: dict) -> str:
    """The results as a Markdown section for docs/benchmarks.md."""
    n1, n2 = r["naive_sizes"]
    lines = [
        "## Scoring (cellseg evaluate)",
        "",
        f"One synthetic test crop of {r['size']}³ voxels at 4 nm with all 48 labels (10 instance classes with "
        f"~{r['objects_per_instance_class']} objects each, 38 semantic classes) and an imperfect submission, scored "
        f"with {r['workers']} worker processes on {r['machine']['cpus']} CPUs (`bench/scoring.py`). Memory: peak "
        "resident memory of the whole process tree above its baseline, and of the largest single worker, per voxel "
        "of the crop. Reference: a straightforward implementation of the official algorithm "
        f"(`bench/reference_scoring.py`: whole-volume masks, per-object KD-trees or cap-padded EDTs), timed at {n1}³ "
        f"and {n2}³ with the same object count, where both give the same per-crop numbers; its time at {r['size']}³ "
        "is extrapolated with the exponent fitted between those two sizes (time ∝ voxels^k).",
        "",
        f"| era | s / crop | Mvox/s (48 labels) | peak B/voxel (tree / worker) | reference {n1}³ / {n2}³ | "
        f"ours {n1}³ / {n2}³ | k | reference at {r['size']}³ (extrap.) | speed-up | same numbers |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for era, e in r["eras"].items():
        a, b = e["small"]
        lines.append(
            f"| {era} | {e['seconds_per_crop']:.1f} | {e['mvox_per_s']:.0f} | {e['peak_bytes_per_voxel']:.1f} / "
            f"{e['peak_worker_bytes_per_voxel']:.1f} | {a['reference_seconds']:.1f} s / {b['reference_seconds']:.1f} s | "
            f"{a['ours_seconds']:.2f} s / {b['ours_seconds']:.2f} s | {e['reference_exponent']:.2f} | "
            f"{e['reference_seconds_extrapolated'] / 60:.0f} min | {e['speedup_extrapolated']:.0f}× "
            f"(measured {b['speedup']:.0f}× at {n2}³) | {'yes' if a['same_numbers'] and b['same_numbers'] else 'NO'} |")
    lines += ["", f"Generating the {r['size']}³ crop took {r['generate_seconds']:.0f} s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
