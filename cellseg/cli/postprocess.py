"""`cellseg postprocess PRED.zarr --out SEG.zarr`: thresholds and watershed instances, optionally tuned first."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cellseg.postprocess.params import ParamSet

ORDER = 55  # after predict (50) and ensemble (52)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `postprocess` sub-command."""
    parser = subparsers.add_parser(
        "postprocess",
        help="probabilities → semantic masks and instance ids (thresholds, seeded watershed)",
        description=textwrap.dedent("""\
            Turn a probability store (from `cellseg predict` or `cellseg ensemble`) into a segmentation store:
            - semantic classes: uint8 0/1 masks (probability > threshold, optional hole filling and removal
              of small components);
            - instance classes: uint32 object ids (seeds from the distance transform of the foreground and the
              <class>_boundary channel, seeded growth, hole filling, small-object removal; the algorithm is
              stated in cellseg/postprocess/instances.py). Boundary channels are not written.
            The CPU path (numpy, cc3d, scipy) and the GPU path (torch) give identical arrays.

            Parameters come from --params (a JSON file written by --tune-on), else the defaults (threshold 0.5,
            no seed erosion, no size filter). With --tune-on, every class is first tuned on crops with truth in
            DATA_ROOT against the challenge metric of --metric; the result is written to --params (default
            OUT.params.json) and used. An existing OUT written from the same source with the same settings is
            resumed (finished crops are kept); anything else needs --overwrite."""),
        epilog="examples:\n  cellseg postprocess ens.zarr --out seg.zarr --params params.json\n"
               "  cellseg postprocess ens.zarr --out seg.zarr --tune-on data/synth --crops 3 7 --metric 2026",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("predictions", metavar="PRED.zarr", help="probability store")
    parser.add_argument("--out", required=True, metavar="SEG.zarr", help="segmentation store to write")
    parser.add_argument("--params", metavar="PARAMS.json",
                        help="per-class parameters to read (or, with --tune-on, to write; default OUT.params.json)")
    parser.add_argument("--tune-on", metavar="DATA_ROOT",
                        help="tune the parameters on training crops of this data root before post-processing")
    parser.add_argument("--crops", nargs="+", metavar="ID",
                        help="with --tune-on: the crops to tune on (12 or crop12; default: every crop of the store "
                             "with truth in DATA_ROOT)")
    parser.add_argument("--metric", choices=("2025", "2026"), default="2026",
                        help="with --tune-on: the scoring era to tune for (default 2026)")
    parser.add_argument("--device", default="auto", metavar="auto|cpu|cuda",
                        help="cpu: the numpy/cc3d path; cuda[:N]: the torch path on a GPU; auto (default): cuda "
                             "when available")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT (and the params file)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Tune (optionally), then post-process every crop."""
    from cellseg.postprocess.apply import open_probabilities, postprocess_store, resolve
    from cellseg.postprocess.params import ParamSet

    progress = sys.stderr.isatty() and not args.quiet
    pred = open_probabilities(args.predictions)
    device = resolve(args.device)
    if args.crops and not args.tune_on:
        raise ValueError("--crops selects tuning crops; it needs --tune-on DATA_ROOT")
    if args.tune_on:
        from cellseg.postprocess.tune import tune_store

        params_path = Path(args.params) if args.params else Path(f"{args.out}.params.json")
        if params_path.exists() and not args.overwrite:
            raise ValueError(f"{params_path} exists; pass --overwrite to replace it, or drop --tune-on to use it")
        params = tune_store(pred, args.tune_on, crops=args.crops, era=args.metric, device=device, progress=progress)
        params.save(params_path, overwrite=args.overwrite)
        print(_score_table(params))
        print(f"wrote {params_path}")
    elif args.params:
        params = ParamSet.load(args.params)
    else:
        params = ParamSet()
    try:
        seg = postprocess_store(pred, args.out, params=params, device=device, overwrite=args.overwrite,
                                progress=progress)
    except FileExistsError as err:
        raise ValueError(str(err)) from None
    print(f"wrote {seg.path}: {len(seg.completed())} crops, {len(seg.channels)} classes ({device})")
    return 0


def _score_table(params: ParamSet) -> str:
    lines = [f"{'class':<12} {'tuned':>8} {'defaults':>9}  ({params.era} metric; IoU or combined score)"]
    for name in sorted(params.classes):
        s = params.scores.get(name, {})
        tuned, default = s.get("score"), s.get("default_score")
        if tuned is not None and default is not None:
            lines.append(f"{name:<12} {tuned:8.4f} {default:9.4f}")
    return "\n".join(lines)
