"""Benchmark: what decoding on the annotation grid costs (`cellseg.postprocess.native`), and its projection to
the real test set.

    python -m bench.decode_cost --out OUT/decode_cost_cpu          # ~2 minutes on 2 cores
    python -m bench.decode_cost --size 32 --repeat 1 --out /tmp/dc  # smoke run, seconds

Measured, on one `--size`³ crop at 8 nm refined onto a `--factor`× finer grid (2 nm from 8 nm by default,
offset by half a fine voxel as real crops are):
1. **The decoder alone**, one thread: `decode_coarse` (the model-grid decoding plus the one-voxel growth) and
   `iter_decode` (the refinement, slab by slab) of a semantic class (default parameters) and an instance class
   (default parameters, touching ellipsoids of `bench/postprocess.py`); seconds per G target voxels of the
   first run (its slabs map fresh memory, as a real crop's do: the number the projection uses) and the best of
   the `--repeat` - 1 others.
2. **The whole path**, with `--workers` threads: a probability store of that crop with `--classes` classes
   (half semantic, half instance) → `postprocess_store` on the model grid then `write_submission` (today's
   path: nearest upsampling at submission) vs `postprocess_store` on the annotation grid then
   `write_submission` (a copy). The difference is the extra cost per G target voxel-class.
3. **Projection** to the real test set (`Catalog.official().test()`, both manifests' labels, as `cellseg
   predict --channels scored` writes them): every (crop, label) whose annotation grid is finer than the model's
   (max(8 nm, the crop's voxel size) per axis) pays the extra; on the GPU host it is priced as a multiple of the
   measured submit cost (ratio of 2. on this machine × `--submit-rate`, the H200 host's seconds per submitted
   voxel in `bench/results/ensemble_steady_h200.json`), and the decoder's own CPU seconds from 1. over
   `--host-threads` threads.
JSON goes to `OUT.json`, a Markdown table to `OUT.md`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.record import record_stem

REPO = Path(__file__).resolve().parents[1]


MODEL_NM = 8.0
H200_SUBMIT_SECONDS_PER_VOXEL = 1.3567877449095238e-09  # ensemble_steady_h200.json
CURRENT_PROJECTION_MINUTES = 55.2  # docs/benchmarks.md, test_set_h200.md
GOAL_MINUTES = 60.0


def _times(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """(first run, best of the others): the first one also maps fresh memory, as each slab of a real crop does."""
    times = []
    for _ in range(max(2, repeat)):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times[0], min(times[1:])


def grids(size: int, factor: int) -> tuple[Any, Any]:
    """(model grid, target grid): `size`³ at 8 nm, and the same box `factor`× finer."""
    from cellseg.data.grid import Grid

    fine = MODEL_NM / factor
    model = Grid.of(translation_nm=(MODEL_NM / 2,) * 3, shape_vox=(size,) * 3, voxel_size_nm=(MODEL_NM,) * 3)
    target = Grid.of(translation_nm=(fine / 2,) * 3, shape_vox=(size * factor,) * 3, voxel_size_nm=(fine,) * 3)
    return model, target


def volumes(size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(semantic probability, instance probability), float32 `size`³, like model output."""
    from scipy import ndimage as ndi

    from bench.postprocess import make_volume

    rng = np.random.default_rng(seed)
    smooth = ndi.gaussian_filter(rng.random((size,) * 3).astype(np.float32), 3)
    semantic = ((smooth - smooth.min()) / (smooth.max() - smooth.min())).astype(np.float32)
    return semantic, make_volume(size, (4.0, 8.0), seed)[1]


def decoder_rates(size: int, factor: int, repeat: int, seed: int) -> dict[str, Any]:
    """Step 1 of the module docstring."""
    from cellseg.postprocess.native import decode_coarse, iter_decode
    from cellseg.postprocess.params import InstanceParams, SemanticParams

    model, target = grids(size, factor)
    semantic, instance = volumes(size, seed)
    gvox = float(np.prod(target.shape_vox)) / 1e9
    out = {}
    for kind, name, prob, params in (("semantic", "er", semantic, SemanticParams()),
                                     ("instance", "mito", instance, InstanceParams())):
        coarse = decode_coarse(name, prob, voxel_size_nm=model.voxel_size_nm, params=params)
        source_s = _times(lambda name=name, prob=prob, params=params: decode_coarse(
            name, prob, voxel_size_nm=model.voxel_size_nm, params=params), repeat)[1]
        cold, warm = _times(lambda c=coarse: [s for _, s in iter_decode(c, model, target)], repeat)
        out[kind] = {"source_seconds": source_s, "refine_seconds": cold, "refine_seconds_warm": warm,
                     "target_gvox": gvox, "refine_seconds_per_gvox": cold / gvox,
                     "refine_seconds_per_gvox_warm": warm / gvox, "objects": coarse.num_objects}
        print(f"{kind:>9}: model-grid decoding {source_s:.2f} s, refinement {cold:.2f} s first, {warm:.2f} s "
              f"warm = {cold / gvox:.1f} / {warm / gvox:.1f} s per G target voxels", flush=True)
    return out


def _crop(target: Any, classes: list[str]) -> Any:
    from cellseg.data.crops import Crop, Geometry

    geometry = Geometry(voxel_size_nm=target.voxel_size_nm, translation_nm=target.translation_nm,
                        shape_vox=target.shape_vox)
    return Crop(id=1, dataset="bench", labels=dict.fromkeys(classes, geometry))


def path_costs(size: int, factor: int, num_classes: int, workers: int, seed: int, work: Path) -> dict[str, Any]:
    """Step 2 of the module docstring."""
    from cellseg.data.prediction_store import PredictionStore
    from cellseg.eval.submit import write_submission
    from cellseg.postprocess.apply import postprocess_store
    from cellseg.postprocess.params import ParamSet

    model, target = grids(size, factor)
    semantic, instance = volumes(size, seed)
    classes = [c for pair in zip(["er", "ecs", "pm", "cyto"], ["mito", "nuc", "ld", "ves"], strict=True)
               for c in pair][:num_classes]
    store = PredictionStore.create(work / "prob.zarr", kind="probabilities", channels=classes,
                                   instance_channels=classes[1::2])
    store.write_crop("crop1", model, {c: instance if i % 2 else semantic for i, c in enumerate(classes)})
    crops = {1: _crop(target, classes)}
    out: dict[str, Any] = {"classes": classes, "workers": workers}
    for mode in ("model", "annotation"):
        start = time.perf_counter()
        seg = postprocess_store(store, work / f"seg_{mode}.zarr", params=ParamSet(), device="cpu", progress=False,
                                workers=workers, grid=mode, crops=crops)  # type: ignore[arg-type]
        middle = time.perf_counter()
        write_submission(seg.path, crops, work / f"sub_{mode}.zip", workers=workers)
        end = time.perf_counter()
        out[mode] = {"postprocess_seconds": middle - start, "submit_seconds": end - middle,
                     "total_seconds": end - start}
        print(f"{mode:>10} grid: postprocess {middle - start:.2f} s, submit {end - middle:.2f} s", flush=True)
    voxel_classes = float(np.prod(target.shape_vox)) * len(classes)
    extra = out["annotation"]["total_seconds"] - out["model"]["total_seconds"]
    out.update(target_voxel_classes=voxel_classes, extra_seconds=extra,
               extra_seconds_per_gvox=extra / voxel_classes * 1e9,
               extra_over_submit=extra / out["model"]["submit_seconds"])
    return out


def real_fine_voxels() -> dict[str, Any]:
    """Target voxels of the real test crops' (crop, label) arrays finer than the model grid, semantic/instance."""
    from cellseg.classes import is_instance
    from cellseg.data.crops import Catalog

    official = Catalog.official()
    crops: dict[int, dict[str, Any]] = {}
    for version in ("2026", "2025"):
        for cid, crop in official.test(version).items():  # type: ignore[arg-type]
            crops.setdefault(cid, {}).update(crop.labels)
    fine = {"semantic": 0, "instance": 0}
    per_crop = {}
    for cid, labels in sorted(crops.items()):
        voxels = {"semantic": 0, "instance": 0}
        for label, g in labels.items():
            if any(v < MODEL_NM * 0.99 for v in g.voxel_size_nm):  # model grid max(8 nm, crop voxel size)
                voxels["instance" if is_instance(label) else "semantic"] += g.num_voxels
        per_crop[str(cid)] = voxels
        for k in fine:
            fine[k] += voxels[k]
    return {"fine_voxel_classes": fine, "per_crop": per_crop}


def project(rates: dict[str, Any], path: dict[str, Any], real: dict[str, Any], *, host_threads: int,
            submit_rate: float) -> dict[str, Any]:
    """Step 3 of the module docstring: minutes added on the GPU host."""
    fine = real["fine_voxel_classes"]
    total = fine["semantic"] + fine["instance"]
    decoder_cpu_s = sum(fine[k] / 1e9 * rates[k]["refine_seconds_per_gvox"] for k in fine)
    # The whole path's extra (decoding, writing and reading the finer store) as a multiple of this machine's
    # submit cost per voxel, priced at the host's submit cost per voxel.
    submit_here_per_voxel = path["model"]["submit_seconds"] / path["target_voxel_classes"]
    minutes = path["extra_seconds_per_gvox"] / 1e9 / submit_here_per_voxel * submit_rate * total / 60
    return {"fine_voxel_classes": total, "decoder_cpu_seconds": decoder_cpu_s,
            "decoder_minutes_on_host": decoder_cpu_s / host_threads / 60, "extra_minutes": minutes,
            "host_threads": host_threads, "submit_seconds_per_voxel_host": submit_rate,
            "current_minutes": CURRENT_PROJECTION_MINUTES, "projected_minutes": CURRENT_PROJECTION_MINUTES + minutes,
            "meets_goal": CURRENT_PROJECTION_MINUTES + minutes <= GOAL_MINUTES}


def markdown(doc: dict[str, Any]) -> str:
    r, p, j = doc["decoder"], doc["path"], doc["projection"]
    lines = [f"# Decoding on the annotation grid ({doc['machine']}, load average "
             f"{doc['load_average'][0]:.1f}, {doc['date']})", "",
             f"{doc['size']}³ at 8 nm → {doc['size'] * doc['factor']}³ at {8 / doc['factor']:g} nm.", "",
             "| class | model-grid decoding s | refinement s (first / warm) | s per G target voxels (first / warm) |",
             "|---|---|---|---|"]
    lines += [f"| {k} | {v['source_seconds']:.2f} | {v['refine_seconds']:.2f} / {v['refine_seconds_warm']:.2f} | "
              f"{v['refine_seconds_per_gvox']:.1f} / {v['refine_seconds_per_gvox_warm']:.1f} |" for k, v in r.items()]
    lines += ["", f"Whole path, {len(p['classes'])} classes, {p['workers']} threads:", "",
              "| path | postprocess s | submit s | total s |", "|---|---|---|---|"]
    lines += [f"| {m} grid | {p[m]['postprocess_seconds']:.2f} | {p[m]['submit_seconds']:.2f} | "
              f"{p[m]['total_seconds']:.2f} |" for m in ("model", "annotation")]
    lines += ["", f"Extra: {p['extra_seconds_per_gvox']:.1f} s per G target voxel-classes "
                  f"({p['extra_over_submit']:.2f}× the model path's submit).", "",
              f"Real test set: {j['fine_voxel_classes'] / 1e9:.1f} G voxel-classes finer than the model grid; "
              f"decoder {j['decoder_cpu_seconds']:.0f} CPU-s ({j['decoder_minutes_on_host']:.2f} min on "
              f"{j['host_threads']} threads); whole path +{j['extra_minutes']:.2f} min on the H200 host → "
              f"{j['projected_minutes']:.1f} min (goal {GOAL_MINUTES:g}: {'met' if j['meets_goal'] else 'missed'})."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="output path without extension (OUT.json, OUT.md; default: bench/results/decode_cost_cpu)")
    parser.add_argument("--size", type=int, default=128, help="model-grid voxels per axis (default 128)")
    parser.add_argument("--factor", type=int, default=4, help="target voxels per model voxel and axis (default 4)")
    parser.add_argument("--classes", type=int, default=4, help="classes of the whole-path store, ≤ 8 (default 4)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--host-threads", type=int, default=8,
                        help="threads decoding on the GPU host (postprocess's classes in flight; default 8)")
    parser.add_argument("--submit-rate", type=float, default=H200_SUBMIT_SECONDS_PER_VOXEL)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rates = decoder_rates(args.size, args.factor, args.repeat, args.seed)
    work = Path(tempfile.mkdtemp(prefix="decode_cost_"))
    try:
        path = path_costs(args.size, args.factor, args.classes, args.workers, args.seed, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    real = real_fine_voxels()
    doc = {"size": args.size, "factor": args.factor, "decoder": rates, "path": path, "real_test_set": real,
           "projection": project(rates, path, real, host_threads=args.host_threads, submit_rate=args.submit_rate),
           "machine": f"{platform.node()} ({os.cpu_count()} cores, {platform.processor() or platform.machine()})",
           "python": platform.python_version(), "numpy": np.__version__, "load_average": os.getloadavg(),
           "date": datetime.date.today().isoformat()}
    out = Path(args.out) if args.out else record_stem("decode_cost", cpu=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
