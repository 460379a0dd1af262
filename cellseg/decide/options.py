"""What deciding needs to know and where it keeps its work: its options (`DecideOptions`, which `cellseg report`'s
options extend), a scored row (`StageResult`) and the paths inside its working directory (`Layout`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cellseg.config.fields import DEFAULT_ERA
from cellseg.decide.inputs import ALL_ERAS, ALL_ERAS_ALIASES, RunInfo, metric_choices
from cellseg.decide.scoring import EraScores
from cellseg.eval.eras import Era, registry
from cellseg.pool import usable_cores

# Default scoring processes: the cores this process may use, at most this many. A 2x H100 host's 32 cores were half
# idle in the report's CPU steps at 16; stores scored side by side (`score_segmentations`) and the instance
# classes' tuning (one class per process, ~15 classes) use more.
MAX_WORKERS = 32
SETTINGS_FILE = "report_settings.json"  # what the stores depend on; its presence marks a decide or report directory


def check_predict_jobs(value: int | str) -> None:
    """Raise a clear error unless `value` is "auto" or an int ≥ 1 (`DecideOptions.predict_jobs`).

    Raises:
        ValueError: anything else.
    """
    if value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"--predict-jobs {value!r}: must be 'auto' or a number of processes ≥ 1")
    if value < 1:
        raise ValueError(f"--predict-jobs {value}: must be ≥ 1 (1 predicts the members one after the other in the "
                         "same process) or 'auto'")


@dataclass(frozen=True, kw_only=True)
class DecideOptions:
    """How the decisions are made (`cellseg decide`'s options; `cellseg report` adds what it scores).

    Attributes:
        runs: run directories (at least 2, same classes).
        out: the working directory (stores, truth, decisions.json).
        data_root: where crops and truth are read (default: the runs' data root).
        tune_crops: crops every decision is made on: None or "val" (the runs' tuning crops), "same" (a report's
            scored crops) or ids.
        metric: the eras the tuning crops are scored in, each with its own stage-5 choice: "all" (every
            registered era; "both" is the same) or one registered era.
        tune_metric: the era weights, parameters and the switches of stages 2-4 are decided in (default
            `DEFAULT_ERA`, or the only era scored).
        checkpoint, overlap, device: passed to `predict` (and `device` to ensembling and post-processing).
        workers: processes scoring (crop, label) pairs, and tuning the instance classes' post-processing, in
            parallel (None: the CPU cores this process may use, at most 32).
        predict_jobs: processes predicting the members at once, each one member at a time (1: one after the
            other in this process; "auto": on CUDA up to 4, one per 16 GiB of GPU memory, on CPU 1;
            `cellseg.decide.predictions`).
        reuse: prediction stores written by `cellseg predict` that members use instead of predicting when they
            hold every crop from the same checkpoint and settings (`cellseg.decide.reuse`).
        overwrite: start over (delete the stores of an earlier run in `out`).
    """

    runs: tuple[str, ...]
    out: str
    data_root: str | None = None
    tune_crops: str | None = None
    metric: str = ALL_ERAS
    tune_metric: str | None = None
    checkpoint: str = "best"
    overlap: float = 0.5
    device: str = "auto"
    workers: int | None = None
    predict_jobs: int | str = "auto"
    reuse: tuple[str, ...] = ()
    overwrite: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        if self.metric not in metric_choices():
            raise ValueError(f"--metric {self.metric!r}: choose one of {metric_choices()}")
        if self.tune_metric is not None and self.tune_metric not in registry():
            raise ValueError(f"--tune-metric {self.tune_metric!r}: choose one of {tuple(registry())}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device {self.device!r}: choose auto, cpu or cuda")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"--workers {self.workers}: must be ≥ 1")
        check_predict_jobs(self.predict_jobs)
        if not 0.0 <= self.overlap < 1.0:
            raise ValueError(f"--overlap {self.overlap}: must be in [0, 1)")

    @property
    def scoring_workers(self) -> int:
        """Processes scoring (crop, label) pairs: `workers`, else the CPU cores, at most `MAX_WORKERS`."""
        return self.workers or min(usable_cores(), MAX_WORKERS)

    @property
    def eras(self) -> tuple[Era, ...]:
        """The eras scored."""
        return tuple(registry()) if self.scores_all else (self.metric,)

    @property
    def tuning_era(self) -> Era:
        """The era the weights and post-processing parameters are tuned for."""
        return self.tune_metric or (DEFAULT_ERA if self.scores_all else self.metric)

    @property
    def scores_all(self) -> bool:
        """Whether every registered era is scored (`--metric all`)."""
        return self.metric in (ALL_ERAS, *ALL_ERAS_ALIASES)


@dataclass(frozen=True, kw_only=True)
class StageResult:
    """One scored row: a stage or a single model.

    Attributes:
        key: file-name key ("single_<run>", "uniform", "weighted", "tta", "postprocess").
        title: row title.
        store: the probability store it scores (the segmentation store for post-processing).
        scores: era → scores.
    """

    key: str
    title: str
    store: str
    scores: dict[str, EraScores]

    def overall(self, era: str) -> float:
        """Overall score in `era` (NaN when not scored)."""
        return self.scores[era].overall if era in self.scores else math.nan


class Layout:
    """Paths inside a decide or report directory (listed in the docstring of `cellseg.decide.stages`)."""

    def __init__(self, root: Path):
        self.root = root
        self.stores = root / "stores"
        self.truth = root / "truth.zarr"
        self.tuning_truth = root / "truth_tuning.zarr"
        self.settings = root / SETTINGS_FILE
        self.decisions = root / "decisions.json"
        self.params = self.stores / "postprocess_params.json"
        self.postprocessed = self.stores / "postprocessed.zarr"
        self.postprocessed_switched = self.stores / "postprocessed_switched.zarr"

    def postprocessed_in(self, era: str, *, tuning_era: str, off: Sequence[str]) -> Path:
        """Stage 5 as switched in `era` (`off`: the classes it switched off there; `cellseg.decide.switches`)."""
        if not off:
            return self.postprocessed
        return self.postprocessed_switched if era == tuning_era else self.stores / f"postprocessed_switched_{era}.zarr"

    def predictions(self, run: RunInfo, tta: int) -> Path:
        """A run's probability store at `tta` transforms."""
        return self.stores / f"predict_tta{tta}" / f"{run.name}.zarr"

    def ensemble(self, name: str) -> Path:
        """An ensemble's probability store."""
        return self.stores / f"ensemble_{name}.zarr"

    def segmentation(self, key: str) -> Path:
        """A stage's thresholded segmentation."""
        return self.stores / "segmentation" / f"{key}.zarr"

    def submission(self, key: str) -> Path:
        """A stage's submission zip at the truth's geometry."""
        return self.stores / "submissions" / f"{key}.zip"
