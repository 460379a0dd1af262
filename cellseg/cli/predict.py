"""`cellseg predict RUN_DIR --crops val|test|IDS --out PRED.zarr`: probabilities of a trained run, with TTA."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cellseg.config.inference import InferConfig

ORDER = 50


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `predict` sub-command."""
    parser = subparsers.add_parser(
        "predict", help="predict per-class probabilities of crops with a trained run (sliding window, 8x TTA)",
        description="Rebuild the model of RUN_DIR (config.yaml, meta.json, a checkpoint; EMA weights if the run "
                    "kept them) and predict every output channel (classes, then <class>_boundary channels) over "
                    "each crop's box at the model's voxel size, with half a patch of EM context around it: "
                    "Gaussian-blended sliding window, batched tiles, bf16 on CUDA (fp32 on CPU), averaged over "
                    "test-time flips (3D: identity + 7 flip combinations; 2D: the 8 in-plane symmetries). "
                    "Writes a prediction store (OME-NGFF, one group per crop, float16 or uint8) that records the "
                    "run, checkpoint, TTA and blending. Crops already in PRED.zarr are skipped, so an interrupted "
                    "run resumes (a crop streams through the window in z and is written a chunk of planes at a time; a "
                    "partly written one resumes after its last written planes). Under `torchrun --nproc-per-node N` "
                    "the crops are shared among the GPUs.",
        epilog="example: cellseg predict runs/unet_3d --crops val --out preds/unet_3d_val.zarr",
    )
    parser.add_argument("run_dir", help="a `cellseg train` run directory")
    parser.add_argument("--out", required=True, metavar="PRED.zarr", help="prediction store to write")
    add_predict_options(parser)
    parser.set_defaults(func=run)


def add_predict_options(parser: argparse.ArgumentParser, *, axes_2d: bool = True) -> None:
    """The options `predict` shares with `predict-ensemble`: crops, TTA, window, device, compile and output."""
    parser.add_argument("--crops", required=True, metavar="val|test|IDS",
                        help="val: the run's validation crops (run_dir/datasplit.csv); test: the data root's test "
                             "crops (their boxes); or comma-separated crop ids, e.g. 12,34")
    parser.add_argument("--tta", type=int, default=8, choices=(1, 8),
                        help="test-time transforms averaged per tile (default 8; 1 = none)")
    parser.add_argument("--overlap", type=float, default=0.5,
                        help="fraction of a tile shared with its neighbour (default 0.5)")
    parser.add_argument("--checkpoint", default="best", metavar="best|last|PATH",
                        help="which checkpoint of the run (default best)")
    parser.add_argument("--batch-size", type=int, default=None, metavar="N",
                        help="tiles per sliding-window batch (default: the run's training micro-batch)")
    parser.add_argument("--tta-fold", type=int, default=None, metavar="N",
                        help="TTA passes per forward, batched together: the model sees N × batch tiles at once "
                             "(default: on CUDA the fewest that make 16 Mi tile voxels per forward, so small "
                             "forwards are not bound by kernel launches; 1 on CPU)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="default: CUDA if present")
    if axes_2d:
        parser.add_argument("--axes-2d", default="z", choices=("z", "zyx"),
                            help="2D models: slice across z only, or across z, y and x and average (isotropic voxels)")
    parser.add_argument("--channels", default="scored", choices=("scored", "all"),
                        help="scored (default): a test crop gets only the classes it is scored on (in either metric "
                             "era) and their boundary channels; all: every output channel for every crop")
    parser.add_argument("--block", type=int, default=None, metavar="VOX",
                        help="cut a crop into columns of at most VOX voxels in y and x (2D over z, y and x: blocks "
                             "of VOX per axis; best a multiple of 64), each with its own context margin (default: "
                             "as large as host and GPU memory allow, most crops one column)")
    parser.add_argument("--compile", default="auto", choices=("auto", "on", "off"),
                        help="torch.compile the model (auto, the default: on CUDA; a compiler error falls back to "
                             "eager with a warning). The first batch pays the compile time (tens of seconds; "
                             "cached across jobs in $CELLSEG_CACHE/inductor, so predict the validation crops "
                             "first)")
    parser.add_argument("--uint8", action="store_true", help="store round(255 p) as uint8 instead of float16")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the output store entirely (default: add the missing crops to it)")
    parser.add_argument("--data-root", metavar="DIR", help="data root to read from instead of the run's data.root")


def predict_options(args: argparse.Namespace, *, progress: bool) -> InferConfig:
    """`InferConfig` from the parsed `add_predict_options` arguments."""
    from cellseg.config.inference import InferConfig

    return InferConfig(tta=args.tta, overlap=args.overlap, checkpoint=args.checkpoint,
                          batch_size=args.batch_size, device=args.device, uint8=args.uint8,
                          overwrite=args.overwrite, data_root=args.data_root, axes_2d=getattr(args, "axes_2d", "z"),
                          block_vox=args.block, channels=args.channels, compile=args.compile,
                          tta_fold=args.tta_fold, progress=progress)


def run(args: argparse.Namespace) -> int:
    """Predict; one summary line per crop is printed."""
    from cellseg.infer.predict import predict_run

    opts = predict_options(args, progress=sys.stderr.isatty() and not args.quiet)
    predict_run(args.run_dir, args.crops, args.out, opts)  # prints a line per crop (and one on skipped crops)
    return 0
