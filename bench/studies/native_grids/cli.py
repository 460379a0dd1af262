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
    "decisions": ("model_grid", "native"),
    "decoding": ("model_grid", "model_grid_native_decoding"),
    "decision_grid": ("model_grid_native_decoding", "native"),
    "decoding_defaults": ("uniform_model", "uniform_annotation"),
}
ORACLE_CHANGES = {"decoding": ("model", "annotation")}


def _parser() -> argparse.ArgumentParser:
    import bench.studies.native_grids as package

    parser = argparse.ArgumentParser(description=package.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output path without extension (OUT.json, OUT.md, OUT_work/)")
    parser.add_argument("--seed", default="23", help="seed of the synthetic data, or several (23,29,31): one root "
                        "and one set of models each (OUT_work/seed<N>/), their scored crops pooled (default 23)")
    parser.add_argument("--data", help="an existing synthetic data root instead of generating one")
    parser.add_argument("--quick", action="store_true", help="tiny preset, two smoke models, 2 steps, no TTA")
    parser.add_argument("--decide-on", choices=("tuning", "validation"), default="tuning",
                        help="crops the decisions are made on: the runs' tuning crops (default; the report and test "
                             "crops are scored) or every validation crop, tuning and report (the test crops alone "
                             "are scored: more crops to decide on, fewer to score)")
    return parser


def run_seed(work: Path, root: Path | None, *, seed: int, quick: bool, decide_on: str = "tuning") -> dict[str, Any]:
    """Steps 1-8 for one synthetic root: the rows' per-crop scores, the decisions, the crops' roles."""
    from bench.studies.native_grids import pipeline as p
    from bench.studies.native_grids.decisions import decision_rows
    from cellseg.classes import tested_classes

    work.mkdir(parents=True, exist_ok=True)
    preset, tta = ("tiny", 1) if quick else ("small", 8)
    root = root or p.make_data(work, preset=preset, seed=seed)
    runs = p.train_runs(work, root, quick=quick)
    members = p.member_stores(work, runs, tta=tta)
    roles = p.crop_roles(runs, root)
    if decide_on == "validation":  # the report crops join the decisions; the held-out test crops alone are scored
        roles = {c: "tuning" if r == "report" else r for c, r in roles.items()}
    tuning = [c for c, r in roles.items() if r == "tuning"]
    scored = [c for c, r in roles.items() if r != "tuning"]
    uniform = p.uniform_store(work, members)
    truth = p.truth_store(work / "truth.zarr", scored, uniform.classes, root)
    rows, decided = decision_rows(work, members, root, tuning, truth)
    defaults = p.score(work, uniform, truth, "uniform")
    rows |= {"uniform_model": defaults["model"], "uniform_annotation": defaults["annotation"]}
    oracle_truth = p.truth_store(work / "truth_all.zarr", scored, tested_classes(), root)
    oracle = p.score(work, p.oracle_store(work, uniform, oracle_truth), oracle_truth, "oracle")
    return {"seed": seed, "data": str(root), "models": [r.name for r in runs], "tta": tta, "preset": preset,
            "model_voxel_size_nm": list(uniform.grid(scored[0]).voxel_size_nm), "roles": roles,
            "tuning_crops": tuning, "scored_crops": scored, "decisions": decided, "rows": rows,
            "oracle_rows": oracle}


def _prefixed(rows: dict[str, Any], prefix: str) -> dict[str, Any]:
    """row → era → crop → scores, every crop renamed `prefix + crop` (crops of several roots pooled)."""
    return {row: {era: {prefix + c: s for c, s in crops.items()} for era, crops in eras.items()}
            for row, eras in rows.items()}


def _merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for rows in parts:
        for row, eras in rows.items():
            for era, crops in eras.items():
                out.setdefault(row, {}).setdefault(era, {}).update(crops)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parser().parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from bench.studies.native_grids.decisions import DECISION_ERA
    from bench.studies.native_grids.tables import pool_section

    start = time.perf_counter()
    out = Path(args.out)
    work = out.parent / f"{out.name}_work"
    seeds = [int(v) for v in str(args.seed).split(",")]
    several = len(seeds) > 1 and not args.data
    runs = [run_seed(work / f"seed{seed}" if several else work, Path(args.data) if args.data else None,
                     seed=seed, quick=args.quick, decide_on=args.decide_on) for seed in (seeds if several else seeds[:1])]
    prefix = [f"s{r['seed']}:" if several else "" for r in runs]
    roles = {pre + c: role for r, pre in zip(runs, prefix, strict=True) for c, role in r["roles"].items()}
    model_voxel = runs[0]["model_voxel_size_nm"]
    ensemble = pool_section(_merged([_prefixed(r["rows"], pre) for r, pre in zip(runs, prefix, strict=True)]),
                            roles, model_voxel, ENSEMBLE_CHANGES)
    oracle = pool_section(_merged([_prefixed(r["oracle_rows"], pre) for r, pre in zip(runs, prefix, strict=True)]),
                          roles, model_voxel, ORACLE_CHANGES)
    decisions = {"decisions": ENSEMBLE_CHANGES["decisions"]}
    per_seed = {str(r["seed"]): pool_section({k: r["rows"][k] for k in decisions["decisions"]}, r["roles"],
                                             model_voxel, decisions) for r in runs} if several else {}
    import numpy as np
    import torch

    first = runs[0]
    doc: dict[str, Any] = {
        "preset": first["preset"], "seeds": [r["seed"] for r in runs], "data": [r["data"] for r in runs],
        "models": first["models"], "tta": first["tta"], "model_voxel_size_nm": model_voxel,
        "decide_on": args.decide_on,
        "tuning_crops": [pre + c for r, pre in zip(runs, prefix, strict=True) for c in r["tuning_crops"]],
        "scored_crops": [pre + c for r, pre in zip(runs, prefix, strict=True) for c in r["scored_crops"]],
        "decision_era": DECISION_ERA, "decisions": {str(r["seed"]): r["decisions"] for r in runs},
        "ensemble": ensemble, "oracle": oracle, "per_seed": per_seed,
        "command": "python -m bench.studies.native_grids " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{platform.node()} ({os.cpu_count()} cores)", "python": platform.python_version(),
        "load_average": os.getloadavg(), "numpy": np.__version__, "torch": torch.__version__,
        "seconds": round(time.perf_counter() - start, 1), "date": datetime.date.today().isoformat()}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))
    return doc


def markdown(doc: dict[str, Any]) -> str:
    """OUT.md: the decisions table, the decoding tables, per-class scores."""
    from bench.studies.native_grids.tables import change_table, class_table, crops_line, seed_table

    ens, oracle = doc["ensemble"], doc["oracle"]
    lines = [f"# Decisions and decoding on the annotation grid ({doc['machine']}, load average "
             f"{doc['load_average'][0]:.1f}, {doc['date']})", "",
             f"`{doc['command']}`: Python {doc['python']}, numpy {doc['numpy']}, torch {doc['torch']}, "
             f"{doc['seconds']} s after the predictions existed.", "",
             f"Decisions and decoding on the model's grid vs on the annotation grids: {doc['preset']} preset, "
             f"seed{'s' if len(doc['seeds']) > 1 else ''} {', '.join(map(str, doc['seeds']))}, models {', '.join(doc['models'])}, TTA {doc['tta']}. Decisions (ensemble weights "
             f"and post-processing parameters) on the {doc.get('decide_on', 'tuning')} crops {', '.join(doc['tuning_crops'])}, in decision "
             f"mode, {doc['decision_era']} metric. {crops_line(ens)} Intervals: 95 % crop bootstrap "
             f"({ens['bootstrap']['draws']} draws), changes paired; (noise): the change's interval holds 0, **: it "
             "does not; a band of one crop has no noise estimate.", "",
             "Decisions: model grid (weights and parameters scored on the model grid, decoded on the model grid) → "
             "native (scored on the annotation grids, decoded there):", ""]
    lines += change_table(ens, "decisions", "model grid", "native")
    if doc["per_seed"]:
        lines += ["", "The same change per seed (each seed's own crops):", ""]
        lines += seed_table(doc["per_seed"])
    lines += ["", "Decoding alone, model-grid decisions (model grid → annotation grid):", ""]
    lines += change_table(ens, "decoding", "model grid", "decoded natively")
    lines += ["", "Decision grid alone, both decoded on the annotation grid (model-grid decisions → annotation-grid "
              "decisions):", ""]
    lines += change_table(ens, "decision_grid", "model-grid decisions, decoded natively", "native")
    lines += ["", "Decoding alone, uniform ensemble with default parameters (model grid → annotation grid):", ""]
    lines += change_table(ens, "decoding_defaults", "model grid", "annotation grid")
    lines += ["", "Per class (2026, all scored crops; IoU for semantic classes, combined score for instance classes):",
              ""]
    lines += class_table(ens, ["model_grid", "model_grid_native_decoding", "native", "uniform_model", "uniform_annotation"])
    lines += ["", "Ideal probabilities (each truth label's area fraction on the model's grid, default parameters; "
              "model grid → annotation grid):", ""]
    lines += change_table(oracle, "decoding", "model grid", "annotation grid")
    lines += ["", "Per class, ideal probabilities (2026, all scored crops):", ""]
    lines += class_table(oracle, ["model", "annotation"])
    return "\n".join(lines) + "\n"
