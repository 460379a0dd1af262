"""The peer side of bench/loader.py: cellmap-data 2026.3.20.1935 loading the same synthetic root.

Runs in an interpreter that has cellmap-data (it needs zarr < 3); it does not import cellseg. Same patch
size and voxel size as ours, class-balanced sampling, and comparable spatial augmentation (mirror on all
axes, transpose, rotation about z), with raw scaled to [0, 1]. Prints one JSON line: patches/s.

    python bench/peer_cellmap_data.py --root DATA --shape 3d --workers 8 --seconds 8 --batch 2 --classes a,b
"""

from __future__ import annotations

import argparse
import json
import time

import torch

SHAPES = {"3d": ((128, 128, 128), (8.0, 8.0, 8.0)), "2d": ((1, 256, 256), (8.0, 8.0, 8.0))}


def main() -> None:
    """Time cellmap-data's loader for ~`--seconds` after warm-up."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", required=True)
    parser.add_argument("--shape", choices=list(SHAPES), default="3d")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--classes", required=True)
    args = parser.parse_args()

    from cellmap_data import CellMapDataLoader, CellMapDataSplit

    patch, scale = SHAPES[args.shape]
    classes = args.classes.split(",")
    spatial = {"mirror": {"axes": {"x": 0.5, "y": 0.5, "z": 0.5}}, "transpose": {"axes": ["x", "y"]},
               "rotate": {"axes": {"z": [-15, 15]}}}
    split = CellMapDataSplit(
        input_arrays={"raw": {"shape": patch, "scale": scale}},
        target_arrays={"gt": {"shape": patch, "scale": scale}},
        classes=classes, pad=True, csv_path=f"{args.root}/datasplit.csv", spatial_transforms=spatial,
        # Our loader hands over uint8 and scales on the GPU; give the peer its explicit [0, 1] scaling.
        train_raw_value_transforms=lambda x: torch.nan_to_num(x / 255.0),
    )
    loader = CellMapDataLoader(split.train_datasets_combined, classes=classes, batch_size=args.batch,
                               num_workers=args.workers, weighted_sampler=True, is_train=True,
                               iterations_per_epoch=10**6, pin_memory=True,
                               persistent_workers=args.workers > 0,
                               prefetch_factor=4 if args.workers > 0 else None)
    it = iter(loader)
    for _ in range(2 + args.workers):
        next(it)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        next(it)
        n += 1
    elapsed = time.perf_counter() - start
    print(json.dumps({"shape": args.shape, "workers": args.workers, "batch": args.batch,
                      "patches_per_s": n * args.batch / elapsed, "batches": n, "library": "cellmap-data"}))


if __name__ == "__main__":
    main()
