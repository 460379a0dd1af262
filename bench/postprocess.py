"""Benchmark: instance post-processing of one probability volume, our GPU and CPU paths vs the textbook
scipy/scikit-image pipeline.

    .venv/bin/python -m bench.postprocess --size 128 --out OUT/postprocess_cpu128   # 2-core box
    python -m bench.postprocess --size 512 --repeat 1 --no-torch-cpu   # a GPU: writes bench/results/postprocess_<hardware>

The volume (`--size`³ voxels at `--voxel-nm` nm) holds ~3000 × (size/512)³ touching ellipsoids (radii
`--radius` voxels, 70 % of them placed against an earlier one, touching voxels assigned to the nearer
centre in scaled distance). Their mask, blurred and lightly noised, is the class probability; the voxels
where two objects touch, dilated and blurred, are the boundary channel (what a model with boundary
targets predicts).

Timed, each on the same arrays (best of `--repeat` after a warm-up run):
- ours, torch on CUDA (`gpu.segment_instances_torch`; input already on the device, ids left there, the
  transfers timed separately), when CUDA is present;
- ours, torch on CPU tensors;
- ours, CPU path (`instances.segment_instances`: numpy, cc3d, scipy);
- baseline: `scipy.ndimage.distance_transform_edt` of the core (foreground minus boundary) →
  `skimage.feature.peak_local_max` (min distance `--peak-distance` voxels, per core component) →
  `skimage.segmentation.watershed(−D, markers, mask=foreground)`.
Reported: Mvox/s (volume voxels / seconds), object counts, whether our paths agree voxel for voxel, and
each segmentation against the truth and against ours: adjusted Rand index over the voxels that either
labels, mean best IoU of the reference objects, and the share of reference objects matched at IoU ≥ 0.5.
JSON goes to `OUT.json`, a Markdown table to `OUT.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from scipy import ndimage as ndi

from bench.record import record_stem
from cellseg.data.targets import touching
from cellseg.postprocess.gpu import segment_instances_torch, to_numpy_ids
from cellseg.postprocess.instances import segment_instances
from cellseg.postprocess.params import InstanceParams

OBJECTS_AT_512 = 3000
NEIGHBOUR_FRACTION = 0.7  # share of objects placed against an earlier one (touching clusters)
BLUR_VOX = 1.0  # Gaussian sigma turning masks into probabilities
NOISE = 0.05  # amplitude of the uniform noise added before blurring


def make_volume(size: int, radius: tuple[float, float], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(truth ids uint32, probability float32, boundary probability float32), all `size`³."""
    rng = np.random.default_rng(seed)
    num = max(2, round(OBJECTS_AT_512 * (size / 512) ** 3))
    best = np.full((size,) * 3, np.inf, dtype=np.float32)  # scaled squared distance to the owning centre
    ids = np.zeros((size,) * 3, dtype=np.uint32)
    centres: list[np.ndarray] = []
    radii: list[np.ndarray] = []
    for k in range(1, num + 1):
        r = rng.uniform(*radius) * rng.uniform(0.75, 1.25, size=3)
        if centres and rng.random() < NEIGHBOUR_FRACTION:
            j = int(rng.integers(len(centres)))
            direction = rng.normal(size=3)
            direction /= np.linalg.norm(direction)
            c = centres[j] + direction * (radii[j].mean() + r.mean()) * 0.85  # overlapping a little: touching
        else:
            c = rng.uniform(0, size, size=3)
        c = np.clip(c, r, size - 1 - r)
        lo = np.maximum(np.floor(c - r).astype(int), 0)
        hi = np.minimum(np.ceil(c + r).astype(int) + 1, size)
        grids = np.ogrid[lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]]
        q = sum(((g - ci) / ri) ** 2 for g, ci, ri in zip(grids, c, r, strict=True)).astype(np.float32)
        box = tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))
        win = (q <= 1) & (q < best[box])
        best[box][win] = q[win]
        ids[box][win] = k
        centres.append(c)
        radii.append(r)
    ids = _renumber(ids)
    noise = rng.uniform(-NOISE, NOISE, size=ids.shape).astype(np.float32)
    prob = np.clip(ndi.gaussian_filter((ids > 0).astype(np.float32) + noise, BLUR_VOX), 0, 1).astype(np.float32)
    edge = ndi.binary_dilation(touching(ids), iterations=1)
    boundary = np.clip(ndi.gaussian_filter(edge.astype(np.float32) + noise, BLUR_VOX) * 2, 0, 1).astype(np.float32)
    return ids, prob, boundary


def _renumber(ids: np.ndarray) -> np.ndarray:
    present = np.unique(ids)
    lut = np.zeros(int(present.max()) + 1, dtype=np.uint32)
    lut[present] = np.arange(present.size, dtype=np.uint32)
    return lut[ids]


def baseline(prob: np.ndarray, boundary: np.ndarray, *, voxel_size_nm: tuple[float, ...], threshold: float,
             peak_distance: int) -> np.ndarray:
    """Distance transform → peak_local_max → watershed (scipy / scikit-image, single-threaded)."""
    from skimage.feature import peak_local_max
    from skimage.segmentation import watershed

    fg = prob > threshold
    core = fg & ~(boundary > threshold)
    dist = ndi.distance_transform_edt(core, sampling=voxel_size_nm)
    core_labels, _ = ndi.label(core, structure=np.ones((3, 3, 3), dtype=bool))
    peaks = peak_local_max(dist, min_distance=peak_distance, labels=core_labels, exclude_border=False)
    markers = np.zeros(prob.shape, dtype=np.int32)
    markers[tuple(peaks.T)] = np.arange(1, len(peaks) + 1, dtype=np.int32)
    return watershed(-dist, markers, mask=fg).astype(np.uint32)


def compare(reference: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """ARI over voxels labelled by either; mean best IoU of the reference objects; share with IoU ≥ 0.5."""
    where = (reference > 0) | (labels > 0)
    r, p = reference[where].astype(np.int64), labels[where].astype(np.int64)
    pairs, n_ij = np.unique(r * (int(p.max()) + 1) + p, return_counts=True)
    ri, pj = pairs // (int(p.max()) + 1), pairs % (int(p.max()) + 1)
    a = np.bincount(r)
    b = np.bincount(p)

    def comb2(x: np.ndarray) -> float:
        x = x.astype(np.float64)
        return float(np.sum(x * (x - 1) / 2))

    n = float(r.size)
    index, sum_a, sum_b = comb2(n_ij), comb2(a), comb2(b)
    expected = sum_a * sum_b / (n * (n - 1) / 2)
    ari = (index - expected) / (0.5 * (sum_a + sum_b) - expected)
    fg = (ri > 0) & (pj > 0)
    iou = n_ij[fg] / (a[ri[fg]] + b[pj[fg]] - n_ij[fg])
    best = np.zeros(a.size)
    np.maximum.at(best, ri[fg], iou)
    objects = np.flatnonzero(a[1:]) + 1
    return {"ari": float(ari), "mean_best_iou": float(best[objects].mean()),
            "matched_at_0.5": float((best[objects] >= 0.5).mean())}


def timed(fn: Callable[[], object], repeat: int, sync: Callable[[], None]) -> tuple[object, float]:
    """(result, best wall time of `repeat` runs after one warm-up)."""
    result = fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return result, min(times)


def run(args: argparse.Namespace) -> dict:
    vs = (args.voxel_nm,) * 3
    t0 = time.perf_counter()
    truth, prob, boundary = make_volume(args.size, tuple(args.radius), args.seed)
    print(f"volume {args.size}³: {int(truth.max())} objects, {(truth > 0).mean():.1%} foreground "
          f"({time.perf_counter() - t0:.1f} s to build)", flush=True)
    params = InstanceParams(threshold=0.5, boundary_threshold=0.5, seed_distance_nm=args.seed_distance_vox * vs[0],
                            min_size_nm3=args.min_size_vox * float(np.prod(vs)))
    voxels = prob.size
    rows: dict[str, dict] = {}
    outputs: dict[str, np.ndarray] = {}

    def record(name: str, labels: np.ndarray, seconds: float, extra: dict | None = None) -> None:
        outputs[name] = labels
        rows[name] = {"seconds": seconds, "mvox_per_s": voxels / seconds / 1e6, "objects": int(labels.max()),
                      "vs_truth": compare(truth, labels), **(extra or {})}
        print(f"{name:>14}: {seconds:8.3f} s  {voxels / seconds / 1e6:9.1f} Mvox/s  {int(labels.max())} objects",
              flush=True)

    if torch.cuda.is_available() and not args.no_cuda:
        dev = torch.device("cuda")
        p_gpu, b_gpu = torch.from_numpy(prob).to(dev), torch.from_numpy(boundary).to(dev)
        ids, sec = timed(lambda: segment_instances_torch(p_gpu, b_gpu, voxel_size_nm=vs, params=params, device=dev),
                         args.repeat, torch.cuda.synchronize)
        _, h2d = timed(lambda: (torch.from_numpy(prob).to(dev), torch.from_numpy(boundary).to(dev)), args.repeat,
                       torch.cuda.synchronize)
        _, d2h = timed(lambda: to_numpy_ids(ids), args.repeat, torch.cuda.synchronize)
        record("ours (CUDA)", to_numpy_ids(ids), sec, {"host_to_device_s": h2d, "device_to_host_s": d2h,
                                                        "device": torch.cuda.get_device_name()})
        del p_gpu, b_gpu, ids
    torch.set_num_threads(args.threads)
    if not args.no_torch_cpu:
        ids, sec = timed(lambda: segment_instances_torch(prob, boundary, voxel_size_nm=vs, params=params, device="cpu"),
                         args.repeat, lambda: None)
        record("ours (torch, CPU)", to_numpy_ids(ids), sec)
    ids, sec = timed(lambda: segment_instances(prob, boundary, voxel_size_nm=vs, params=params), args.repeat,
                     lambda: None)
    record("ours (CPU)", ids, sec)
    ids, sec = timed(lambda: baseline(prob, boundary, voxel_size_nm=vs, threshold=0.5,
                                      peak_distance=args.peak_distance), max(1, args.repeat - 1), lambda: None)
    record("baseline", ids, sec)
    ours = outputs["ours (CPU)"]
    agreement = {name: int(np.count_nonzero(out != ours)) for name, out in outputs.items() if name.startswith("ours")}
    rows["baseline"]["vs_ours"] = compare(ours, outputs["baseline"])
    speedup = {name: rows["baseline"]["seconds"] / rows[name]["seconds"] for name in rows if name != "baseline"}
    return {"size": args.size, "voxel_size_nm": vs, "objects_truth": int(truth.max()),
            "foreground_fraction": float((truth > 0).mean()), "params": params.__dict__,
            "peak_distance_vox": args.peak_distance, "threads": args.threads, "cpu_cores": os.cpu_count(), "machine": platform.node(),
            "cpu": platform.processor() or platform.machine(), "torch": torch.__version__, "rows": rows,
            "voxels_differing_from_ours_cpu": agreement, "speedup_vs_baseline": speedup}


def markdown(r: dict) -> str:
    """The results as a Markdown table."""
    lines = [f"### Instance post-processing, {r['size']}³ voxels, {r['objects_truth']} objects "
             f"({r['foreground_fraction']:.0%} foreground); {r['cpu_cores']} CPU cores, torch CPU threads: "
             f"{r['threads']}",
             "",
             "| pipeline | s | Mvox/s | × baseline | objects | ARI vs truth | mean best IoU | matched ≥ 0.5 | "
             "voxels ≠ ours (CPU) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, row in r["rows"].items():
        t = row["vs_truth"]
        speed = r["speedup_vs_baseline"].get(name, 1.0)
        differ = r["voxels_differing_from_ours_cpu"].get(name, "—")
        lines.append(f"| {name} | {row['seconds']:.3f} | {row['mvox_per_s']:.1f} | {speed:.1f} | {row['objects']} | "
                     f"{t['ari']:.4f} | {t['mean_best_iou']:.4f} | {t['matched_at_0.5']:.3f} | {differ} |")
    vs = r["rows"]["baseline"]["vs_ours"]
    lines += ["", f"Baseline against ours: ARI {vs['ari']:.4f}, mean best IoU of our objects {vs['mean_best_iou']:.4f}, "
              f"{vs['matched_at_0.5']:.1%} of ours matched at IoU ≥ 0.5."]
    if "ours (CUDA)" in r["rows"]:
        row = r["rows"]["ours (CUDA)"]
        lines.append(f"CUDA ({row['device']}) transfers, not in the time above: host→device "
                     f"{row['host_to_device_s']:.3f} s, device→host {row['device_to_host_s']:.3f} s.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=512, help="volume edge in voxels (default 512)")
    parser.add_argument("--voxel-nm", type=float, default=8.0, help="isotropic voxel size in nm (default 8)")
    parser.add_argument("--radius", type=float, nargs=2, default=(6.0, 14.0), metavar=("MIN", "MAX"),
                        help="object radii in voxels (default 6 14)")
    parser.add_argument("--seed-distance-vox", type=float, default=2.0,
                        help="our seed distance, in voxels (default 2)")
    parser.add_argument("--min-size-vox", type=int, default=27, help="our minimum object size in voxels (default 27)")
    parser.add_argument("--peak-distance", type=int, default=5, help="baseline peak_local_max min_distance (voxels)")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per pipeline (best is kept)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-cuda", action="store_true", help="skip the CUDA path even when present")
    parser.add_argument("--no-torch-cpu", action="store_true", help="skip the torch path on CPU tensors (slow)")
    parser.add_argument("--out", help="writes OUT.json and OUT.md (default: bench/results/postprocess_<hardware>)")
    args = parser.parse_args(argv)
    results = run(args)
    out = Path(args.out) if args.out else record_stem("postprocess")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
