"""Why annotation-grid decoding can lose 2026 instance score: objects that fall apart into pieces.

    python -m bench.studies.native_grids.fragments --out OUT/native_fragments_cpu   # ~1 minute, one CPU core
    python -m bench.studies.native_grids.fragments --size 32 --seeds 0 --noise 0.1 --out /tmp/f  # the test's

The 2026 evaluator relabels a prediction by 26-connected components of equal ids (`cellseg.eval.relabel`), so
an id whose voxels form two pieces counts as two objects. `decode_on_grid` keeps every id of the source
decoding, but on a finer grid an id's voxels follow the interpolated probability and may come apart. Here, on
crafted crops with known truth and no model: packed spheres (vesicle-like instances, radius 10-28 nm) on a 4 nm
grid, a probability on the 8 nm grid made from their area fraction (Gaussian blur of `BLUR_VOX` source voxels,
additive Gaussian noise of each `--noise` level, clipped to [0, 1]), decoded with default instance parameters
(threshold 0.5, no boundary channel) three ways:

- `model_grid`: decoded on 8 nm, nearest-upsampled to 4 nm (the staircase);
- `annotation_grid_pieces`: refined onto 4 nm without step 5 of `cellseg.postprocess.native` (every piece kept);
- `annotation_grid`: `decode_on_grid` onto 4 nm: every piece of an id smaller than one source voxel (8 target
  voxels) dropped when the id has a larger piece (step 5).

Per crop and way: ids, 26-connected pieces, the pieces that split off (size, truth objects they touch), and the
2026 per-crop instance counts and combined score `sqrt(F1 x normalised Hausdorff)` (`cellseg.eval`).
Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.record import record_stem

EDGE_VOX = 96  # target grid edge (4 nm voxels): 384 nm, room for about 50 spheres
RADIUS_VOX = (2.5, 7.0)  # sphere radii in 4 nm voxels: 10-28 nm, vesicle-like
SPHERE_TRIES = 60  # spheres drawn per crop; those overlapping an earlier one are skipped
BLUR_VOX = 0.7  # sigma of the blur on the 8 nm grid: a model's soft edges
WAYS = ("model_grid", "annotation_grid_pieces", "annotation_grid")


def spheres(edge: int, rng: np.random.Generator) -> np.ndarray:
    """uint32 ids of non-overlapping spheres on an `edge`³ grid."""
    truth = np.zeros((edge,) * 3, np.uint32)
    zz, yy, xx = np.mgrid[:edge, :edge, :edge]
    margin = RADIUS_VOX[0] + 1
    for _ in range(SPHERE_TRIES):
        c = rng.uniform(margin, edge - margin, 3)
        r = rng.uniform(*RADIUS_VOX)
        ball = (zz - c[0]) ** 2 + (yy - c[1]) ** 2 + (xx - c[2]) ** 2 <= r * r
        if not (truth[ball] > 0).any():
            truth[ball] = truth.max() + 1
    return truth


def probability(truth: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """float32 probability on the 2× coarser grid: area fraction, blurred, with additive noise, clipped."""
    from scipy.ndimage import gaussian_filter

    n = truth.shape[0] // 2
    frac = (truth > 0).reshape(n, 2, n, 2, n, 2).mean(axis=(1, 3, 5))
    prob = gaussian_filter(frac, BLUR_VOX) + rng.normal(0.0, noise, frac.shape)
    return np.clip(prob, 0.0, 1.0).astype(np.float32)


def split_pieces(ids: np.ndarray, truth: np.ndarray) -> list[dict[str, Any]]:
    """The ids made of several pieces: piece sizes (voxels) and the truth objects each piece touches."""
    import cc3d

    pieces = cc3d.connected_components(ids, connectivity=26)
    out = []
    for i in np.unique(ids)[1:]:
        parts = np.unique(pieces[ids == i])
        if parts.size > 1:
            out.append({"id": int(i), "sizes": [int((pieces == p).sum()) for p in parts],
                        "truth_objects": [int(np.count_nonzero(np.unique(truth[pieces == p]))) for p in parts]})
    return out


def measure(truth: np.ndarray, prob: np.ndarray) -> dict[str, dict[str, Any]]:
    """The three ways (module docstring) on one crop: counts and 2026 scores."""
    import cc3d

    from cellseg.data.grid import Grid
    from cellseg.eval.crop_score import score_class
    from cellseg.eval.eras import get_era
    from cellseg.postprocess.native import (
        axis_maps,
        decode_coarse,
        decode_on_grid,
        keep_every_object,
        refine,
        segment_class,
    )
    from cellseg.postprocess.params import InstanceParams

    edge = truth.shape[0]
    source = Grid.of(translation_nm=(4, 4, 4), shape_vox=(edge // 2,) * 3, voxel_size_nm=(8, 8, 8))
    target = Grid.of(translation_nm=(2, 2, 2), shape_vox=(edge,) * 3, voxel_size_nm=(4, 4, 4))
    params = InstanceParams(threshold=0.5, use_boundary=False)
    coarse = segment_class("ves", prob, None, voxel_size_nm=source.voxel_size_nm, params=params)
    maps = axis_maps(source, target)
    pieces = refine(keep_every_object(decode_coarse("ves", prob, None, voxel_size_nm=source.voxel_size_nm,
                                                    params=params), maps), maps)
    preds = {"model_grid": coarse.repeat(2, 0).repeat(2, 1).repeat(2, 2), "annotation_grid_pieces": pieces,
             "annotation_grid": decode_on_grid("ves", prob, None, source=source, target=target, params=params)}
    era, out = get_era("2026"), {}
    for way, pred in preds.items():
        s = score_class(pred, truth, label="ves", era=era, voxel_size_nm=target.voxel_size_nm)
        f1 = 2 * s["tp"] / max(2 * s["tp"] + s["fp"] + s["fn"], 1)
        hd = s["hausdorff_norm_sum"] / max(s["n_hausdorff"], 1)
        out[way] = {"ids": int(np.count_nonzero(np.unique(pred))),
                    "pieces": int(cc3d.connected_components(pred, connectivity=26).max()),
                    "tp": int(s["tp"]), "fp": int(s["fp"]), "fn": int(s["fn"]), "f1": round(f1, 6),
                    "normalized_hausdorff": round(hd, 6), "combined": round(math.sqrt(f1 * hd), 6),
                    "split": split_pieces(pred, truth) if way == "annotation_grid_pieces" else None}
    return out


def table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: per crop and way, pieces/ids, TP/FP/FN and the combined score; then the means."""
    lines = ["| seed | noise | truth objects | " + " | ".join(f"{w}: pieces / ids, TP/FP/FN, combined" for w in WAYS)
             + " |", "|---|---|---|" + "---|" * len(WAYS)]
    for r in rows:
        cells = [f"{m['pieces']} / {m['ids']}, {m['tp']}/{m['fp']}/{m['fn']}, {m['combined']:.4f}"
                 for m in (r["ways"][w] for w in WAYS)]
        lines.append(f"| {r['seed']} | {r['noise']:g} | {r['truth_objects']} | " + " | ".join(cells) + " |")
    means = [sum(r["ways"][w]["combined"] for r in rows) / len(rows) for w in WAYS]
    lines.append("| mean | | | " + " | ".join(f"{m:.4f}" for m in means) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (`--help`)."""
    doc = (__doc__ or "").split("\n\n")
    p = argparse.ArgumentParser(prog="python -m bench.studies.native_grids.fragments", description=doc[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="writes OUT.json and OUT.md (default: bench/results/native_fragments_cpu)")
    p.add_argument("--seeds", default="0,1,2,3,4,5", help="comma-separated crop seeds (default 0-5)")
    p.add_argument("--noise", default="0.05,0.15", help="comma-separated noise levels (default 0.05,0.15)")
    p.add_argument("--size", type=int, default=EDGE_VOX, help=f"crop edge in 4 nm voxels, even (default {EDGE_VOX})")
    args = p.parse_args(argv)
    if args.size < 16 or args.size % 2:
        p.error(f"--size {args.size}: an even edge of at least 16 voxels")
    start, rows = time.perf_counter(), []
    for seed in (int(s) for s in args.seeds.split(",")):
        for noise in (float(n) for n in args.noise.split(",")):
            rng = np.random.default_rng(seed)
            truth = spheres(args.size, rng)
            rows.append({"seed": seed, "noise": noise, "truth_objects": int(truth.max()),
                         "ways": measure(truth, probability(truth, noise, rng))})
            print(f"seed {seed} noise {noise:g}: " + ", ".join(
                f"{w} {rows[-1]['ways'][w]['combined']:.4f}" for w in WAYS), flush=True)
    doc_json = {"benchmark": "bench/studies/native_grids/fragments.py", "size_vox": args.size, "voxel_size_nm": [4, 4, 4],
                "source_voxel_size_nm": [8, 8, 8], "rows": rows,
                "seconds": round(time.perf_counter() - start, 1), "date": time.strftime("%Y-%m-%d")}
    args.out = args.out or record_stem("native_fragments", cpu=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(doc_json, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(
        "# Instance pieces on the annotation grid (2026 metric, per crop)\n\n" + table(rows) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
