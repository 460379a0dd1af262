"""`cellseg train CONFIG [key=value ...]`: train one architecture (torchrun for several GPUs/nodes).

Exit status: 0 when training reached `train.max_steps` (and wrote result.json); 75 when a signal (SIGTERM,
SIGUSR1, Ctrl-C) stopped it early with a checkpoint: the same command with `--resume` continues it.
"""

from __future__ import annotations

import argparse
import sys

ORDER = 40
HANDLES_STOP_SIGNALS = True  # `cellseg.train.stop.StopRequest`: stop at the end of a step, with a checkpoint


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `train` sub-command."""
    parser = subparsers.add_parser(
        "train", help="train one architecture from a YAML config",
        description="Train one architecture. CONFIG is a YAML file under configs/ (with `include:`); overrides "
                    "are dotted key=value pairs on existing keys, e.g. train.max_steps=1000 data.root=/data. "
                    "Under `torchrun --nproc-per-node N` (and --nnodes/--rdzv-*) the same command runs DDP. "
                    "The run directory receives config.yaml, meta.json, datasplit.csv, metrics.jsonl, "
                    "TensorBoard events and checkpoints/ (last.pt, best.pt, top-k), and result.json once training "
                    "is complete. SIGTERM, SIGUSR1 or Ctrl-C stop it after the current step with a checkpoint and "
                    "exit status 75 (resumable: run the same command with --resume); a second training in the "
                    "same run_dir fails at once.",
        epilog="example: cellseg train configs/smoke/unet_3d.yaml data.root=/tmp/synth run_dir=/tmp/runs/u3",
    )
    parser.add_argument("config", help="YAML run config")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides of config keys")
    parser.add_argument("--resume", nargs="?", const="yes", default="no", choices=["yes", "no", "auto"],
                        help="continue the run in run_dir from checkpoints/last.pt (the newest intact checkpoint if "
                             "that one is corrupt); 'auto' continues if one exists and starts fresh otherwise "
                             "(requeued SLURM jobs)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="write a torch.profiler trace of N steps to run_dir/profile")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the config and train; 75 (`EXIT_RESUMABLE`) when stopped early with a checkpoint."""
    from cellseg.train.stop import EXIT_RESUMABLE, StopRequest

    stop = StopRequest()  # before torch is imported: a signal during the start-up counts too
    try:
        from cellseg.cli._eras import era_names
        from cellseg.config import dump, load_run_config
        from cellseg.config.fields import check_eras
        from cellseg.train.run_checkpoints import NonFiniteError
        from cellseg.train.trainer import TrainingStopped, train

        overrides = list(args.overrides) + ([f"train.profile_steps={args.profile}"] if args.profile else [])
        cfg = load_run_config(args.config, overrides)
        check_eras(cfg, era_names())  # val.metric: a registered era, before any training
        if args.print_config:
            print(dump(cfg))
            return 0
        try:
            train(cfg, resume={"yes": True, "no": False, "auto": "auto"}[args.resume], stop=stop)
        except TrainingStopped as err:
            print(f"cellseg train: {err}", file=sys.stderr)
            return EXIT_RESUMABLE
        except NonFiniteError as err:  # the run diverged: not resumable as it is; one line is enough
            print(f"cellseg train: error: {err}", file=sys.stderr)
            return 1
        return 0
    finally:
        stop.restore()
