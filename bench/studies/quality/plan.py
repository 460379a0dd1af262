"""What the benchmark trains and how: the jobs (one per architecture), their resolved configs, the checks that
catch bad input before any GPU time is spent, and the plan file that keeps the settings fixed from step to step.

Work folder (`--work`): `plan.json` (this module), `data/` (the synthetic root), `runs/<arch>/` (run
directories), `logs/<arch>.log`, `schedule.jsonl` (`schedule.py`), `report/` (`cellseg report`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cellseg.config import load_run_config
from cellseg.config.schema import RunConfig

REPO = Path(__file__).resolve().parents[3]
QUALITY = REPO / "configs" / "quality"  # the eight architectures for a wall-clock budget
SMOKE = REPO / "configs" / "smoke"  # --quick: tiny models, 6 classes, CPU
ARCHITECTURES = ("resnet_3d", "unet_3d", "swin_3d", "vit_3d", "swin_2d", "unet_2d", "resnet_2d", "vit_2d")
QUICK_ARCHITECTURES = ("unet_3d", "unet_2d")
PLAN_FILE = "plan.json"
VARIANT_SEP = "+"  # "unet_3d+sgd": a second job of unet_3d's config, changed by `--set unet_3d+sgd:KEY=VALUE`
MIN_VALIDATIONS = 3  # a curve needs this many points to show a trend and a plateau (last two compared)
# Keys that decide which crops train, validate and tune: equal in every job, or the runs are not comparable and
# the report's tuning crops would be someone's validation crops and someone else's training crops.
SPLIT_KEYS = ("root", "classes", "voxel_size_nm", "max_annotation_voxel_size_nm", "datasplit", "validation_fraction",
              "split_seed", "split_margin", "report_fraction")
# --quick only: a budget of seconds on tiny models (the configs/smoke files have none)
QUICK_OVERRIDES = ("train.max_steps=1000000", "train.val_every=1000000", "train.checkpoint_every=1000000",
                   "optim.warmup_steps=0", "train.keep_top_k=1")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything a step needs, fixed when `setup` writes `plan.json` (later steps read it back).

    Attributes:
        quick: CPU smoke mode (tiny preset, the smoke configs of `QUICK_ARCHITECTURES`).
        architectures: the jobs, in launch order within each kind (3D, 2D); "arch+name" is a variant of arch.
        preset, seed, synth_workers: the synthetic data.
        budget_min, val_every_min: None: each config's own; else set for every job.
        sets: extra `[arch:]key=value` overrides (e.g. `unet_3d:optim.name=sgd`).
        concurrent, cores: jobs of each kind ("3d", "2d") at a time on each GPU, and CPU cores each gets (1
            training process; `loader.num_workers` = cores − 1 for its window or patch workers and its validation's
            scoring processes).
        gpus: GPUs the jobs spread over (each with its own `concurrent` slots and an equal share of the cores):
            with 2, the two waves of the default plan run at once, each on a GPU of its own.
        mps: run the jobs as clients of CUDA MPS (`bench/studies/quality/mps.py`): the kernels of the jobs sharing a GPU
            run at once instead of taking turns.
        device: "auto" (CUDA when present) or "cpu".
    """

    quick: bool = False
    architectures: tuple[str, ...] = ARCHITECTURES
    preset: str = "quality"
    seed: int = 0
    synth_workers: int = 16
    budget_min: float | None = None
    val_every_min: float | None = None
    sets: tuple[str, ...] = ()
    concurrent: Mapping[str, int] = field(default_factory=lambda: {"3d": 2, "2d": 2})
    cores: Mapping[str, int] = field(default_factory=lambda: {"3d": 3, "2d": 5})
    gpus: int = 1
    mps: bool = False
    device: str = "auto"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (read back by `from_json`)."""
        return {k: (list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, Mapping) else v)
                for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Settings:
        """Inverse of `to_json`."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in doc.items()})


@dataclass(frozen=True, kw_only=True)
class Job:
    """One architecture's training job.

    Attributes:
        arch: the job's name: an architecture (registry name), or a variant of one ("unet_3d+sgd": the same
            config, the variant's `--set` overrides on top) for comparing recipes side by side.
        config: its YAML file.
        overrides: `key=value` pairs after the config (data root, run directory, budget, `--set`s).
        cfg: the resolved config (what `cellseg train` will run, loader workers aside).
    """

    arch: str
    config: Path
    overrides: tuple[str, ...]
    cfg: RunConfig

    @property
    def kind(self) -> str:
        """"2d" or "3d": which slots and cores it takes."""
        return "2d" if self.cfg.data.is_2d else "3d"

    @property
    def run_dir(self) -> Path:
        """Its run directory."""
        return Path(self.cfg.run_dir)


def _sets_for(arch: str, sets: Sequence[str], known: Sequence[str]) -> list[str]:
    """The `--set` overrides that apply to `arch` ("key=value" for all, "arch:key=value" for one)."""
    out = []
    for item in sets:
        head, sep, rest = item.partition(":")
        if sep and "=" not in head:
            if head not in known:
                raise ValueError(f"--set {item!r}: {head!r} is not one of the jobs {list(known)}")
            if head == arch:
                out.append(rest)
        else:
            out.append(item)
    return out


def make_jobs(settings: Settings, work: Path) -> list[Job]:
    """The jobs of `settings`, configs resolved and checked (`check_jobs`).

    Raises:
        ValueError, FileNotFoundError: a config that does not load, or jobs that cannot be compared.
    """
    folder, common = (SMOKE, QUICK_OVERRIDES) if settings.quick else (QUALITY, ())
    timing = [f"train.time_budget_min={settings.budget_min}"] if settings.budget_min is not None else []
    timing += [f"train.val_every_min={settings.val_every_min}"] if settings.val_every_min is not None else []
    repeated = sorted({a for a in settings.architectures if settings.architectures.count(a) > 1})
    if repeated:
        raise ValueError(f"jobs named more than once: {repeated} (a second job of one config is a variant, "
                         f"e.g. {repeated[0]}{VARIANT_SEP}sgd)")
    jobs = []
    for arch in settings.architectures:
        config = folder / f"{arch.partition(VARIANT_SEP)[0]}.yaml"
        overrides = (f"data.root={work / 'data'}", f"run_dir={work / 'runs' / arch}", *common, *timing,
                     *(["train.device=cpu"] if settings.device == "cpu" else []),
                     *_sets_for(arch, settings.sets, settings.architectures))
        try:
            cfg = load_run_config(config, list(overrides))
        except (ValueError, FileNotFoundError) as err:
            raise type(err)(f"{arch}: {err}") from None
        jobs.append(Job(arch=arch, config=config, overrides=overrides, cfg=cfg))
    check_jobs(jobs)
    return jobs


def check_jobs(jobs: Sequence[Job]) -> None:
    """Refuse jobs the benchmark cannot compare, before any GPU time is spent.

    Raises:
        ValueError: fewer than two jobs, a job without a time budget, a budget too short for `MIN_VALIDATIONS`
            validations or not a whole number of validation periods (the last two validations must be one period
            apart for the plateau test), jobs predicting different classes or splitting the crops differently.
    """
    if len(jobs) < 2:
        raise ValueError(f"the benchmark compares single models with their ensembles: {len(jobs)} job(s) given")
    for job in jobs:
        tc = job.cfg.train
        if tc.time_budget_min is None or tc.val_every_min is None:
            raise ValueError(f"{job.arch} ({job.config}): train.time_budget_min and train.val_every_min must be set "
                             f"(got {tc.time_budget_min}, {tc.val_every_min})")
        periods = round(tc.time_budget_min / tc.val_every_min, 6)  # 0.15 / 0.05 is 2.9999999999999996
        if periods < MIN_VALIDATIONS:
            raise ValueError(f"{job.arch}: train.time_budget_min={tc.time_budget_min} is too short for "
                             f"{MIN_VALIDATIONS} validations every train.val_every_min={tc.val_every_min} minutes: "
                             f"its curve would hold {max(int(periods), 1)} point(s)")
        if periods != round(periods):
            raise ValueError(f"{job.arch}: train.time_budget_min={tc.time_budget_min} is not a multiple of "
                             f"train.val_every_min={tc.val_every_min}: the final validation would follow the last "
                             "periodic one early, and their difference would not measure a plateau")
    first = jobs[0]
    for job in jobs[1:]:
        differ = [k for k in SPLIT_KEYS if getattr(job.cfg.data, k) != getattr(first.cfg.data, k)]
        if differ:
            raise ValueError(f"{job.arch} and {first.arch} differ in data.{', data.'.join(differ)}: they would "
                             "predict different classes or train and validate on different crops")
        budget = (job.cfg.train.time_budget_min, job.cfg.train.val_every_min)
        if budget != (first.cfg.train.time_budget_min, first.cfg.train.val_every_min):
            raise ValueError(f"{job.arch} and {first.arch} have different budgets or validation periods "
                             "(train.time_budget_min, train.val_every_min): the curves would not be comparable")


def save_plan(settings: Settings, work: Path) -> None:
    """Write `plan.json` into the work folder."""
    work.mkdir(parents=True, exist_ok=True)
    (work / PLAN_FILE).write_text(json.dumps({"settings": settings.to_json()}, indent=1) + "\n")


def load_plan(work: Path) -> Settings | None:
    """The settings of the work folder's `plan.json` (None when there is none)."""
    path = work / PLAN_FILE
    return Settings.from_json(json.loads(path.read_text())["settings"]) if path.is_file() else None
