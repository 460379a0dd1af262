#!/usr/bin/env python
"""Check that a data root loads in the challenge's own loader, cellmap-data, through its datasplit.csv.

Runs in an environment with cellmap-data (it needs zarr < 3) and does not import cellseg, e.g.:

    python3 -m venv /tmp/cmdvenv
    /tmp/cmdvenv/bin/pip install cellmap-data==2026.3.20.1935 torch==2.14.1 torchvision==0.29.1
    /tmp/cmdvenv/bin/python scripts/check_cellmap_data.py DATA_ROOT

It builds `CellMapDataSplit` from DATA_ROOT/datasplit.csv (input "raw" at the EM voxel size of the first
row unless --scale is given; one target array for the --classes), iterates a training
`CellMapDataLoader` (class-balanced sampler) and the validation tiles for a few batches, and prints
shapes, NaN fractions and value ranges. It exits 1 when cellmap-data skipped a CSV row, a batch has the
wrong shape, raw data is missing, or a target holds values other than 0, 1 and NaN. It also reports
whether cellmap-data wrote into the data root (it caches class counts in `s0/.zattrs` when absent).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sys
from pathlib import Path

DEFAULT_CLASSES = "mito,mito_mem,nuc,er,ves,mt,cell,ecs,np,eres"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="data root with datasplit.csv")
    parser.add_argument("--classes", default=DEFAULT_CLASSES, help=f"comma-separated (default {DEFAULT_CLASSES})")
    parser.add_argument("--shape", type=int, nargs=3, default=(32, 32, 32), metavar=("Z", "Y", "X"),
                        help="patch shape in voxels (default 32 32 32)")
    parser.add_argument("--scale", type=float, nargs=3, metavar=("Z", "Y", "X"),
                        help="voxel size in nm (default: EM s0 of the first datasplit row)")
    parser.add_argument("--batches", type=int, default=4, help="training batches to read (default 4)")
    parser.add_argument("--batch-size", type=int, default=2)
    return parser.parse_args(argv)


def em_voxel_size(raw_group: Path) -> list[float]:
    attrs = json.loads((raw_group / ".zattrs").read_text())
    for transform in attrs["multiscales"][0]["datasets"][0]["coordinateTransformations"]:
        if transform["type"] == "scale":
            return [float(v) for v in transform["scale"]]
    raise ValueError(f"{raw_group}: no scale in its multiscales metadata")


def attrs_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob(".zattrs")):
        digest.update(str(path).encode() + path.read_bytes())
    return digest.hexdigest()


def describe(name: str, batch: dict, classes: list[str], problems: list[str], shape: tuple[int, ...]) -> None:
    import torch

    raw, target = batch["raw"], batch["target"]
    print(f"{name}: raw {tuple(raw.shape)} {raw.dtype} min {float(torch.nan_to_num(raw).min()):.3g} "
          f"max {float(torch.nan_to_num(raw).max()):.3g} nan {float(raw.isnan().float().mean()):.3f}; "
          f"target {tuple(target.shape)}")
    if tuple(raw.shape[2:]) != shape or tuple(target.shape[2:]) != shape or target.shape[1] != len(classes):
        problems.append(f"{name}: unexpected shapes raw {tuple(raw.shape)}, target {tuple(target.shape)}")
    if raw.isnan().all():
        problems.append(f"{name}: raw is all NaN")
    for k, cls in enumerate(classes):
        values = target[:, k]
        finite = values[~values.isnan()]
        uniques = sorted({float(v) for v in finite.unique()})
        print(f"    {cls:<10} nan {float(values.isnan().float().mean()):.3f}  fg {float((finite > 0).float().mean()) if finite.numel() else 0:.3f}  values {uniques}")
        if any(v not in (0.0, 1.0) for v in uniques):
            problems.append(f"{name}: class {cls} has values {uniques}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from cellmap_data import CellMapDataLoader, CellMapDataSplit

    csv_path = args.root / "datasplit.csv"
    rows = list(csv.reader(csv_path.open()))
    classes = args.classes.split(",")
    scale = args.scale or em_voxel_size(Path(rows[0][1]) / rows[0][2])
    shape = tuple(args.shape)
    before = attrs_digest(args.root)
    print(f"datasplit {csv_path}: {len(rows)} rows ({sum(r[0] == 'train' for r in rows)} train); "
          f"patch {shape} at {scale} nm; classes {classes}")
    split = CellMapDataSplit(
        input_arrays={"raw": {"shape": shape, "scale": scale}},
        target_arrays={"target": {"shape": shape, "scale": scale}},
        classes=classes, pad=True, csv_path=str(csv_path),
        spatial_transforms={"mirror": {"axes": {"x": 0.5, "y": 0.5}}, "transpose": True})
    problems: list[str] = []
    built = len(split.train_datasets) + len(split.validation_datasets)
    print(f"built {len(split.train_datasets)} train + {len(split.validation_datasets)} validation datasets "
          f"from {len(rows)} rows")
    if built != len(rows):
        problems.append(f"cellmap-data built {built} datasets from {len(rows)} rows (it skips rows it cannot load)")
    train = split.train_datasets_combined
    print(f"train samples {len(train)}; crop x class matrix {train.get_crop_class_matrix().sum(axis=0).tolist()}")
    print(f"class weights {json.dumps({k: round(float(v), 2) for k, v in train.class_weights.items()})}")
    torch.manual_seed(0)
    loader = CellMapDataLoader(train, classes=classes, batch_size=args.batch_size, weighted_sampler=True,
                               iterations_per_epoch=args.batches * args.batch_size)
    for i, batch in enumerate(loader):
        describe(f"train batch {i}", batch, classes, problems, shape)
        if i + 1 >= args.batches:
            break
    blocks = split.validation_blocks
    print(f"validation tiles {len(blocks)}")
    val_loader = CellMapDataLoader(blocks, classes=classes, batch_size=args.batch_size, is_train=False)
    describe("validation batch 0", next(iter(val_loader)), classes, problems, shape)
    changed = attrs_digest(args.root) != before
    print(f"cellmap-data wrote into the data root: {'yes' if changed else 'no'}")
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    print("OK" if not problems else f"FAILED ({len(problems)} problems)")
    return 1 if problems else 0


def run(argv: list[str] | None = None) -> int:
    """`main`, with any exception from cellmap-data reported as a failure (exit code 1)."""
    try:
        return main(argv)
    except Exception as err:  # the point of the script is to report what cellmap-data rejects
        import traceback

        traceback.print_exc()
        print(f"FAILED: cellmap-data raised {type(err).__name__}: {err}")
        return 1


if __name__ == "__main__":
    sys.exit(run())
