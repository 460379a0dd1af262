"""Pooling per crop voxel size with crop-bootstrap intervals, paired changes, and the markdown tables.

Bands: each crop's labels' voxel size (z×y×x nm), "finer than the model" (every axis at most the model's voxel
size, one finer: where decoding on the annotation grid can change anything) and "all". Each row's per-crop
scores are pooled per band and era with the era's official rule (`cellseg.eval.crop_score.combine`); the 95 %
intervals resample the band's crops (`cellseg.decide.bootstrap`: the same draws for every row of a band, so
a change between two rows is bootstrapped paired). A band of one crop has point intervals: no noise estimate.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from bench.studies.native_grids.pipeline import ERAS

PARTS = {"overall": "overall_score", "semantic": "overall_semantic_score", "instance": "overall_instance_score"}
FINER = "finer than the model"
ALL = "all"


def _size(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split("×"))


def band_of(scores: Mapping[str, Any]) -> str:
    """A crop's voxel-size band: its labels' voxel size (z×y×x nm; "mixed" when they differ)."""
    sizes = {"×".join(f"{float(v):g}" for v in s["voxel_size"]) for s in scores.values()}
    return sizes.pop() if len(sizes) == 1 else "mixed"


def bands_of(crop_scores: Mapping[str, Any], model_voxel_nm: Sequence[float]) -> dict[str, list[str]]:
    """Band → its crops (sorted): each voxel size, the crops finer than the model's voxel size, all."""
    bands: dict[str, list[str]] = defaultdict(list)
    for crop, labels in crop_scores.items():
        bands[band_of(labels)].append(crop)
    out = {band: sorted(crops) for band, crops in sorted(bands.items(), key=lambda kv: _sort_key(kv[0]))}
    finer = [c for band, crops in out.items() if band != "mixed" and _finer(_size(band), model_voxel_nm)
             for c in crops]
    if finer:
        out[FINER] = sorted(finer)
    out[ALL] = sorted(crop_scores)
    return out


def _sort_key(band: str) -> tuple[float, ...]:
    return (math.inf,) if band == "mixed" else tuple(reversed(_size(band)))


def _finer(size: Sequence[float], model: Sequence[float]) -> bool:
    return all(s <= m for s, m in zip(size, model, strict=True)) and any(
        s < m for s, m in zip(size, model, strict=True))


def _nan_to_none(value: Any) -> Any:
    """NaN → None (JSON), other floats rounded to 6 decimals (far below any interval's width)."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 6)
    return value


def pool_section(rows: Mapping[str, Mapping[str, Any]], roles: Mapping[str, str], model_voxel_nm: Sequence[float],
                 changes: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    """Every row pooled per band and era with its intervals, and every change (`name → (from, to)`) paired.

    `rows`: row → era → crop → label → scores (the evaluator's per-crop scores); every row scores the same crops.
    """
    from cellseg.decide.bootstrap import DRAWS, LEVEL, SEED, draws, interval, part_draws, within_noise
    from cellseg.eval.crop_score import combine
    from cellseg.eval.eras import get_era

    first = next(iter(rows.values()))["2026"]
    bands = bands_of(first, model_voxel_nm)
    out: dict[str, Any] = {"bands": {b: {"crops": c, "roles": {x: roles.get(x, "") for x in c}}
                                     for b, c in bands.items()},
                           "bootstrap": {"draws": DRAWS, "seed": SEED, "level": LEVEL, "resampled": "crops"},
                           "rows": {r: {} for r in rows},
                           "changes": {n: {"from": a, "to": b, "bands": {}} for n, (a, b) in changes.items()}}
    for band, crops in bands.items():
        picks = draws(crops)
        for era in ERAS:
            samples = {}
            for row, scores in rows.items():
                sub = {c: scores[era][c] for c in crops}
                pooled = combine(sub, era)
                samples[row] = part_draws(sub, era, crops, picks)
                out["rows"][row].setdefault(band, {})[era] = {
                    **{part: _nan_to_none(float(pooled[key])) for part, key in PARTS.items()},
                    "interval": {p: [_nan_to_none(v) for v in interval(samples[row][p]).to_json()] for p in PARTS},
                    "skipped": len(get_era(era).skipped(sub)),
                    **({"classes": {name: _nan_to_none(float(s.get("combined_score", s.get("iou"))))
                                    for name, s in pooled["label_scores"].items()}} if band in (FINER, ALL) else {})}
            for name, (a, b) in changes.items():
                entry = {}
                for part in PARTS:
                    before, after = out["rows"][a][band][era][part], out["rows"][b][band][era][part]
                    ci = interval(samples[b][part] - samples[a][part])
                    entry[part] = {"change": None if before is None or after is None else round(after - before, 6),
                                   "interval": [_nan_to_none(v) for v in ci.to_json()],
                                   "within_noise": within_noise(ci)}
                out["changes"][name]["bands"].setdefault(band, {})[era] = entry
    return out


# ------------------------------------------------------------------------------------------------ markdown
def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.4f}" if signed else f"{value:.4f}"


def _ci(bounds: Sequence[float | None], signed: bool = False) -> str:
    low, high = bounds
    return "[—]" if low is None or high is None else f"[{_fmt(low, signed)}, {_fmt(high, signed)}]"


def _change_cell(entry: Mapping[str, Any], crops: int) -> str:
    verdict = "" if crops < 2 else (" (noise)" if entry["within_noise"] else " **")
    return f"{_fmt(entry['change'], True)} {_ci(entry['interval'], True)}{verdict}"


def change_table(section: Mapping[str, Any], name: str, before: str, after: str) -> list[str]:
    """One change as a table: per band and era, the overall scores with intervals, and the paired changes."""
    change = section["changes"][name]
    lines = [f"| crop voxel size (nm) | crops | era | overall: {before} | overall: {after} | Δ overall [95 % CI] "
             "| Δ semantic | Δ instance |", "|---|---|---|---|---|---|---|---|"]
    for band, info in section["bands"].items():
        crops = len(info["crops"])
        for era in ERAS:
            a = section["rows"][change["from"]][band][era]
            b = section["rows"][change["to"]][band][era]
            d = change["bands"][band][era]
            lines.append(f"| {band} | {crops} | {era} | {_fmt(a['overall'])} {_ci(a['interval']['overall'])} | "
                         f"{_fmt(b['overall'])} {_ci(b['interval']['overall'])} | "
                         + " | ".join(_change_cell(d[p], crops) for p in PARTS) + " |")
    return lines


def class_table(section: Mapping[str, Any], rows: Sequence[str]) -> list[str]:
    """Per class scores of `rows` (2026, all crops; IoU for semantic classes, combined score for instance ones)."""
    lines = ["| class | " + " | ".join(rows) + " |", "|---" * (len(rows) + 1) + "|"]
    everything = {r: section["rows"][r][ALL]["2026"]["classes"] for r in rows}
    for name in sorted(everything[rows[0]]):
        lines.append(f"| {name} | " + " | ".join(_fmt(everything[r].get(name)) for r in rows) + " |")
    return lines


def crops_line(section: Mapping[str, Any]) -> str:
    """The scored crops with their roles and bands."""
    info = section["bands"][ALL]["roles"]
    parts = [f"{c} ({role}, {band})" for band, b in section["bands"].items() if band not in (ALL, FINER)
             for c, role in b["roles"].items()]
    return f"Scored crops ({len(info)}): " + ", ".join(parts) + "."


def seed_table(per_seed: Mapping[str, Any], name: str = "decisions") -> list[str]:
    """One change per seed, for the crops finer than the model and all crops."""
    lines = ["| seed | crops | era | band | overall: before → after | Δ overall [95 % CI] | Δ semantic | Δ instance |",
             "|---|---|---|---|---|---|---|---|"]
    for seed, section in per_seed.items():
        change = section["changes"][name]
        for band in (FINER, ALL):
            if band not in section["bands"]:
                continue
            crops = len(section["bands"][band]["crops"])
            for era in ERAS:
                a = section["rows"][change["from"]][band][era]["overall"]
                b = section["rows"][change["to"]][band][era]["overall"]
                d = change["bands"][band][era]
                lines.append(f"| {seed} | {crops} | {era} | {band} | {_fmt(a)} → {_fmt(b)} | "
                             + " | ".join(_change_cell(d[p], crops) for p in PARTS) + " |")
    return lines
