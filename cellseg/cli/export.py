"""`cellseg export RUN_DIR|DECISIONS --out DIR`: a trained run, or an ensemble with its decisions, as a package that
runs without cellseg (TorchScript, ONNX, a BioImage.IO description) and that cellseg predicts from."""

from __future__ import annotations

import argparse
from pathlib import Path

ORDER = 56  # after predict (50), ensemble (52) and postprocess (55): what a run gives others


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `export` sub-command."""
    parser = subparsers.add_parser(
        "export", help="write a trained run or a decided ensemble as a package (TorchScript, ONNX, BioImage.IO)",
        description="RUN_DIR: trace the run's network (its checkpoint's EMA weights if it kept them) at its "
                    "training patch on the CPU in float32, with the input normalisation (EM / 255) and the sigmoid "
                    "inside, to TorchScript and ONNX (batch axis free), each checked against PyTorch (max abs "
                    "difference ≤ 1e-4) before anything is written; a BioImage.IO description (rdf.yaml, validated "
                    "with bioimageio.spec) with a test input from the run's own EM, its output and a cover; "
                    "model.json (axes, patch, voxel size in nm, channels, provenance, sha256 of every file); and "
                    "the run's config and weights, so `cellseg predict OUT` predicts as from the run. "
                    "DECISIONS (a decisions.json or DECIDE_DIR of `cellseg decide`): every member so, under "
                    "OUT/members/<name>, and the decisions beside them: `cellseg predict-ensemble OUT` and "
                    "`predict-volume OUT` apply them. docs/sharing.md.",
        epilog="examples: cellseg export runs/unet_3d --out exports/unet_3d; "
               "cellseg export decide/decisions.json --out exports/ensemble --author 'A. Researcher' "
               "--maintainer ghuser; cellseg export --check exports/ensemble",
    )
    parser.add_argument("source", metavar="RUN_DIR|DECISIONS|PACKAGE",
                        help="a `cellseg train` run directory, a decisions.json (or its DECIDE_DIR) of `cellseg "
                             "decide`, or with --check a package to check")
    parser.add_argument("--out", metavar="DIR", help="the package folder to write")
    parser.add_argument("--format", default="torchscript,onnx,bioimageio", metavar="F[,F...]",
                        help="torchscript, onnx, bioimageio (comma-separated; default all three: onnx and "
                             "bioimageio need `pip install 'cellseg[export]'`)")
    parser.add_argument("--checkpoint", default="best", help="RUN_DIR: best (default), last or a checkpoint file")
    parser.add_argument("--author", action="append", metavar="NAME",
                        help="an author for the BioImage.IO description (repeat for several; default 'cellseg user')")
    parser.add_argument("--maintainer", action="append", metavar="GITHUB_USER",
                        help="a maintainer's GitHub user name (the model zoo asks for one; repeat for several)")
    parser.add_argument("--license", default="CC-BY-4.0", metavar="SPDX",
                        help="licence of the weights, an SPDX id (default CC-BY-4.0)")
    parser.add_argument("--check", action="store_true",
                        help="check an existing package instead: every file's sha256 and each graph's output on its "
                             "test input")
    parser.add_argument("--overwrite", action="store_true", help="replace a package cellseg wrote at --out")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Export (or check) and say what was written."""
    from cellseg.export.bioimageio import ZooFields
    from cellseg.export.package import check_export, export_ensemble, export_run, parse_formats

    if args.check:
        for folder, diffs in check_export(args.source).items():
            print(f"{folder}: files match their sha256; on the test input "
                  + ", ".join(f"{k} within {v:.1e}" for k, v in diffs.items()))
        return 0
    if not args.out:
        raise ValueError("--out DIR is required to export (or give --check PACKAGE)")
    formats = parse_formats(args.format)
    zoo = ZooFields(authors=tuple(args.author or ZooFields.authors), maintainers=tuple(args.maintainer or ()),
                    license=args.license)
    source = Path(args.source)
    if source.suffix == ".json" or (source / "decisions.json").is_file():
        doc = export_ensemble(source, args.out, formats=formats, zoo=zoo, overwrite=args.overwrite, say=print)
        print(f"wrote {args.out}: an ensemble of {len(doc['members'])} members ({', '.join(doc['members'])}) in "
              f"{', '.join(formats)}, with its decisions; predict with `cellseg predict-ensemble {args.out}`")
        return 0
    doc = export_run(source, args.out, checkpoint=args.checkpoint, formats=formats, zoo=zoo,
                     overwrite=args.overwrite, say=print)
    print(f"wrote {args.out}: {doc['architecture']} ({doc['preset']}), input {doc['input']['shape']} "
          f"{doc['input']['axes']} at {doc['input']['voxel_size_nm']} nm, {len(doc['output']['channels'])} "
          f"output channels, {', '.join(formats)}")
    return 0
