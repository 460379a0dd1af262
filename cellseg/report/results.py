"""The report's data: its options (`ReportOptions`) and everything it computed (`Report`).
`cellseg.report.ablation` fills them in; `cellseg.report.render` and `cellseg.report.figures` read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cellseg.decide.inputs import CropPlan, RunInfo
from cellseg.decide.options import DecideOptions, StageResult


@dataclass(frozen=True, kw_only=True)
class ReportOptions(DecideOptions):
    """What `cellseg report` does (its command-line options): how the decisions are made (`DecideOptions`) and
    what is scored.

    Attributes:
        crops: scored crops: "val" (the runs' report crops), "test" or ids.
        slices: crops drawn as slice overlays.
        decisions: a decisions.json (`cellseg decide`) to score instead of deciding: the stages are what it
            says, predicted on the scored crops alone.
    """

    crops: str = "val"
    slices: int = 2
    decisions: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.slices < 0:
            raise ValueError(f"--slices {self.slices}: must be ≥ 0")


@dataclass(kw_only=True)
class Report:
    """Everything a report computed (rendered by `cellseg.report.render`)."""

    options: ReportOptions
    runs: list[RunInfo]
    data_root: Path
    plan: CropPlan
    truth: dict[str, list[str]]
    singles: list[StageResult]
    best_single: dict[str, str]  # era → run name
    # era → how it was chosen on the tuning crops: {"index", "run", "ranked_by", "scores": run → decision score}
    best_single_choice: dict[str, dict[str, Any]] = field(default_factory=dict)
    stages: list[StageResult]
    timings: list[dict[str, Any]] = field(default_factory=list)
    weights: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)
    # era → {"stages" | "singles": intervals} (`cellseg.decide.bootstrap.uncertainties`)
    uncertainty: dict[str, dict[str, Any]] = field(default_factory=dict)
    # "era"; "uniform" | "tta" | "postprocess" → {"off": classes, "classes": class → {"before", "after", "on"}}
    # ("uniform" also "best_single": the run it is compared with; `cellseg.decide.switches`)
    switches: dict[str, Any] = field(default_factory=dict)
