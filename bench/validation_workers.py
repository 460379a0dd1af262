"""One validation of a run, decoded and scored in the training process (`val.workers: 0`) or in a pool of worker
processes (`cellseg.train.valpool`), alternating on warm pools; the scores must be identical.

    python -m bench.validation_workers --root SMALL --out OUT/validation_workers_cpu --workers 2
    python -m bench.validation_workers --root TINY --out /tmp/vw --rounds 1   # the test's run

SMALL: a `cellseg synth --preset small` root. The model is `configs/smoke/unet_3d.yaml`, untrained (seeded), on
the CPU, predicting every validation crop of the root (tuning and report crops) with the 48 scored classes: the
prediction is cheap and the decoding and scoring, the part the pool spreads, is what is timed. Per setting: the
first validation (which starts the workers) and the median of `--rounds` more; the load average beside each, since
other work on the machine takes the cores the workers need. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from bench.record import record_stem

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "smoke" / "unet_3d.yaml"
SCORED = REPO / "configs" / "experiments" / "unet_3d.yaml"  # its classes: the 48 scored ones


def measure(root: Path, workers: Sequence[int], rounds: int) -> dict[str, dict]:
    """Seconds of each setting's validations (module docstring), and whether every setting scored alike."""
    import torch

    from cellseg.config import load_run_config
    from cellseg.data.loader import make_split, open_crops
    from cellseg.models.registry import build_model
    from cellseg.train.validate import run_validation, validation_workers
    from cellseg.train.valpool import ValidationPool

    torch.set_num_threads(1)  # the training process's own share; the workers are the variable
    classes = ",".join(load_run_config(SCORED).data.classes)
    setups, rows = {}, {}
    for n in workers:
        cfg = load_run_config(CONFIG, [f"data.root={root}", f"run_dir={root}/../validation_workers_run",
                                       "val.max_crops=null", "val.report_crops=true", f"data.classes=[{classes}]",
                                       f"val.workers={n}"])
        crops = open_crops([e for e in make_split(cfg.data) if e.split == "validate"], cfg.data)
        torch.manual_seed(0)
        model = build_model(cfg.model.name, 1, cfg.data.num_target_channels, preset=cfg.model.preset)
        setups[n] = (cfg, crops, model, ValidationPool(validation_workers(cfg, crops)))
        rows[n] = {"workers": n, "seconds": [], "load_average": [], "crops": [c.name for c in crops]}
    scores = {}
    try:
        for _ in range(rounds + 1):
            for n, (cfg, crops, model, pool) in setups.items():
                start = time.perf_counter()
                result = run_validation(model, crops, cfg, device=torch.device("cpu"), precision="fp32", pool=pool)
                rows[n]["seconds"].append(round(time.perf_counter() - start, 3))
                rows[n]["load_average"].append(round(os.getloadavg()[0], 2))
                result.pop("seconds")
                scores[n] = json.dumps(result, sort_keys=True)
                print(f"val.workers={n}: {rows[n]['seconds'][-1]:.2f} s", flush=True)
    finally:
        for *_, pool in setups.values():
            pool.close()
    for row in rows.values():
        row["first_s"], row["median_s"] = row["seconds"][0], statistics.median(row["seconds"][1:])
        row["tasks"] = sum(len(s) for s in json.loads(scores[row["workers"]])["crop_scores"].values())
    rows["identical_scores"] = len(set(scores.values())) == 1
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (`--help`)."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, required=True, help="a synthetic (or real) data root with validation crops")
    p.add_argument("--out", type=Path, help="writes OUT.json and OUT.md (default: bench/results/validation_workers_<hardware>)")
    p.add_argument("--workers", type=int, default=2, help="the pool's processes, compared with 0 (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="validations per setting after the first (default 3)")
    args = p.parse_args(argv)
    if args.workers < 1 or args.rounds < 1:
        p.error("--workers and --rounds: at least 1")
    rows = measure(args.root, (0, args.workers), args.rounds)
    base, pooled = rows[0], rows[args.workers]
    doc = {"benchmark": "bench/validation_workers.py", "root": str(args.root), "rows": [base, pooled],
           "identical_scores": rows["identical_scores"], "speedup": round(base["median_s"] / pooled["median_s"], 2),
           "cpu_cores": len(os.sched_getaffinity(0)), "machine": platform.node(),
           "date": datetime.date.today().isoformat()}
    args.out = args.out or record_stem("validation_workers")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"# One validation, in the training process vs {args.workers} workers ({doc['date']}, "
             f"{doc['cpu_cores']} CPU cores)", "",
             f"Root `{args.root}`; crops {', '.join(base['crops'])}; {base['tasks']} (crop, class) tasks; scores "
             f"identical: {'yes' if doc['identical_scores'] else 'NO'}.", "",
             "| val.workers | first validation (s) | median of the next (s) | load average (1 min) |", "|---|---|---|---|"]
    for row in (base, pooled):
        lines.append(f"| {row['workers']} | {row['first_s']:.2f} | {row['median_s']:.2f} | "
                     f"{min(row['load_average']):.2f}–{max(row['load_average']):.2f} |")
    lines += ["", f"Speed-up of the median: {doc['speedup']:.2f}×."]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if doc["identical_scores"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
