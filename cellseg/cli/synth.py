"""`cellseg synth`: generate a synthetic dataset in the exact CellMap challenge layout."""

from __future__ import annotations

import argparse

from cellseg.pool import usable_cores

ORDER = 20


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `synth` sub-command."""
    parser = subparsers.add_parser(
        "synth",
        help="generate a synthetic FIB-SEM dataset in the CellMap challenge layout",
        description="Render synthetic cells (membranes, nuclei with envelope and pores, mitochondria, ER, Golgi, "
                    "vesicles, microtubules, ...) into several OME-NGFF datasets with training crops, "
                    "manifests, a datasplit.csv and held-out test crops (ground_truth.zarr). "
                    "Deterministic for a seed. Presets: tiny (tests, seconds), small (CPU demo, ~1 min), "
                    "medium (>= 1 Gvoxel, for GPU benchmarks; use --workers), quality (medium's EM with crops for "
                    "an 8 nm ensemble and 8 test crops: the quality benchmark, bench/studies/quality).",
    )
    parser.add_argument("--out", required=True, help="output data root (must be empty or absent)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--preset", default="small", choices=("tiny", "small", "medium", "quality"),
                        help="size of the dataset (default small)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a non-empty --out: only a root made by `cellseg synth` and holding nothing else "
                             "(never a run directory, a data root or other files)")
    parser.add_argument("--workers", type=int, default=min(8, usable_cores()),
                        help="worker processes (default: CPU cores, at most 8)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Generate the dataset and print a summary."""
    from cellseg.synth import generate

    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    summary = generate(args.out, preset=args.preset, seed=args.seed, workers=args.workers,
                       overwrite=args.overwrite)
    print(summary.format())
    return 0
