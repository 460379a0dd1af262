"""What a report compares and where it reads: the runs, the crops it scores and tunes on, the data root.

Everything is checked before any prediction starts, so a bad input fails in a second with a message that
names the run directory or crop:

- every run directory has `config.yaml`, `meta.json` and the requested checkpoint, and validated at least
  once (a validation record in its `metrics.jsonl`: what chose `best.pt` on its tuning crops);
- at least two runs (the ablation is about ensembles), no run twice, and all predicting the same classes
  (the uniform and weighted ensembles average class by class; the error names the classes that differ);
- one data root: `--data-root`, else the one every run was trained on;
- scored crops (`--crops`): "val" = the *report* crops of every run (validation crops whose role in the
  run's `validation_roles.csv` is "report": no decision of training, fitting or tuning saw them), "test" =
  the data root's test crops with truth in `ground_truth.zarr` (synthetic roots), or ids of either;
- tuning crops (`--tune-crops`: the ensemble weights, the post-processing parameters and the choice of the
  best single model): training crops with labels; by default ("val") the *tuning* crops of every run (the
  crops its `best.pt` was chosen on), or "same" (the scored crops: biased, and the report says so), or ids.
  Runs written before roles existed count every validation crop as both (the report says so).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cellseg.config import load_run_config
from cellseg.config.schema import RunConfig
from cellseg.data.crops import Catalog, crop_name, crop_sort_key
from cellseg.data.split import read_datasplit
from cellseg.eval.eras import registry
from cellseg.infer.run import checkpoint_path

log = logging.getLogger(__name__)
ALL_ERAS = "all"  # `--metric all`: every registered era
ALL_ERAS_ALIASES = ("both",)  # ALL_ERAS as spelled when two eras were registered


def metric_choices() -> tuple[str, ...]:
    """What `cellseg report --metric` takes: `ALL_ERAS` (and its aliases) or one registered era."""
    return (ALL_ERAS, *ALL_ERAS_ALIASES, *registry())


TRUTH_STORE = "ground_truth.zarr"  # test-crop labels of a (synthetic) data root, in the evaluator's layout


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """One run directory, checked.

    Attributes:
        run_dir: the resolved run directory.
        name: a short name unique within the report (the directory name, suffixed on clashes).
        cfg: the run's resolved config.
        classes: the classes it predicts, in its channel order.
        training: crops of its training split (`crop<N>`).
        validation: crops of its validation split.
        roles: validation crop → its role ("tuning", "report"; none when the run records no roles).
    """

    run_dir: Path
    name: str
    cfg: RunConfig
    classes: tuple[str, ...]
    training: frozenset[str]
    validation: tuple[str, ...]
    roles: Mapping[str, str] = field(default_factory=dict)

    @property
    def model(self) -> str:
        """Registry name of the architecture, and its preset when not the default (`unet_3d tiny`)."""
        preset = self.cfg.model.preset
        return self.cfg.model.name + ("" if preset == "default" else f" {preset}")


def checkpoint_file(run_dir: Path, checkpoint: str) -> Path:
    """The checkpoint file `predict` will load: `best`, `last` or a path.

    Raises:
        FileNotFoundError: it does not exist (the checkpoints present are named).
    """
    return checkpoint_path(run_dir, checkpoint)


def check_run(run_dir: str | os.PathLike[str], *, checkpoint: str, name: str,
              data_root: str | None = None) -> RunInfo:
    """Check one run directory and read what the report needs from it.

    Raises:
        FileNotFoundError: no such directory, no config.yaml/meta.json, or no such checkpoint.
        ValueError: an unreadable config or meta.json, or a run that never validated.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such run directory")
    for required in ("config.yaml", "meta.json"):
        if not (path / required).is_file():
            raise FileNotFoundError(f"{path / required}: missing (is {path} a `cellseg train` run directory?)")
    cfg = load_run_config(path / "config.yaml", [f"data.root={data_root}"] if data_root else [])
    try:
        json.loads((path / "meta.json").read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path / 'meta.json'}: not JSON ({err.msg})") from None
    check_validated(path)
    checkpoint_file(path, checkpoint)
    split = read_datasplit(path / "datasplit.csv") if (path / "datasplit.csv").is_file() else []
    return RunInfo(run_dir=path.resolve(), name=name, cfg=cfg, classes=tuple(cfg.data.classes),
                   training=frozenset(e.crop_name for e in split if e.split == "train"),
                   validation=tuple(e.crop_name for e in split if e.split == "validate"),
                   roles={e.crop_name: e.role for e in split if e.split == "validate" and e.role})


def check_validated(run_dir: Path) -> None:
    """A run must have validated at least once: a record of `metrics.jsonl` with a validation overall score.

    Raises:
        ValueError: naming the run directory and its metrics file.
    """
    metrics = run_dir / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.is_file() else []:
        try:
            val = json.loads(line).get("val")
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(val, dict) and val.get("overall_score") is not None:
            return
    why = "has no validation record" if metrics.is_file() else "is missing"
    raise ValueError(f"{run_dir}: the run never validated ({metrics} {why}), so no checkpoint was chosen on its "
                     "tuning crops; train it until a validation (train.val_every steps or train.val_every_min "
                     "minutes) before reporting on it")


def unique_names(run_dirs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Directory names, with `-2`, `-3`, ... appended to repeats (`runs/a/unet_3d`, `runs/b/unet_3d`)."""
    names: list[str] = []
    for run_dir in run_dirs:
        base = Path(run_dir).resolve().name or "run"
        name, k = base, 2
        while name in names:
            name, k = f"{base}-{k}", k + 1
        names.append(name)
    return names


def check_runs(run_dirs: Sequence[str | os.PathLike[str]], *, checkpoint: str = "best",
               data_root: str | None = None, minimum: int = 2) -> list[RunInfo]:
    """Check every run and that they can be compared and ensembled (module docstring); `minimum`: the runs needed
    (`cellseg decide` takes one: its decisions are then TTA and decoding per class).

    Raises:
        ValueError: fewer than `minimum` runs, a run given twice, or runs predicting different classes.
        FileNotFoundError: a run directory or checkpoint that does not exist.
    """
    if len(run_dirs) < minimum:
        raise ValueError(f"the ablation compares single models with their ensembles: give at least 2 runs "
                         f"(got {len(run_dirs)}: {[str(r) for r in run_dirs]})")
    resolved = [Path(r).resolve() for r in run_dirs]
    twice = sorted({str(r) for r in resolved if resolved.count(r) > 1})
    if twice:
        raise ValueError(f"run directories given more than once: {twice}")
    runs = [check_run(r, checkpoint=checkpoint, name=n, data_root=data_root)
            for r, n in zip(run_dirs, unique_names(run_dirs), strict=True)]
    first = runs[0]
    differ = [r for r in runs[1:] if set(r.classes) != set(first.classes)]
    if differ:
        diffs = "; ".join(f"{r.run_dir} lacks {sorted(set(first.classes) - set(r.classes))} and adds "
                          f"{sorted(set(r.classes) - set(first.classes))}" for r in differ)
        listing = "; ".join(f"{r.run_dir} predicts {list(r.classes)}" for r in runs)
        raise ValueError(f"runs with incompatible classes: every run must predict the same classes to be "
                         f"ensembled and compared class by class; compared with {first.run_dir}: {diffs} ({listing})")
    return runs


def data_root_of(runs: Sequence[RunInfo], data_root: str | None) -> Path:
    """`--data-root`, else the data root all runs were trained on.

    Raises:
        ValueError: the runs name different data roots and none was given.
    """
    if data_root:
        return Path(data_root)
    roots = {str(r.cfg.data.root) for r in runs}
    if len(roots) > 1:
        raise ValueError(f"the runs were trained on different data roots {sorted(roots)}; pass --data-root ROOT")
    return Path(roots.pop())


def _crop_name(text: str) -> str:
    try:
        return crop_name(text)
    except ValueError as err:
        raise ValueError(f"--crops: {err}; use val, test or ids like 12,34") from None


def role_of(runs: Sequence[RunInfo], crop: str) -> str:
    """A common validation crop's role over the runs: "report" when every run that records roles keeps it for
    reports, "tuning" when none does, "mixed" otherwise; "" when no run records roles."""
    roles = {r.roles[crop] for r in runs if r.roles}
    if not roles:
        return ""
    return roles.pop() if len(roles) == 1 else "mixed"


def validation_crops(runs: Sequence[RunInfo], data_root: str | None, role: str | None = None) -> list[str]:
    """The crops every run validates on (and that annotate the runs' classes, as `predict --crops val` picks),
    of one `role` ("tuning" or "report"; runs without roles count every validation crop as both).

    Raises:
        ValueError: no crop is in every run's validation split, or none of that role.
    """
    from cellseg.infer.selection import select_targets

    per_run = [[t.name for t in select_targets("val", r.cfg, r.run_dir, data_root=data_root)] for r in runs]
    common = [c for c in per_run[0] if all(c in names for names in per_run[1:])]
    dropped = sorted({c for names in per_run for c in names} - set(common), key=crop_sort_key)
    if dropped:
        log.warning("validation crops not shared by every run, left out (some run trained on them): %s",
                    ", ".join(dropped))
    if not common:
        raise ValueError("no crop is in the validation split of every run: "
                         + "; ".join(f"{r.run_dir}: {names}" for r, names in zip(runs, per_run, strict=True))
                         + " (pass --crops IDS)")
    if role is not None:
        mixed = [c for c in common if role_of(runs, c) == "mixed"]
        if mixed:
            log.warning("validation crops that some runs tune on and others keep for reports, left out: %s",
                        ", ".join(mixed))
        common = [c for c in common if role_of(runs, c) in (role, "")]
        if not common:
            raise ValueError(f"no validation crop shared by every run is a {role} crop (roles: "
                             + "; ".join(f"{r.run_dir}: {dict(r.roles)}" for r in runs)
                             + "); pass --crops / --tune-crops IDS")
    return sorted(common, key=crop_sort_key)


def _has_test_truth(root: Path, name: str) -> bool:
    return (root / TRUTH_STORE / name).is_dir()


def test_crops(catalog: Catalog, root: Path) -> list[str]:
    """The data root's test crops with truth in `ground_truth.zarr`.

    Raises:
        ValueError: the root has no test crops with truth (real data: the test labels are hidden).
    """
    tests = {c.name for version in catalog.tests.values() for c in version.values()}
    names = sorted((n for n in tests if _has_test_truth(root, n)), key=crop_sort_key)
    if not names:
        raise ValueError(f"{root}: no test crops with truth in {root / TRUTH_STORE} (only synthetic roots have it; "
                         "use --crops val or training crop ids)")
    return names


def explicit_crops(spec: str, catalog: Catalog, root: Path) -> list[str]:
    """Comma-separated ids: training crops of the catalogue, or test crops with truth.

    Raises:
        ValueError: an id that is neither (named), or no id at all.
    """
    names = list(dict.fromkeys(_crop_name(t) for t in spec.split(",") if t.strip()))
    if not names:
        raise ValueError("--crops: no crop given (use val, test or ids like 12,34)")
    tests = {c.name for version in catalog.tests.values() for c in version.values()}
    train = {c.name for c in catalog.train.values()}
    for name in names:
        if name in train or (name in tests and _has_test_truth(root, name)):
            continue
        where = "a test crop without truth in " + str(root / TRUTH_STORE) if name in tests else "not a crop"
        raise ValueError(f"{name}: {where} of {root} (training crops: {', '.join(sorted(train, key=crop_sort_key))})")
    return names


@dataclass(frozen=True, kw_only=True)
class CropPlan:
    """Which crops are scored and which tune the ensemble weights and post-processing.

    Attributes:
        scored: crops the stages are scored on.
        tuning: training crops with labels the weights, parameters and best single model are chosen on.
        scored_spec, tuning_spec: how they were asked for ("val", "test", ids, "same").
        roles: crop → its role in the runs' splits ("tuning", "report", "" without roles) for the validation
            crops among them.
        notes: statements about bias, for the report's header.
    """

    scored: tuple[str, ...]
    tuning: tuple[str, ...]
    scored_spec: str
    tuning_spec: str
    roles: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def predicted(self) -> tuple[str, ...]:
        """Every crop the models predict: scored, then tuning-only crops."""
        return tuple(dict.fromkeys((*self.scored, *self.tuning)))


def plan_crops(runs: Sequence[RunInfo], root: Path, *, crops: str = "val", tune_crops: str | None = None,
               explicit_root: str | None = None) -> CropPlan:
    """Resolve `--crops` and `--tune-crops` and state the biases (module docstring).

    Raises:
        ValueError: unknown crops, tuning crops that are not training crops with labels.
    """
    catalog = Catalog.from_dir(root)

    def resolve(spec: str, role: str) -> list[str]:
        if spec == "val":
            return validation_crops(runs, explicit_root, role)
        if spec == "test":
            return test_crops(catalog, root)
        return explicit_crops(spec, catalog, root)

    scored = resolve(crops, "report")
    tuning_spec = tune_crops or "val"
    tuning = list(scored) if tuning_spec == "same" else resolve(tuning_spec, "tuning")
    train = {c.name for c in catalog.train.values()}
    not_train = [c for c in tuning if c not in train]
    if not_train:
        raise ValueError(f"tuning crops must be training crops with labels in {root}; {not_train} are not "
                         f"(pass --tune-crops val or training crop ids)")
    validation = {c for r in runs for c in r.validation}
    roles = {c: role_of(runs, c) for c in dict.fromkeys((*scored, *tuning)) if c in validation}
    return CropPlan(scored=tuple(scored), tuning=tuple(tuning), scored_spec=crops, tuning_spec=tuning_spec,
                    roles=roles, notes=tuple(bias_notes(runs, scored, tuning)))


def bias_notes(runs: Sequence[RunInfo], scored: Sequence[str], tuning: Sequence[str]) -> list[str]:
    """Plain statements of what makes the scores optimistic (decisions made on scored crops, trained-on crops)."""
    notes = []
    shared = [c for c in scored if c in tuning]
    if shared:
        notes.append(f"The ensemble weights (stage 3, reused in 4), the post-processing parameters (stage 5), the "
                     f"choice of the best single model (stage 1) and the stage switches were made on {len(shared)} of the {len(scored)} "
                     f"crops they are scored on ({', '.join(shared)}): those stages are optimistically biased. "
                     "Pass --tune-crops with other crops (the default, the runs' tuning crops) for an unbiased "
                     "comparison.")
    else:
        notes.append(f"The ensemble weights, the post-processing parameters, the choice of the best single model and "
                     f"the stage switches were made on crops that are not scored ({', '.join(tuning)}): the stages are not biased by the "
                     "scored crops.")
    decided = sorted({c for r in runs for c in scored if r.roles.get(c) == "tuning"}, key=crop_sort_key)
    if decided:
        notes.append(f"Scored crops {', '.join(decided)} are tuning crops of some run: its best.pt was chosen on them.")
    if any(c in r.validation and not r.roles for r in runs for c in scored):
        notes.append("Some runs record no validation roles (validation_roles.csv): their validation crops count as "
                     "both tuning and report crops, and their best.pt was chosen on the scored crops.")
    for run in runs:
        trained = [c for c in scored if c in run.training]
        if trained:
            notes.append(f"{run.name} was trained on scored crops {', '.join(trained)}: its scores there are "
                         "optimistic.")
        tuned = [c for c in tuning if c in run.training]
        if tuned:
            notes.append(f"{run.name} was trained on tuning crops {', '.join(tuned)}: weights and parameters "
                         "tuned on its training data may not transfer to other crops.")
    return notes


def settings_doc(runs: Sequence[RunInfo], root: Path, plan: CropPlan, *, checkpoint: str, tune_metric: str,
                 overlap: float) -> dict[str, Any]:
    """The settings the stores under REPORT_DIR/stores depend on (compared on a re-run to allow resuming)."""
    return {"runs": [str(r.run_dir) for r in runs], "checkpoint": checkpoint, "data_root": str(root.resolve()),
            "crops": list(plan.scored), "tune_crops": list(plan.tuning), "tune_metric": tune_metric,
            "overlap": overlap}
