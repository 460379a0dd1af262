"""Time-to-score curves: each run's validation scores against minutes of its training clock, whether each curve
is learning and has plateaued, and one figure of all of them.

A run's `metrics.jsonl` (`cellseg.train.run_log`) holds validation records `{"step", "time", "train_min", "job_min",
"val": {...}}`; a resumed run may log a step again after its last checkpoint, and the later record wins.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PLATEAU_TOLERANCE = 0.03  # "plateaued": the last two validations within 3 % of the larger of the two
# "learning": the best validation after the first is at least 10 % above the first. A curve that never leaves its
# first score is flat because nothing was learned, not because learning converged: the plateau test alone calls
# both "plateaued" (4-minute 3D runs on a shared GPU stayed within ±10 % of their first score).
LEARNING_RISE = 0.10


@dataclass(frozen=True, kw_only=True)
class Curve:
    """One run's validation scores over its training clock.

    Attributes:
        arch: the architecture.
        era: the validation metric's era.
        points: per validation: step, train_min (training clock), job_min (wall minutes since that job began),
            overall, instance, semantic.
            val_s: the validation's wall seconds (the training clock pauses for it).
        steps: optimizer steps trained; samples_per_s: median logged training throughput.
        data_wait_frac: median share of the training loop's time spent waiting for the loader's next batch
            (NaN for runs logged without it).
        data_placement: where the training batches came from (meta.json's `resident_data`: "gpu" or "host" for
            resident data, "off" for streaming from zarr; "" when not recorded).
        startup: where the time before the first optimizer step went (metrics.jsonl's "startup" record:
            set-up phases, first batch, first step with its lazy compilation, job and process time to it; empty
            for a run that logged none).
    """

    arch: str
    era: str
    points: list[dict[str, float]]
    steps: int
    samples_per_s: float
    data_wait_frac: float = math.nan
    data_placement: str = ""
    startup: dict[str, Any] = field(default_factory=dict)

    @property
    def plateaued(self) -> bool | None:
        """Last two validations within `PLATEAU_TOLERANCE` of each other (None with fewer than two)."""
        return plateaued([p["overall"] for p in self.points])

    @property
    def learning(self) -> bool | None:
        """The best later validation rose at least `LEARNING_RISE` above the first (None with fewer than two)."""
        return learning([p["overall"] for p in self.points])

    @property
    def state(self) -> str:
        """A few words for legends: not learning, plateaued, rising, falling (the last validation against the one
        before), or too few points."""
        if self.learning is False:
            return "not learning"
        if self.plateaued is None:
            return "too few points"
        if self.plateaued:
            return "plateaued"
        return "rising" if self.points[-1]["overall"] > self.points[-2]["overall"] else "falling"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"arch": self.arch, "era": self.era, "points": self.points, "steps": self.steps,
                "samples_per_s": self.samples_per_s, "data_wait_frac": self.data_wait_frac,
                "data_placement": self.data_placement, "plateaued": self.plateaued, "learning": self.learning,
                "startup": self.startup}


def plateaued(scores: Sequence[float], tolerance: float = PLATEAU_TOLERANCE) -> bool | None:
    """Whether the last two scores differ by at most `tolerance` of the larger one (two zeros: yes)."""
    if len(scores) < 2 or any(math.isnan(s) for s in scores[-2:]):
        return None
    a, b = scores[-2], scores[-1]
    return abs(a - b) <= tolerance * max(abs(a), abs(b))


def learning(scores: Sequence[float], rise: float = LEARNING_RISE) -> bool | None:
    """Whether the best score after the first exceeds the first by at least `rise` of it (or of 0.01, for a first
    score near 0)."""
    later = [s for s in scores[1:] if not math.isnan(s)]
    if not scores or math.isnan(scores[0]) or not later:
        return None
    return max(later) - scores[0] >= rise * max(abs(scores[0]), 0.01)


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def read_curve(run_dir: Path, arch: str) -> Curve:
    """The curve of one run directory.

    Raises:
        FileNotFoundError: no metrics.jsonl.
        ValueError: a run that never validated, or whose records carry no training clock (`train_min`).
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{arch}: {path} is missing: the run never started")
    val: dict[int, dict[str, Any]] = {}
    train: dict[int, dict[str, Any]] = {}
    startup: dict[str, Any] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            if isinstance(entry.get("val"), dict) and "overall_score" in entry["val"]:
                val[int(entry["step"])] = entry
            elif isinstance(entry.get("train"), dict):
                train[int(entry["step"])] = entry["train"]
            elif isinstance(entry.get("startup"), dict):
                startup = entry["startup"]  # a resumed run logs its own start: the last one is this process's
    if not val:
        raise ValueError(f"{arch}: {path} holds no validation: the run never validated (no curve, no best.pt)")
    if any("train_min" not in e for e in val.values()):
        raise ValueError(f"{arch}: {path} has validation records without train_min (written before the training "
                         "clock existed): train it again")
    points = [{"step": step, "train_min": e["train_min"], "job_min": e.get("job_min", math.nan),
               "overall": _number(e["val"]["overall_score"]),
               "instance": _number(e["val"].get("overall_instance_score")),
               "semantic": _number(e["val"].get("overall_semantic_score")), "val_s": _number(e["val"].get("seconds"))}
              for step, e in sorted(val.items())]
    rates = [r["samples_per_s"] for r in train.values() if isinstance(r.get("samples_per_s"), int | float)]
    waits = [r["data_wait_frac"] for r in train.values() if isinstance(r.get("data_wait_frac"), int | float)]
    eras = {str(e["val"].get("metric")) for e in val.values()}
    return Curve(arch=arch, era=eras.pop() if len(eras) == 1 else "mixed", points=points,
                 steps=max([*train, *val]), samples_per_s=statistics.median(rates) if rates else math.nan,
                 data_wait_frac=statistics.median(waits) if waits else math.nan,
                 data_placement=_placement(run_dir), startup=startup)


def _placement(run_dir: Path) -> str:
    """meta.json's `resident_data` ("" when the run wrote none or it cannot be read)."""
    try:
        return str(json.loads((run_dir / "meta.json").read_text()).get("resident_data", ""))
    except (OSError, ValueError):
        return ""


def curves_figure(curves: Sequence[Curve], *, budget_min: float) -> Any:
    """Validation score (overall, the runs' era) against training-clock minutes: one line per architecture,
    solid for 3D and dashed for 2D models, a hollow last marker where the curve has not plateaued."""
    from cellseg.viz.curves import RUN_COLORS
    from cellseg.viz.figure import new_figure

    fig = new_figure(720, 440)
    ax = fig.subplots()
    for curve, colour in zip(curves, RUN_COLORS, strict=False):
        x = [p["train_min"] for p in curve.points]
        y = [p["overall"] for p in curve.points]
        style = "--" if curve.arch.endswith("_2d") else "-"
        ax.plot(x, y, style, color=colour, marker="o", markersize=4, linewidth=1.6,
                label=f"{curve.arch} ({curve.state})")
        if curve.plateaued is False and curve.learning is not False:
            ax.plot(x[-1:], y[-1:], "o", markersize=9, markerfacecolor="none", color=colour)
    eras = {c.era for c in curves}
    ax.set_xlabel("training minutes (clock of train.time_budget_min: set-up and validation not counted)", fontsize=8)
    ax.set_ylabel(f"validation overall score ({', '.join(sorted(eras))} metric)", fontsize=8)
    ax.set_xlim(0, budget_min * 1.02)
    ax.set_ylim(bottom=-0.01)  # scores of 0 stay visible
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    ax.set_title("time to score: each architecture for the same wall-clock budget on a shared GPU", fontsize=9)
    return fig
