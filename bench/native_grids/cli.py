"""The command line and the result files (OUT.json, OUT.md) of the native-grids ablation."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ENSEMBLE_CHANGES = {  # name → (from row, to row)
    "decisions": ("today", "native"),
    "decoding": ("today", "today_native_decoding"),
    "decision_grid": ("today_native_decoding", "native"),
    "decoding_defaults": ("uniform_model", "uniform_annotation"),
}
ORACLE_CHANGES = {"decoding": ("model", "annotation")}


def _parser() -> argparse.ArgumentParser:
    import bench.native_grids as package

    parser = argparse.ArgumentParser(description=package.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output path without extension (OUT.json, OUT.md, OUT_work/)")
    parser.add_argument("--seed", type=int, default=23, help="seed of the synthetic data (default 23)")
    parser.add_argument("--data", help="an existing synthetic data root instead of generating one")
    parser.add_argument("--quick", action="store_true", help="tiny preset, two smoke models, 2 steps, no TTA")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parser().parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from bench.native_grids import pipeline as p
    from bench.native_grids.decisions import DECISION_ERA, decision_rows
    from bench.native_grids.tables import pool_section
    from cellseg.classes import tested_classes

    start = time.perf_counter()
    out = Path(args.out)
    work = out.parent / f"{out.name}_work"
    work.mkdir(parents=True, exist_ok=True)
    preset, tta = ("tiny", 1) if args.quick else ("small", 8)
    root = Path(args.data) if args.data else p.make_data(work, preset=preset, seed=args.seed)
    runs = p.train_runs(work, root, quick=args.quick)
    members = p.member_stores(work, runs, tta=tta)
    roles = p.crop_roles(runs, root)
    tuning = [c for c, r in roles.items() if r == "tuning"]
    scored = [c for c, r in roles.items() if r != "tuning"]
    uniform = p.uniform_store(work, members)
    truth = p.truth_store(work / "truth.zarr", scored, uniform.classes, root)
    rows, decided = decision_rows(work, members, root, tuning, truth)
    defaults = p.score(work, uniform, truth, "uniform")
    rows |= {"uniform_model": defaults["model"], "uniform_annotation": defaults["annotation"]}
    model_voxel = uniform.grid(scored[0]).voxel_size_nm
    ensemble = pool_section(rows, roles, model_voxel, ENSEMBLE_CHANGES)
    oracle_truth = p.truth_store(work / "truth_all.zarr", scored, tested_classes(), root)
    oracle_rows = p.score(work, p.oracle_store(work, uniform, oracle_truth), oracle_truth, "oracle")
    oracle = pool_section(oracle_rows, roles, model_voxel, ORACLE_CHANGES)
    import numpy as np
    import torch

    doc: dict[str, Any] = {
        "preset": preset, "seed": args.seed, "data": str(root), "models": [r.name for r in runs], "tta": tta,
        "model_voxel_size_nm": list(model_voxel), "tuning_crops": tuning, "scored_crops": scored,
        "decision_era": DECISION_ERA, "decisions": decided, "ensemble": ensemble, "oracle": oracle,
        "command": "python -m bench.native_grids " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{platform.node()} ({os.cpu_count()} cores)", "python": platform.python_version(),
        "load_average": os.getloadavg(), "numpy": np.__version__, "torch": torch.__version__,
        "seconds": round(time.perf_counter() - start, 1), "date": datetime.date.today().isoformat()}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))
    return doc


def markdown(doc: dict[str, Any]) -> str:
    """OUT.md: the decisions table, the decoding tables, per-class scores."""
    from bench.native_grids.tables import change_table, class_table, crops_line

    ens, oracle = doc["ensemble"], doc["oracle"]
    lines = [f"Decisions and decoding on the model's grid vs on the annotation grids: {doc['preset']} preset, seed "
             f"{doc['seed']}, models {', '.join(doc['models'])}, TTA {doc['tta']}. Decisions (ensemble weights "
             f"and post-processing parameters) on the tuning crops {', '.join(doc['tuning_crops'])}, in decision "
             f"mode, {doc['decision_era']} metric. {crops_line(ens)} Intervals: 95 % crop bootstrap "
             f"({ens['bootstrap']['draws']} draws), changes paired; (noise): the change's interval holds 0, **: it "
             "does not; a band of one crop has no noise estimate.", "",
             "Decisions: today (weights and parameters scored on the model grid, decoded on the model grid) → "
             "native (scored on the annotation grids, decoded there):", ""]
    lines += change_table(ens, "decisions", "today", "native")
    lines += ["", "Decoding alone, today's decisions (model grid → annotation grid):", ""]
    lines += change_table(ens, "decoding", "today", "today, decoded natively")
    lines += ["", "Decision grid alone, both decoded on the annotation grid (model-grid decisions → annotation-grid "
              "decisions):", ""]
    lines += change_table(ens, "decision_grid", "today, decoded natively", "native")
    lines += ["", "Decoding alone, uniform ensemble with default parameters (model grid → annotation grid):", ""]
    lines += change_table(ens, "decoding_defaults", "model grid", "annotation grid")
    lines += ["", "Per class (2026, all scored crops; IoU for semantic classes, combined score for instance classes):",
              ""]
    lines += class_table(ens, ["today", "today_native_decoding", "native", "uniform_model", "uniform_annotation"])
    lines += ["", "Ideal probabilities (each truth label's area fraction on the model's grid, default parameters; "
              "model grid → annotation grid):", ""]
    lines += change_table(oracle, "decoding", "model grid", "annotation grid")
    lines += ["", "Per class, ideal probabilities (2026, all scored crops):", ""]
    lines += class_table(oracle, ["model", "annotation"])
    return "\n".join(lines) + "\n"
