"""`run_decide`: every decision of the measured pipeline, made on the tuning crops of trained runs, into
DECIDE_DIR/decisions.json (`cellseg decide`).

The same stages as `cellseg report` (`cellseg.decide.stages`: each run alone, the uniform mean, fitted weights, TTA,
tuned post-processing, each switched per class), predicted and scored on the tuning crops only: no crop without
truth, and none the decisions are later applied to, takes part. DECIDE_DIR keeps the stores and scores
(`cellseg.decide.options.Layout`), so a killed run resumes; `--overwrite` starts over.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cellseg.decide.build import build_decisions
from cellseg.decide.document import Decisions
from cellseg.decide.inputs import CropPlan, RunInfo, check_runs, data_root_of, role_of, validation_crops
from cellseg.decide.options import SETTINGS_FILE, DecideOptions, Layout
from cellseg.decide.reuse import open_candidates
from cellseg.decide.stages import make_single_stores, make_stores
from cellseg.decide.timings import TIMINGS_FILE, Timings, write_atomic
from cellseg.decide.truth import build_truth

log = logging.getLogger(__name__)
# what --overwrite removes from a decide directory
OUTPUTS = ("stores", "truth.zarr", "truth_tuning.zarr", "decisions.json", TIMINGS_FILE, SETTINGS_FILE)


def remove_outputs(root: Path, names: Sequence[str], patterns: Sequence[str] = ()) -> None:
    """Delete `names` and the files matching `patterns` in `root` (an earlier run's own outputs)."""
    for name in names:
        path = root / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for pattern in patterns:
        for file in root.glob(pattern):
            file.unlink()


def prepare_dir(layout: Layout, settings: dict[str, Any], *, overwrite: bool, outputs: Sequence[str] = OUTPUTS,
                patterns: Sequence[str] = ()) -> bool:
    """Create the working directory, or reopen one made with the same settings; True when resuming. With
    `overwrite`, an earlier run's `outputs` (and files matching `patterns`) are deleted first.

    Raises:
        ValueError: the directory holds something else, or a run made with other settings (without
            `overwrite`).
    """
    root = layout.root
    if root.exists() and any(root.iterdir()) and not layout.settings.is_file():
        # Even with --overwrite: only an earlier run's output is ever deleted, never a directory of other things.
        raise ValueError(f"{root} exists and is not a cellseg decide or report directory (no {SETTINGS_FILE}); "
                         "choose another --out")
    if overwrite and root.exists():
        remove_outputs(root, outputs, patterns)
    if layout.settings.is_file():
        old = json.loads(layout.settings.read_text())
        differ = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if differ:
            lines = "; ".join(f"{k}: then {old.get(k)!r}, now {settings.get(k)!r}" for k in differ)
            raise ValueError(f"{root}: holds a run made with other settings ({lines}); pass --overwrite to "
                             "start over or choose another --out")
        log.info("%s: resuming (stores of the earlier run with the same settings are reused)", root)
        return True
    layout.stores.mkdir(parents=True, exist_ok=True)
    write_atomic(layout.settings, json.dumps(settings, indent=2) + "\n")
    return False


def tuning_plan(runs: Sequence[RunInfo], root: Path, tune_crops: str | None, explicit_root: str | None) -> CropPlan:
    """The crops decisions are made on: `tune_crops` "val" (default: the runs' tuning crops) or training crop
    ids, predicted and scored alone.

    Raises:
        ValueError: no such crops, or crops that are not training crops with labels.
    """
    from cellseg.data.crops import Catalog
    from cellseg.decide.inputs import explicit_crops

    spec = tune_crops or "val"
    if spec == "same":
        raise ValueError("--tune-crops same: `cellseg decide` scores nothing but its tuning crops; give 'val' or "
                         "training crop ids")
    catalog = Catalog.from_dir(root)
    crops = validation_crops(runs, explicit_root, "tuning") if spec == "val" else explicit_crops(spec, catalog, root)
    train = {c.name for c in catalog.train.values()}
    not_train = [c for c in crops if c not in train]
    if not_train:
        raise ValueError(f"tuning crops must be training crops with labels in {root}; {not_train} are not")
    validation = {c for r in runs for c in r.validation}
    roles = {c: role_of(runs, c) for c in crops if c in validation}
    trained = [f"{r.name} was trained on tuning crops {', '.join(t)}: its decisions may not transfer to other crops"
               for r in runs if (t := [c for c in crops if c in r.training])]
    return CropPlan(scored=tuple(crops), tuning=tuple(crops), scored_spec=spec, tuning_spec=spec, roles=roles,
                    notes=tuple(trained))


def run_decide(opts: DecideOptions) -> Decisions:
    """Make every decision on the tuning crops and write DECIDE_DIR/decisions.json (module docstring).

    Raises:
        ValueError, FileNotFoundError: bad runs, crops or directory (checked before any prediction).
    """
    from cellseg.decide.inputs import settings_doc

    runs = check_runs(opts.runs, checkpoint=opts.checkpoint, data_root=opts.data_root, minimum=1)
    root = data_root_of(runs, opts.data_root)
    plan = tuning_plan(runs, root, opts.tune_crops, opts.data_root)
    open_candidates(opts.reuse, runs)  # a store named for reuse that is none of the runs': an error now
    layout = Layout(Path(opts.out))
    resuming = prepare_dir(layout, settings_doc(runs, root, plan, checkpoint=opts.checkpoint,
                                                tune_metric=opts.tuning_era, overlap=opts.overlap),
                           overwrite=opts.overwrite)
    log.info("deciding for %d runs (%s) on %d tuning crops (%s), %s metric; stage 5 also for %s", len(runs),
             ", ".join(r.name for r in runs), len(plan.tuning), ", ".join(plan.tuning), opts.tuning_era,
             ", ".join(opts.eras))
    for note in plan.notes:
        log.warning(note)
    timings = Timings(layout.root / TIMINGS_FILE, resuming=resuming)
    with timings.step("truth of the tuning crops (evaluator layout)", resumed=layout.truth.is_dir()):
        if not layout.truth.is_dir():
            build_truth(layout.truth, plan.tuning, runs[0].classes, root)
    if len(runs) == 1:  # decisions of one run: TTA and the decoding per class
        stores = make_single_stores(runs[0], root, plan, layout, opts, timings)
    else:
        stores = make_stores(runs, root, plan, layout, opts, timings)
    decisions = build_decisions(runs, stores, plan, opts, root, layout)
    decisions.save(layout.decisions)
    log.info("wrote %s", layout.decisions)
    return Decisions.load(layout.decisions)
