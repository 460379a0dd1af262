"""The report: OUT.md's tables (the synthetic crops, the measured stages, the projection) and its notes, and
OUT.json + OUT.md written atomically."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.studies.test_set.layout import (
    DOWNSTREAM,
    GOAL_MINUTES,
    POLICIES,
    PROBE_LABELS,
    PROBE_VOXEL_NM,
    STEADY_BOX,
    TTA,
)
from cellseg.synth.presets import CLASS_SETS


def fmt_vox(n: float) -> str:
    """Voxels with a unit prefix: 1.2 G, 35 M, 800 k."""
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f}"


def fmt_bytes(n: float | None) -> str:
    """Bytes in decimal units (GB, TB)."""
    if n is None:
        return "-"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_vs(vs: Sequence[float]) -> str:
    """`1.74×2×2`."""
    return "×".join(f"{v:g}" for v in vs)


def layout_table(report: Mapping[str, Any]) -> list[str]:
    """The synthetic test crops next to the real ones, with model-resolution voxels."""
    syn = report["synthetic"]
    lines = ["| synthetic crop | real crop | dataset | real voxel nm | synthetic voxel nm | real shape | synthetic "
             "shape | labels (real / synthetic) | synthetic vox at 8 nm | real vox at 8 nm | real vox at max(8 nm, "
             "crop) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in syn["crops"]:
        lines.append(f"| {c['synthetic_id']} | {c['real_id']} | {c['dataset']} | {fmt_vs(c['real_voxel_size_nm'])} | "
                     f"{fmt_vs(c['voxel_size_nm'])} | {fmt_vs(c['real_shape_vox'])} | {fmt_vs(c['shape_vox'])} | "
                     f"{c['real_classes']} / {len(CLASS_SETS[c['classes']])} | {fmt_vox(c['model_voxels'])} | "
                     f"{fmt_vox(c['real_model_voxels']['8nm'])} | {fmt_vox(c['real_model_voxels']['max8'])} |")
    lines.append(f"| **all {len(syn['crops'])}** | | | | | | | | **{fmt_vox(syn['model_voxels'])}** | "
                 f"**{fmt_vox(syn['real_model_voxels']['8nm'])}** | **{fmt_vox(syn['real_model_voxels']['max8'])}** |")
    return lines


def measured_row(label: str, r: Mapping[str, Any], key: str = "voxels") -> str:
    """One stage: status, seconds, voxels (`key`), Mvox/s and output size; or its status and error."""
    if r.get("status") != "ok":
        return f"| {label} | {r.get('status', 'not run')} {r.get('error', '')[:100]} | | | | |"
    rate = f"{r['mvox_per_s']:.3g}" if "mvox_per_s" in r else ""
    voxels = fmt_vox(r[key]) if key in r else ""
    return f"| {label} | ok | {r['seconds']:.1f} | {voxels} | {rate} | {fmt_bytes(r.get('bytes'))} |"


def warm_note(r: Mapping[str, Any]) -> str:
    """How warm the compile cache was for a predict-ensemble warm-up."""
    if "previous_job_seconds" not in r:
        return ""
    return f" with the compile cache of a previous job (that job: {r['previous_job_seconds']:.1f} s, cold)"


def measured_table(report: Mapping[str, Any]) -> list[str]:
    """Seconds, rate and output size of every stage measured so far."""
    st = report["stages"]
    lines = ["| stage | status | seconds | voxels | Mvox/s | output |", "|---|---|---|---|---|---|",
             measured_row(f"synthetic data ({report['args']['workers']} workers; EM voxels)", st["generate"],
                          "em_voxels")]
    lines += [measured_row(f"build run {name}", r) for name, r in st.get("build_runs", {}).items()]
    for name, r in st.get("predict", {}).items():
        detail = ""
        if r.get("status") == "ok":
            probe = r["steady"]
            detail = (f" (TTA {r['tta']}; load {r['load_seconds']:.1f} s, warm-up incl. compile "
                      f"{r.get('warmup_seconds', 0.0):.1f} s, compute {r['compute_seconds']:.1f} s, {r['tiles']} tiles, "
                      f"{r['tiles_per_s']:.3g} tiles/s; steady state {1 / probe['seconds_per_tile']:.3g} tiles/s with "
                      f"{probe['channels']} channels, batch {probe['batch_size']}"
                      f"{' × TTA fold ' + str(probe['tta_fold']) if probe.get('tta_fold', 1) > 1 else ''}"
                      f"{', compiled' if probe['compiled'] else ''})")
        lines.append(measured_row(f"predict {name}{detail}", r))
    if "predict_ensemble" in st:
        r = st["predict_ensemble"]
        detail = (f" ({len(r['members'])} members, TTA {r['tta']}; load {r['load_seconds']:.1f} s, warm-up incl. "
                  f"compile {r.get('warmup_seconds', 0.0):.1f} s{warm_note(r)}, compute {r['compute_seconds']:.1f} s, {r['tiles']} "
                  f"tiles; write probe {r['write_seconds']:.2f} s)") if r.get("status") == "ok" else ""
        lines.append(measured_row(f"predict-ensemble{detail}", r))
    for stage in DOWNSTREAM:
        if stage not in st and "predict_ensemble" in st:
            continue
        r = st.get(stage, {})
        key = "voxels" if stage in ("ensemble", "postprocess") else "submitted_voxels"
        where = f" ({r['device']})" if "device" in r else ""
        lines.append(measured_row(stage + where + ("" if key == "voxels" else " (submitted voxels)"), r, key))
    return lines


def projection_table(report: Mapping[str, Any]) -> list[str]:
    """Projected minutes (and output sizes) per stage on the real test crops, for both policies."""
    proj = report["projection"]
    lines = ["| stage | " + " | ".join(f"minutes ({p}) | output ({p})" for p in POLICIES) + " |",
             "|---|" + "---|---|" * len(POLICIES)]

    def row(label: str, get: Callable[[Mapping[str, Any]], Mapping[str, Any] | None]) -> None:
        cells = []
        for p in POLICIES:
            r = get(proj[p]["stages"])
            cells.append(f"{r['seconds'] / 60:,.1f} | {fmt_bytes(r.get('bytes'))}" if r else "- | -")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    for name in report["stages"].get("predict", {}):
        row(f"predict {name}", lambda s, n=name: s["predict"].get(n))
    fused = report["stages"].get("predict_ensemble", {})
    for name in fused.get("members", {}):
        row(f"predict-ensemble: {name} tiles", lambda s, n=name: (s.get("predict_ensemble") or {}).get("members", {}).get(n))
    if fused:
        row("predict-ensemble: ensemble written once", lambda s: {"seconds": s["predict_ensemble"]["write_seconds"]}
            if "predict_ensemble" in s else None)
    label = "predict-ensemble, load + compile + all members + write" if fused else "predict, all models"
    lines.append(f"| **{label}** | " + " | ".join(f"**{proj[p]['predict_minutes']:,.1f}** | " for p in POLICIES) + " |")
    for stage in DOWNSTREAM:
        if fused and stage == "ensemble":
            continue
        row(stage, lambda s, st=stage: s.get(st))
    cells = []
    for p in POLICIES:
        total = proj[p]["total_minutes"]
        verdict = "" if proj[p]["complete"] else ", incomplete: stages missing"
        cells.append(f"**{total:,.1f}** ({total / GOAL_MINUTES:.2g}× the {GOAL_MINUTES:g}-minute goal{verdict}) | ")
    lines.append("| **total** | " + " | ".join(cells) + " |")
    return lines


def markdown(report: Mapping[str, Any]) -> str:
    """OUT.md: environment, the three tables and the assumptions."""
    env, syn = report["environment"], report["synthetic"]
    lines = [f"# Test-set ensemble: {len(report['stages'].get('predict', {}))} models × TTA {TTA}, synthetic test "
             f"set at 1/{report['args']['scale']:g} of the real crop shapes",
             "",
             f"{env['device']}, torch {env['torch']}, cellseg {env['cellseg']} ({env['git_commit'][:10]}), "
             f"{env['date']}; cuDNN autotuning on while predicting (as `cellseg predict`).",
             "",
             f"Model-resolution voxels: the synthetic test set has **{fmt_vox(syn['model_voxels'])}** at 8 nm; the "
             f"real one **{fmt_vox(syn['real_model_voxels']['8nm'])}** at 8 nm and "
             f"**{fmt_vox(syn['real_model_voxels']['max8'])}** at max(8 nm, the crop's voxel size).",
             "", "## Synthetic test crops (mirroring the 2026 test manifest)", "", *layout_table(report), "",
             "## Measured", "", *measured_table(report), "",
             "## Projected to the real 16 test crops", "", *projection_table(report), "",
             "Policies: " + "; ".join(f"**{p}**: {d}" for p, d in POLICIES.items()) + ".", "",
             *[f"- {note}" for note in report["notes"]]]
    if report["stages"].get("predict_ensemble"):
        lines.append("- Predict-ensemble (`cellseg predict-ensemble`, no member stores, no `cellseg ensemble`): its "
                     "model loads and warm-up (every member compiled on the smallest crop) + each member's tiles × "
                     "that member's engine seconds per tile (`--steady`: bench/forward_probe.py, TTA 8 folded, "
                     "overlap 0.25, one model per process on the GPU) + the ensemble's channel-voxels written "
                     "once × the write probe's cost (the largest synthetic crop's ensemble values repeated to "
                     f"{STEADY_BOX[0]}³). Members' tiles are counted as `cellseg predict` cuts each crop; on an "
                     "H200 the fused run cuts the 1000³ crops into the same single column.")
    rates = report.get("rates")
    if rates:
        ensembled = f"ensemble {rates['ensemble_seconds']:.1f} s, " if "ensemble_seconds" in rates else ""
        lines.append(f"- Ensemble and post-processing are projected with the costs per channel-voxel of "
                     f"`bench/ensemble_steady.py` ({rates['members']} member(s) × {len(rates['channels'])} channels × "
                     f"{rates['shape_vox'][0]}³: {ensembled}post-processing ({rates['device']}) "
                     f"{rates['postprocess_seconds']:.1f} s, {rates['date']}); their costs per crop are this run's.")
        if "submit_seconds_per_submitted_voxel" in rates:
            lines.append(f"- Submit and validate are projected with the costs per submitted voxel of the same run: its "
                         f"segmentation submitted on a {rates['submit_voxel_size_nm']:g} nm grid "
                         f"({rates['submitted_arrays']} arrays, {rates['submitted_voxels'] / 1e9:.2f} G voxels: "
                         f"submit {rates['submit_seconds']:.1f} s, validate with data checks "
                         f"{rates['validate_seconds']:.1f} s); their costs per array are this run's.")
    return "\n".join(lines) + "\n"


NOTES = (
    "Random weights: throughput does not depend on the weight values, but post-processing time, output sizes "
    "and compression times do (random models give near-constant probabilities: they compress well and give "
    "few objects).",
    "Predict, per model: model load + the warm-up predict of the smallest crop (torch.compile and cuDNN "
    "autotuning) + tiles × seconds per tile in the steady state (one large box: 256³ for 3D models, 32 × 512² "
    "for 2D, TTA 8 folded as `cellseg predict` does, the run's batch, the channels of the largest crops) + channel-voxels × the measured store "
    "write cost. Tiles are counted per column as `predict_run` cuts each real crop for its scored channels, "
    "context included. The JSON's `seconds_at_synthetic_rate` prices the same tiles at the rate measured on the "
    "synthetic crops (mostly context and part-filled batches).",
    "Other stages: a cost per item that does not grow with voxels plus a cost per voxel. Ensemble: per crop from "
    "the smallest crop ensembled alone, the rest of its time per channel-voxel (model-resolution voxels × the "
    "crop's scored channels). Post-processing: both fitted to the seconds it records per crop (per channel-voxel). Submission and validation: per array from the smallest crop "
    "alone, per submitted voxel (each label's crop grid) from a probe, the largest crop resubmitted on a "
    f"{PROBE_VOXEL_NM:g} nm grid with up to {PROBE_LABELS} of its labels, instance and semantic alternating.",
    "Every stage is assumed to keep its measured rates at any crop size (streaming block by block: a 32 nm crop "
    "of 1000³ voxels is 4000³ = 64 G voxels × 58 channels at 8 nm).",
    "Synthetic voxel sizes: each dataset's EM s0 is its finest real crop's voxel size; coarser crops sit at "
    "s0 × 1, 2 or 4 (the generator's steps), so real 8× steps (e.g. 4 → 32 nm) are 4× in the synthetic set.",
    "Not included: synthetic data, building the runs, and the extra timings of the cost models (smallest crop "
    "alone, probes).",
)


def write_report(report: Mapping[str, Any], out: Path) -> None:
    """OUT.json and OUT.md, each written to a temporary sibling and renamed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".json", json.dumps(report, indent=1, default=str)), (".md", markdown(report))):
        path = out.with_name(out.name + suffix)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
