"""Typed configuration of `cellseg decide` (`DecideConfig`, the `decide` section of `configs/decide/*.yaml`): on
which crops, in which eras and with which prediction settings every decision of the measured pipeline is made.

Same rules as the other sections (`cellseg.config.inference`): frozen, keyword-only, `__post_init__` raises
`ValueError` naming the dotted key and the valid choices; the command's root config is `cellseg.config.jobs.DecideJob`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cellseg.config.fields import _check, era_field

ALL_ERAS = "all"  # every registered era gets its own stage-5 choice


@dataclass(frozen=True, kw_only=True)
class DecideConfig:
    """How `cellseg decide` makes its decisions.

    Attributes:
        tune_crops: "val" (the runs' tuning crops: the validation crops whose role in each run's
            validation_roles.csv is "tuning") or comma-separated training crop ids, e.g. "12,34".
        metric: the eras a stage-5 (post-processing) choice is made for, each on its own: "all" (every registered
            era) or one era; the leaderboard's metric must be among them.
        tune_metric: the era the best single model, the ensemble weights, the switches of stages 2-4 and the
            post-processing parameters are decided in.
        checkpoint: each run's checkpoint: "best", "last" or a path (recorded with its sha256).
        overlap: sliding-window overlap of the members' predictions, in [0, 1) (the product commands are told
            when they predict with another).
        device: "auto" (CUDA when available), "cpu" or "cuda": prediction, weight fitting and post-processing.
        workers: processes scoring (crop, label) pairs and tuning the instance classes (null: the CPU cores this
            process may use, at most 32).
        predict_jobs: processes predicting the members at once ("auto": on CUDA up to 4 per GPU, one per 16 GiB
            of GPU memory; on CPU 1), or a number ≥ 1.
        reuse: prediction stores of the runs written by `cellseg predict` (no TTA or 8 transforms) to read instead
            of predicting again, where they hold every tuning crop from the same checkpoint and settings.
    """

    tune_crops: str | int = "val"
    metric: str = ALL_ERAS
    tune_metric: str = era_field()
    checkpoint: str = "best"
    overlap: float = 0.5
    device: Literal["auto", "cpu", "cuda"] = "auto"
    workers: int | None = None
    predict_jobs: int | str = "auto"
    reuse: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check(0 <= self.overlap < 1, f"decide.overlap={self.overlap} (--overlap): must be in [0, 1)")
        _check(self.device in ("auto", "cpu", "cuda"),
               f"decide.device={self.device!r} (--device): choose 'auto', 'cpu' or 'cuda'")
        _check(self.workers is None or self.workers >= 1, f"decide.workers={self.workers} (--workers): must be ≥ 1")
        _check(self.predict_jobs == "auto" or (isinstance(self.predict_jobs, int)
                                               and not isinstance(self.predict_jobs, bool) and self.predict_jobs >= 1),
               f"decide.predict_jobs={self.predict_jobs!r} (--predict-jobs): 'auto' or a number of processes ≥ 1")
        _check(str(self.tune_crops) != "same", "decide.tune_crops=same: `cellseg decide` scores only its tuning "
               "crops; give 'val' or training crop ids")
