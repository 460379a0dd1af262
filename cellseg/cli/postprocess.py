"""`cellseg postprocess [CONFIG.yaml] PRED.zarr --out SEG.zarr [key=value ...]`: thresholds and watershed instances,
optionally tuned first."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cellseg.cli._eras import LazyChoices
from cellseg.cli._recipe import PRECEDENCE, add_command, option, print_config, resolve, show_progress
from cellseg.config.fields import DEFAULT_ERA

if TYPE_CHECKING:
    from cellseg.postprocess.params import ParamSet

ORDER = 55  # after predict (50) and ensemble (52)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `postprocess` sub-command."""
    parser = add_command(
        subparsers, "postprocess", items="PRED.zarr", items_key="predictions", many=False,
        items_help="the probability store",
        help="probabilities → semantic masks and instance ids (thresholds, seeded watershed)",
        description=textwrap.dedent("""\
            Turn a probability store (from `cellseg predict` or `cellseg ensemble`) into a segmentation store:
            - semantic classes: uint8 0/1 masks (probability > threshold, optional hole filling and removal
              of small components);
            - instance classes: uint32 object ids (seeds from the distance transform of the foreground and the
              <class>_boundary channel, seeded growth, hole filling, small-object removal; the algorithm is
              stated in cellseg/postprocess/instances.py). Boundary channels are not written.
            The CPU path (numpy, cc3d, scipy) and the GPU path (torch) give identical arrays.
            With --grid annotation (default) each class is written on its crop's annotation grid (test crops: the
            test manifest; training crops: the label arrays' s0): the probability is interpolated linearly there and
            the objects decoded on the model grid keep their ids (cellseg/postprocess/native.py); --grid model
            writes the model's grid, which `cellseg submit` then upsamples by nearest neighbour.

            Parameters come from --params (a JSON file written by --tune-on), else the defaults (threshold 0.5,
            no seed erosion, no size filter). With --tune-on, every class is first tuned on crops with truth in
            DATA_ROOT against the challenge metric of --metric, then each class's hierarchy option is tried (a
            group: the union with its predicted atoms; an atom: kept only where it is the most probable positive
            atom; cellseg/postprocess/hierarchy.py) and kept only where it raises the class's score; the result is
            written to --params (default OUT.params.json) and used. With --decisions (a decisions.json written by
            `cellseg decide`), each class is decoded as decided for the --metric era's leaderboard: with its tuned
            parameters where they beat the plain decoding on the tuning crops, else plainly (p > 0.5,
            26-connected components). An existing OUT written from the same source with the same settings is
            resumed (finished crops are kept); anything else needs --overwrite. The same --tune-on command run
            again (a requeued job) goes on where it stopped: the classes tuned so far are kept (in
            .PARAMS.json.partial), and a finished parameter file of the same store, data root, metric and crops
            is reused.

            """) + textwrap.fill(PRECEDENCE, width=104),
        epilog="examples:\n  cellseg postprocess ens.zarr --out seg.zarr --params params.json\n"
               "  cellseg postprocess ens.zarr --out seg.zarr --tune-on data/synth --crops 3 7 --metric 2026\n"
               "  cellseg postprocess configs/postprocess/tune_val_2026.yaml ens_val.zarr out=seg_val.zarr "
               "postprocess.tune_on=data/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    option(parser, "--out", key="out", metavar="SEG.zarr", help="segmentation store to write")
    option(parser, "--params", key="postprocess.params", metavar="PARAMS.json",
           help="per-class parameters to read (or, with --tune-on, to write; default OUT.params.json)")
    option(parser, "--tune-on", key="postprocess.tune_on", metavar="DATA_ROOT",
           help="tune the parameters on training crops of this data root before post-processing")
    option(parser, "--crops", key="postprocess.crops", nargs="+", type=str, metavar="ID", action=_JoinIds,
           help="with --tune-on: the crops to tune on (12 or crop12; default: every crop of the store with truth "
                "in DATA_ROOT, except the report crops of the store's runs, which no decision may touch)")
    option(parser, "--metric", key="postprocess.metric", choices=LazyChoices(), metavar="ERA",
           help=f"with --tune-on: the scoring era to tune for; with --decisions: the era whose choice is applied; "
                f"%(choices)s (default {DEFAULT_ERA})")
    option(parser, "--decisions", key="postprocess.decisions", metavar="DECISIONS.json",
           help="per-class decoding from `cellseg decide` (instead of --params and --tune-on)")
    option(parser, "--device", key="postprocess.device", metavar="auto|cpu|cuda",
           help="cpu: the numpy/cc3d path; cuda[:N]: the torch path on a GPU; auto (default): cuda when available")
    option(parser, "--grid", key="postprocess.grid", choices=("annotation", "model"),
           help="write each class on its crop's annotation grid (default) or on the model's grid")
    option(parser, "--data-root", key="postprocess.data_root", metavar="DATA_ROOT",
           help="with --grid annotation: the data root giving the crops' grids (default: --tune-on's, else the one "
                "the store records)")
    option(parser, "--overwrite", key="overwrite", action="store_true",
           help="replace an existing OUT (and the params file)")
    parser.set_defaults(func=run)


class _JoinIds(argparse.Action):
    """`--crops 1 crop3` → "1,crop3", the comma-separated form of `postprocess.crops`."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, ",".join(values))


def run(args: argparse.Namespace) -> int:
    """Tune (optionally), then post-process every crop."""
    from cellseg.config.jobs import PostprocessJob

    job = resolve(PostprocessJob, args)
    if args.print_config:
        return print_config(job)
    from cellseg.postprocess.apply import open_probabilities, postprocess_store
    from cellseg.postprocess.apply import resolve as resolve_device
    from cellseg.postprocess.params import ParamSet

    pp, progress = job.postprocess, show_progress(args)
    pred = open_probabilities(job.predictions)
    device = resolve_device(pp.device)
    if pp.decisions:
        from cellseg.decide.apply import postprocess_decided
        from cellseg.decide.document import Decisions

        seg = postprocess_decided(Decisions.load(pp.decisions), pred, job.out, era=pp.metric, device=device,
                                  overwrite=job.overwrite, progress=progress, data_root=pp.data_root)
        print(f"wrote {seg.path}: {len(seg.completed())} crops, {len(seg.channels)} classes, decoded as decided for "
              f"the {pp.metric} metric ({device})")
        return 0
    if pp.tune_on:
        from cellseg.postprocess.tuning import tune_store

        params_path = Path(pp.params) if pp.params else Path(f"{job.out}.params.json")
        checkpoint = params_path.with_name(f".{params_path.name}.partial")  # the classes tuned so far
        if params_path.exists() and not job.overwrite:
            params = _reusable(params_path, pred.path, pp.tune_on, pp.metric, pp.crop_ids())
            checkpoint.unlink(missing_ok=True)  # the finished file supersedes what a cut tuning kept
            print(f"reusing {params_path}: tuned before on the same store, data root, metric and crops")
        else:
            if job.overwrite:
                checkpoint.unlink(missing_ok=True)  # --overwrite tunes afresh
            params = tune_store(pred, pp.tune_on, crops=pp.crop_ids(), era=pp.metric, device=device,
                                progress=progress, checkpoint=checkpoint)
            params.save(params_path, overwrite=job.overwrite)
            checkpoint.unlink(missing_ok=True)
            print(f"wrote {params_path}")
        print(_score_table(params))
    elif pp.params:
        params = ParamSet.load(pp.params)
    else:
        params = ParamSet()
    try:
        seg = postprocess_store(pred, job.out, params=params, device=device, overwrite=job.overwrite,
                                progress=progress, grid=pp.grid, data_root=pp.data_root or pp.tune_on)
    except FileExistsError as err:
        raise ValueError(str(err)) from None
    print(f"wrote {seg.path}: {len(seg.completed())} crops, {len(seg.channels)} classes ({device}, {pp.grid} grid)")
    return 0


def _reusable(path: Path, store: Path, data_root: str, metric: str, crops: list[str] | None) -> ParamSet:
    """The parameter file an earlier `--tune-on` run of the same command wrote (a requeued job goes on from it).

    Raises:
        ValueError: it was tuned on another store, data root, metric or crops, or is no parameter file.
    """
    from cellseg.postprocess.params import ParamSet

    params = ParamSet.load(path)
    tuned = params.tuned_on
    wanted = {"store": str(store), "data_root": str(data_root), "metric": metric}
    if crops is not None:
        wanted["crops"] = [c if c.startswith("crop") else f"crop{c}" for c in crops]
    differ = sorted(k for k, v in wanted.items() if tuned.get(k) != v)
    if differ or tuned.get("partial"):
        what = ", ".join(f"{k} {tuned.get(k)!r} (asked: {wanted[k]!r})" for k in differ) or "an unfinished tuning"
        raise ValueError(f"{path} exists and was tuned otherwise: {what}; pass --overwrite to tune again and "
                         "replace it, or drop --tune-on and pass --params to use it")
    return params


def _score_table(params: ParamSet) -> str:
    lines = [f"{'class':<12} {'tuned':>8} {'defaults':>9}  hierarchy: without → with  ({params.era} metric; IoU or "
             "combined score)"]
    for name in sorted(params.classes):
        s = params.scores.get(name, {})
        tuned, default = s.get("score"), s.get("default_score")
        if tuned is None or default is None:
            continue
        line = f"{name:<12} {tuned:8.4f} {default:9.4f}"
        off, on = s.get("hierarchy_off_score"), s.get("hierarchy_on_score")
        if off is not None and on is not None:
            from cellseg.postprocess.hierarchy import option_for

            option = params.classes[name].hierarchy
            line += f"  {option or option_for(name)} {'kept' if option else 'off'}: {off:.4f} → {on:.4f}"
        lines.append(line)
    return "\n".join(lines)
