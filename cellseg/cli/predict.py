"""`cellseg predict [CONFIG.yaml] RUN_DIR --crops val|test|IDS --out PRED.zarr [key=value ...]`: probabilities of a
trained run, with TTA."""

from __future__ import annotations

import argparse

from cellseg.cli._recipe import PRECEDENCE, add_command, option, print_config, resolve, show_progress

ORDER = 50


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `predict` sub-command."""
    parser = add_command(
        subparsers, "predict", items="RUN_DIR", items_key="run_dir", many=False,
        items_help="the `cellseg train` run directory, or a member package of `cellseg export`",
        help="predict per-class probabilities of crops with a trained run (sliding window, 8x TTA)",
        description="Rebuild the model of RUN_DIR (config.yaml, meta.json, a checkpoint; EMA weights if the run "
                    "kept them) and predict every output channel (classes, then <class>_boundary channels) over "
                    "each crop's box at the model's voxel size, with half a patch of EM context around it: "
                    "Gaussian-blended sliding window, batched tiles, bf16 on CUDA (fp32 on CPU), averaged over "
                    "test-time flips (3D: identity + 7 flip combinations; 2D: the 8 in-plane symmetries). "
                    "Writes a prediction store (OME-NGFF, one group per crop, float16 or uint8) that records the "
                    "run, checkpoint, TTA and blending. Crops already in PRED.zarr are skipped, so an interrupted "
                    "run resumes (a crop streams through the window in z and is written a chunk of planes at a time; a "
                    "partly written one resumes after its last written planes). Under `torchrun --nproc-per-node N` "
                    "the crops are shared among the GPUs.\n\n" + PRECEDENCE,
        epilog="examples: cellseg predict runs/unet_3d --crops val --out preds/unet_3d_val.zarr; "
               "cellseg predict configs/infer/test_set.yaml runs/unet_3d crops=test out=preds/unet_3d_test.zarr",
    )
    option(parser, "--out", key="out", metavar="PRED.zarr", help="prediction store to write")
    option(parser, "--decisions", key="decisions", metavar="DECISIONS.json",
           help="TTA per class from `cellseg decide RUN_DIR` (one run; for several: predict-ensemble --decisions)")
    add_predict_options(parser)
    parser.set_defaults(func=run)


def add_predict_options(parser: argparse.ArgumentParser, *, axes_2d: bool = True) -> None:
    """The options `predict` shares with `predict-ensemble`: crops, TTA, window, device, compile and output."""
    option(parser, "--crops", key="crops", metavar="val|test|IDS",
           help="val: the run's validation crops (run_dir/datasplit.csv); test: the data root's test crops (their "
                "boxes); or comma-separated crop ids, e.g. 12,34")
    option(parser, "--tta", key="infer.tta", type=int, metavar="N",
           help="test-time transforms averaged per tile, at least 1 (default 8: 3D identity + 7 flips, 2D the 8 "
                "in-plane symmetries; 1 = none; more than a model's distinct transforms uses them all)")
    option(parser, "--overlap", key="infer.overlap", type=float,
           help="fraction of a tile shared with its neighbour (default 0.5)")
    option(parser, "--checkpoint", key="infer.checkpoint", metavar="best|last|PATH",
           help="which checkpoint of the run (default best)")
    option(parser, "--batch-size", key="infer.batch_size", type=int, metavar="N",
           help="tiles per sliding-window batch (default: the run's training micro-batch)")
    option(parser, "--tta-fold", key="infer.tta_fold", type=int, metavar="N",
           help="TTA passes per forward, batched together: the model sees N × batch tiles at once (default: on "
                "CUDA the fewest that make 16 Mi tile voxels per forward, so small forwards are not bound by "
                "kernel launches; 1 on CPU)")
    option(parser, "--device", key="infer.device", choices=("auto", "cpu", "cuda"), help="default: CUDA if present")
    if axes_2d:
        option(parser, "--axes-2d", key="infer.axes_2d", choices=("z", "zyx"),
               help="2D models: slice across z only (default), or across z, y and x and average (isotropic voxels)")
    option(parser, "--channels", key="infer.channels", choices=("scored", "all"),
           help="scored (default): a test crop gets only the classes it is scored on (in either metric era) and "
                "their boundary channels; all: every output channel for every crop")
    option(parser, "--block", key="infer.block_vox", type=int, metavar="VOX",
           help="cut a crop into columns of at most VOX voxels in y and x (2D over z, y and x: blocks of VOX per "
                "axis; best a multiple of 64), each with its own context margin (default: as large as host and GPU "
                "memory allow, most crops one column)")
    option(parser, "--compile", key="infer.compile", choices=("auto", "on", "off"),
           help="torch.compile the model (auto, the default: on CUDA; a compiler error falls back to eager with a "
                "warning). The first batch pays the compile time (tens of seconds; cached across jobs in "
                "$CELLSEG_CACHE/inductor, so predict the validation crops first)")
    option(parser, "--uint8", key="infer.uint8", action="store_true",
           help="store round(255 p) as uint8 instead of float16")
    option(parser, "--overwrite", key="infer.overwrite", action="store_true",
           help="replace the output store entirely (default: add the missing crops to it)")
    option(parser, "--data-root", key="infer.data_root", metavar="DIR",
           help="data root to read from instead of the run's data.root")
    add_backend_option(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="print the crops, the store's size per crop and in total against the free disk, and "
                             "the model input each run takes (Gvoxels), then stop: nothing is predicted or written")


def add_backend_option(parser: argparse.ArgumentParser) -> None:
    """--backend: what runs the network of a run or an exported package."""
    option(parser, "--backend", key="infer.backend", choices=("torch", "torchscript", "onnx"),
           help="torch (default): cellseg's model code with the weights of the run or package; torchscript or "
                "onnx: an exported package's graph (`cellseg export`; onnx runs in ONNX Runtime)")


def run(args: argparse.Namespace) -> int:
    """Predict; one summary line per crop is printed."""
    from cellseg.config.jobs import PredictJob
    from cellseg.config.schema import replace

    job = resolve(PredictJob, args)
    if args.print_config:
        return print_config(job)
    from cellseg.infer.predict import predict_run

    opts = replace(job.infer, progress=show_progress(args, job.infer.progress))
    if args.dry_run:
        from cellseg.infer.dry_run import dry_run

        print(dry_run([job.run_dir], str(job.crops), job.out, opts))
        return 0
    if job.decisions:
        from cellseg.decide.apply import predict_decided
        from cellseg.decide.document import Decisions, DecisionsError

        decisions = Decisions.load(job.decisions)
        if len(decisions.members) != 1:
            raise DecisionsError(f"{decisions.where}: decisions for {len(decisions.members)} runs: use "
                                 "`cellseg predict-ensemble --decisions`")
        decisions.check_runs([job.run_dir] if job.run_dir else None, checkpoint=opts.checkpoint)
        store = predict_decided(decisions, str(job.crops), job.out, opts)
        print(f"wrote {store.path}: {len(store.completed())} crops, as decided in {decisions.source}")
        return 0
    predict_run(job.run_dir, str(job.crops), job.out, opts)  # prints a line per crop (and one on skipped crops)
    return 0
