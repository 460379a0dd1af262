"""`cellseg info`: describe a data root, a zarr group/array, or the official CellMap catalogue."""

from __future__ import annotations

import argparse

ORDER = 10


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `info` sub-command."""
    parser = subparsers.add_parser(
        "info",
        help="describe a data root, a zarr array/group, or the official catalogue",
        description="For a data root (synthetic or downloaded): datasets, crops, classes per crop, voxel "
                    "sizes and sizes on disk. For a zarr array or OME-NGFF group: its levels and metadata. "
                    "With --catalog: the official CellMap catalogue (22 datasets, 289 training crops, 16 test "
                    "crops in the 2025 and 2026 manifests, the 48 scored classes).",
    )
    parser.add_argument("path", nargs="?", help="data root, zarr group or zarr array")
    parser.add_argument("--catalog", action="store_true", help="summarise the packaged official manifests")
    parser.add_argument("--classes", action="store_true", help="list the CellMap classes (ids, groups, scoring)")
    parser.add_argument("--pad-value", type=int, default=0, metavar="V",
                        help="EM value of 'outside the imaged volume' (data.em_pad_value, default 0): a data root's "
                             "description gives the share of each dataset's EM equal to it (voxels inside cells "
                             "that are this dark, e.g. saturated membranes, are data: training masks only the regions of this value "
                             "connected to the volume's edge, data.padding_mask=edge)")
    parser.set_defaults(func=run)


def _class_table() -> str:
    from cellseg.classes import all_classes, members_of

    lines = [f"{'id':>3} {'name':<12} {'scored':<9} {'long name':<42} members"]
    for c in all_classes():
        lines.append(f"{c.id:>3} {c.name:<12} {c.metric or '-':<9} {c.long_name:<42} {', '.join(members_of(c.name))}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the requested description."""
    if not (args.path or args.catalog or args.classes):
        raise ValueError("give a PATH, --catalog or --classes (see `cellseg info --help`)")
    parts = []
    if args.catalog:
        from cellseg.classes import instance_classes, tested_classes
        from cellseg.data.crops import Catalog

        parts.append(Catalog.official().summary())
        parts.append(f"\n{len(tested_classes())} scored classes, {len(instance_classes())} as instances: "
                     f"{', '.join(instance_classes())}")
    if args.classes:
        parts.append(_class_table())
    if args.path:
        from cellseg.data.inspect import describe

        if not 0 <= args.pad_value <= 255:
            raise ValueError(f"--pad-value {args.pad_value}: EM is uint8, choose a value in [0, 255]")
        parts.append(describe(args.path, pad_value=args.pad_value))
    print("\n\n".join(parts))
    return 0
