"""GPU time from recorded inference rates: what `--dry-run` turns a plan into hours with.

The rates are those of the inference benchmark (`bench/results/inference_h200.json`: one H200, each
architecture's default preset, a 256³ volume of 8 nm, bf16, compiled, Gaussian blending), copied into
`recorded_rates.json` beside this module by `python -m cellseg.docgen` and checked against the record by the
suite, so that an installed cellseg has them. A rate is Mvoxels per second of the box with its context (half a
patch on every side a tile spans, as `cellseg predict` reads it), at a TTA (1 or 8) and overlap the record
measured; a job at other settings, or of an architecture the record lacks, gets no estimate rather than a guess.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

PACKAGED = Path(__file__).with_name("recorded_rates.json")
RECORD = Path(__file__).resolve().parents[2] / "bench" / "results" / "inference_h200.json"  # in a source checkout
SETTINGS = ("ours tta1 compiled", "ours tta8 compiled")  # the record's rows the estimate uses


def from_record(record: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The packaged table of an inference benchmark record: per architecture, [TTA, overlap, Mvox/s] rows (one
    line per architecture in the file)."""
    rates: dict[str, list[list[float]]] = {}
    for row in record["rows"]:
        if row.get("setting") in SETTINGS and "processed_mvox_per_s" in row:
            rates.setdefault(row["model"], []).append(
                [int(row["tta"]), float(row["overlap"]), round(float(row["processed_mvox_per_s"]), 3)])
    return {"source": source, "device": record["device"], "date": record["date"][:10], "torch": record["torch"],
            "rates": {model: sorted(rows) for model, rows in sorted(rates.items())}}


def render() -> str | None:
    """`recorded_rates.json` as the record gives it (None outside a source checkout)."""
    if not RECORD.is_file():
        return None
    table = from_record(json.loads(RECORD.read_text()), f"bench/results/{RECORD.name}")
    head = {k: v for k, v in table.items() if k != "rates"}
    lines = [f' "{k}": {json.dumps(v)},' for k, v in head.items()]
    rows = [f'  "{model}": {json.dumps(r)}' for model, r in table["rates"].items()]
    return "{\n" + "\n".join(lines) + '\n "rates": {\n' + ",\n".join(rows) + "\n }\n}\n"


@cache
def packaged() -> dict[str, Any]:
    """The packaged table."""
    return json.loads(PACKAGED.read_text())


def rate(model: str, tta: int, overlap: float) -> float | None:
    """Mvox/s (box with context) of `model` at `tta` and `overlap` on the record's GPU; None when not measured."""
    for t, o, mvox in packaged()["rates"].get(model, []):
        if t == tta and math.isclose(o, overlap):
            return float(mvox)
    return None


def gpu_seconds(model: str, context_shapes: Sequence[Sequence[int]], *, tta: int, overlap: float) -> float | None:
    """Seconds on the record's GPU to predict boxes of `context_shapes` (voxels, context included) with one
    model; None without a recorded rate for these settings."""
    mvox = rate(model, tta, overlap)
    if mvox is None:
        return None
    return sum(math.prod(s) for s in context_shapes) / (mvox * 1e6)


def duration(seconds: float) -> str:
    """Seconds as a person reads a plan: s below 2 minutes, min below 2 hours, then h."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


@dataclass
class GpuTime:
    """A plan's GPU time, summed over its runs; the runs without a recorded rate named instead."""

    total_s: float = 0.0
    unknown: list[str] = field(default_factory=list)

    def add(self, name: str, seconds: float | None) -> str:
        """Count one run's seconds (None: no recorded rate) and say its estimate."""
        if seconds is None:
            self.unknown.append(name)
            return "no recorded rate"
        self.total_s += seconds
        return f"≈ {duration(seconds)} on one {packaged()['device']}"

    def missing(self) -> str:
        """The line for a plan with runs of no recorded rate."""
        return (f"GPU time: no estimate for {', '.join(self.unknown)}: the record ({packaged()['source']}) has each "
                "architecture's default preset at TTA 1 and 8, overlap 0.5")
