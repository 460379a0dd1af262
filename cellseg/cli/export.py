"""`cellseg export RUN_DIR --out DIR`: a trained run as a TorchScript package that runs without cellseg."""

from __future__ import annotations

import argparse

ORDER = 56  # after predict (50), ensemble (52) and postprocess (55): what a run gives others


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `export` sub-command."""
    parser = subparsers.add_parser(
        "export", help="write a trained run as a TorchScript package (runs without cellseg)",
        description="Trace RUN_DIR's network (its checkpoint's EMA weights if it kept them) at its training patch "
                    "on the CPU in float32, with the input normalisation (EM / 255) and the sigmoid inside, and "
                    "write OUT/model.torchscript.pt, model.json (axes, patch, voxel size in nm, channels and "
                    "classes, the run's provenance, the sha256 of every file) and a test input with the network's "
                    "output on it. The trace is checked against the PyTorch network (max abs difference ≤ 1e-4) "
                    "before anything is written. Load it with torch.jit.load alone; docs/sharing.md.",
        epilog="example: cellseg export runs/unet_3d --out exports/unet_3d && cellseg export --check exports/unet_3d",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR|EXPORT", help="a `cellseg train` run directory (with --check: "
                                                                   "an export to check)")
    parser.add_argument("--out", metavar="DIR", help="the package folder to write")
    parser.add_argument("--checkpoint", default="best", help="best (default), last or a checkpoint file of the run")
    parser.add_argument("--check", action="store_true",
                        help="check an existing export instead: its files' sha256 and its output on its test input")
    parser.add_argument("--overwrite", action="store_true", help="replace an export cellseg wrote at --out")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Export (or check) and say what was written."""
    from cellseg.infer.export import check_export, export_run

    if args.check:
        diff = check_export(args.run_dir)
        print(f"{args.run_dir}: files match their sha256; output on the test input within {diff:.1e}")
        return 0
    if not args.out:
        raise ValueError("--out DIR is required to export (or give --check EXPORT)")
    doc = export_run(args.run_dir, args.out, checkpoint=args.checkpoint, overwrite=args.overwrite)
    print(f"wrote {args.out}: {doc['architecture']} ({doc['preset']}), input {doc['input']['shape']} "
          f"{doc['input']['axes']} at {doc['input']['voxel_size_nm']} nm, {len(doc['output']['channels'])} "
          f"output channels; traced within {doc['parity']['max_abs_diff_vs_pytorch']:.1e} of PyTorch")
    return 0
