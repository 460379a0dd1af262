"""The peer's scores as markdown: one table of arms × decodings × eras, the records of each step (budget, plan,
times), and a per-class table of the tuned decoding in the tuning era."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bench.peers.nnunet.scoring import DECODINGS
from cellseg.config.fields import DEFAULT_ERA


def _num(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4f}"


def _with_interval(entry: Mapping[str, Any]) -> str:
    low, high = entry["interval"]
    return f"{_num(entry['overall'])} [{_num(low)}, {_num(high)}]"


def _change(entry: Mapping[str, Any]) -> str:
    vs = entry.get("vs_first")
    if not vs:
        return "–"
    low, high = vs["interval"]
    rel = "" if vs["relative"] is None else f" ({100 * vs['relative']:+.1f} %)"
    noise = ", within noise" if vs["within_noise"] else ""
    return f"{vs['change']:+.4f}{rel} [{_num(low)}, {_num(high)}]{noise}"


def _rows(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def _starts(train: Mapping[str, Any], clock: Mapping[str, Any]) -> str:
    """", in N starts (first iterations a, b s uncharged)" for a training stopped and resumed."""
    starts = int(train.get("starts", 1))
    if starts <= 1:
        return ""
    firsts = ", ".join(f"{v:.1f}" for v in clock.get("first_iterations_s", []))
    return f", in {starts} starts (stopped at a job's time limit and resumed; first iterations {firsts} s uncharged)"


def _records(records: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = []
    train = records.get("nnunet_train")
    if train:
        plan, clock = train["plan"], train["clock"]
        lines.append(f"- nnU-Net {train['nnunetv2']} `3d_fullres` plan: spacing {plan['spacing_nm']} nm, patch "
                     f"{plan['patch_size_vox']}, batch {plan['batch_size']}; planned and preprocessed in "
                     f"{train['preprocess_s']:.0f} s.")
        lines.append(f"- nnU-Net training: {clock['charged_s']:.0f} s charged of a {train['budget_min']:g}-minute "
                     f"budget ({clock['iterations'] / clock['iterations_per_epoch']:.2f} epochs of "
                     f"{clock['iterations_per_epoch']}, {clock['iterations']} iterations, median epoch "
                     f"{clock['median_epoch_s']:.1f} s of training; first iteration {clock['first_iteration_s']:.1f} s "
                     f"uncharged), {train['train_wall_s']:.0f} s wall with start-up and validation, on {train['device']}"
                     f"{'' if train['compile'] else ' (eager)'}{_starts(train, clock)}.")
    predict = records.get("nnunet_predict")
    if predict:
        lines.append(f"- nnU-Net prediction of {predict['cases']} cases (mirroring): {predict['predict_s']:.0f} s; "
                     f"into cellseg stores: {predict['store_s']:.0f} s.")
    data = records.get("nnunet_data")
    if data and data.get("kept_share") is not None:
        lines.append(f"- Supervision: {100 * data['kept_share']:.1f} % of the (class, voxel) pairs cellseg's loss "
                     "sees are labelled for nnU-Net (the rest fall under its single ignore label).")
    if data and data.get("crop_share_of_cases") is not None:
        lines.append(f"- Context: the annotated crops are {100 * data['crop_share_of_cases']:.1f} % of the voxels of "
                     "nnU-Net's training cases (each crop with its EM context); a patch drawn from a case is "
                     "labelled only where it overlaps the crop, so nnU-Net sees fewer labelled voxels per patch "
                     "than cellseg, whose patches are drawn to overlap the crops.")
    for name, rec in records.items():
        if name.startswith("cellseg_"):
            lines.append(f"- {name.removeprefix('cellseg_')}: trained {rec['budget_min']:g} minutes "
                         f"({rec['train_wall_s']:.0f} s wall), predicted in {rec['predict_s']:.0f} s.")
    return lines


def markdown(doc: Mapping[str, Any], records: Mapping[str, Mapping[str, Any]]) -> str:
    """The scores document of `score_arms` (and the step records) as markdown."""
    arms, eras = list(doc["scores"]), doc["eras"]
    header = ["arm", "decoding", *(f"{era} [95 % CI]" for era in eras), *(f"{era} vs {arms[0]}" for era in eras)]
    rows = []
    for arm in arms:
        for decoding in DECODINGS:
            by_era = doc["scores"][arm][decoding]
            rows.append([arm, decoding, *(_with_interval(by_era[e]) for e in eras), *(_change(by_era[e]) for e in eras)])
    tuned_for = f"for {doc['tune_era']}" if "tune_era" in doc else "for each era on its own"  # older records: one
    lines = [f"Test crops: {len(doc['crops'])}; classes: {len(doc['classes'])}; the tuned decoding tuned {tuned_for}, "
             "on each arm's own tuning-crop predictions.", "", *_rows(header, rows), "",
             *_records(records), ""]
    classes, era = doc["classes"], DEFAULT_ERA if DEFAULT_ERA in eras else eras[-1]
    tuned = {arm: doc["scores"][arm]["tuned"][era]["classes"] for arm in arms}
    lines += [f"Per class, tuned decoding, {era}:", "",
              *_rows(["class", *arms], [[c, *(_num(tuned[a].get(c)) for a in arms)] for c in classes]), ""]
    return "\n".join(lines)
