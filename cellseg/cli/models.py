"""`cellseg models`: list the registered architectures with parameters, FLOPs and default patch."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PRESETS = ("default", "tiny")
COLUMNS = (
    ("name", "{name:<10}"),
    ("dims", "{spatial_dims:>4}"),
    ("params", "{params:>8}"),
    ("patch (vox)", "{patch:<13}"),
    ("voxel (nm)", "{voxel:<10}"),
    ("divisor", "{divisor:<11}"),
    ("fwd GFLOP/patch", "{forward_gflop_per_patch:>15.3f}"),
    ("fwd kFLOP/vox", "{forward_kflop_per_voxel:>13.1f}"),
    ("TTA flip / swap", "{tta}"),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `models` sub-command."""
    parser = subparsers.add_parser(
        "models",
        help="list the architectures: parameters, forward FLOPs, default patch and voxel size",
        description="For every registered architecture (or --names): trainable parameters, forward GFLOP "
        "per patch and kFLOP per voxel at the preset's patch (counted with torch.utils.flop_counter on the "
        "meta device, so nothing is computed), default patch in voxels, voxel size in nm, the input "
        "divisor and the axes allowed for test-time augmentation.",
    )
    parser.add_argument(
        "--preset", choices=PRESETS, default="default", help="parameter preset (default: default)"
    )
    parser.add_argument(
        "--names", metavar="A,B", help="comma-separated subset of architectures (default: all)"
    )
    parser.add_argument("--json", metavar="OUT", type=Path,
                        help="also write the rows as JSON to OUT (an existing file needs --overwrite)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    parser.add_argument("--in-channels", type=int, default=1, help="image channels (default: 1)")
    parser.add_argument("--out-channels", type=int, default=16, help="logit channels (default: 16)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Count and print one row per architecture; optionally write them to ``--json``."""
    from tqdm import tqdm

    from cellseg.models import list_models
    from cellseg.models.summary import summarize_model

    if args.json is not None and args.json.exists() and not args.overwrite:  # before any counting
        raise FileExistsError(f"--json {args.json} already exists; pass --overwrite to replace it")
    names = _selected_names(args.names, list_models())
    rows = [
        summarize_model(
            name, preset=args.preset, in_channels=args.in_channels, out_channels=args.out_channels
        )
        for name in tqdm(names, desc="counting", unit="model", disable=not sys.stderr.isatty(), leave=False)
    ]
    print(format_table([row.to_dict() for row in rows]))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([row.to_dict() for row in rows], indent=2) + "\n")
    return 0


def format_table(rows: list[dict]) -> str:
    """A fixed-width text table of summary dicts (as ``ModelSummary.to_dict`` gives them)."""
    header = "  ".join(_pad(title, template) for title, template in COLUMNS)
    lines = [header, "-" * len(header)]
    for row in rows:
        cells = {
            **row,
            "params": f"{row['num_params'] / 1e6:.2f}M",
            "patch": "x".join(map(str, row["patch_shape_vox"])),
            "voxel": "x".join(f"{size:g}" for size in row["voxel_size_nm"]),
            "divisor": "x".join(map(str, row["input_divisor"])),
            "tta": f"{''.join(row['tta_axes'])} / {''.join(row['tta_transpose_axes']) or '-'}",
        }
        lines.append("  ".join(template.format(**cells) for _, template in COLUMNS))
    return "\n".join(lines)


def _pad(title: str, template: str) -> str:
    """Align a header cell with its column's format (width and side taken from the template)."""
    spec = template.split(":")[1].rstrip("}") if ":" in template else ""
    width = int("".join(ch for ch in spec.split(".")[0] if ch.isdigit()) or 0)
    return title.rjust(width) if spec.startswith(">") else title.ljust(width)


def _selected_names(names: str | None, valid: list[str]) -> list[str]:
    if not names:
        return valid
    chosen = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in valid]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    return chosen
