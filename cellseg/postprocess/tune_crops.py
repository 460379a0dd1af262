"""Which crops post-processing parameters are tuned on (`cellseg.postprocess.tune`): the named training
crops, or by default every crop of the store with truth in the data root except the *report* crops of the
runs the store was predicted by (`validation_roles.csv` beside their datasplit.csv), which are kept for
measuring decisions, never for making them; every class tuned must be annotated in one of them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cellseg.data.crops import Catalog, crop_name, crop_sort_key
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.split import ROLES_FILE, SplitEntry, derivable, read_roles

log = logging.getLogger(__name__)


def split_entry(catalog: Catalog, crop_id: int) -> SplitEntry:
    """The training crop `crop_id` of a catalogue as a validation entry (EM and label locations resolved)."""
    crop = catalog.train[crop_id]
    return SplitEntry(split="validate", em_url=str(catalog.locate(crop.em_url)), crop_url=str(catalog.locate(crop.crop_url)),
                      classes=crop.classes)


def store_runs(provenance: Mapping[str, Any]) -> list[Path]:
    """The run directories a store's provenance names (its own, or its ensemble members'), in order."""
    found: list[Path] = []
    stack: list[Any] = [provenance]
    while stack:
        item = stack.pop(0)
        if isinstance(item, Mapping):
            if isinstance(item.get("run_dir"), str):
                found.append(Path(item["run_dir"]))
            stack += list(item.values())
        elif isinstance(item, list):
            stack += item
    return list(dict.fromkeys(found))


def report_crops(store: PredictionStore) -> dict[str, str]:
    """Crop → the run that keeps it for reports, over the runs the store was predicted by."""
    out: dict[str, str] = {}
    for run in store_runs(store.provenance):
        roles = read_roles(run / ROLES_FILE)
        out.update({c: str(run) for c, role in roles.items() if role == "report" and c not in out})
    return out


def find_crops(data_root: str | Path, crops: Sequence[str] | None, store: PredictionStore) -> list[SplitEntry]:
    """Training crops of `data_root` to tune on: the named ones (`12` or `crop12`), by default every crop of
    the store that has truth in the data root and is not a report crop of the store's runs.

    Raises:
        ValueError: a named crop that is not a training crop of the data root or not in the store; no crop
            left by default.
    """
    catalog = Catalog.from_dir(data_root)
    by_name = {c.name: c for c in catalog.train.values()}
    written = set(store.completed())
    if crops:
        names = [crop_name(c) for c in crops]
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ValueError(f"{data_root}: {unknown} are not training crops with truth (known: "
                             f"{sorted(by_name, key=crop_sort_key)[:20]}...)")
        missing = [n for n in names if n not in written]
        if missing:
            raise ValueError(f"{store.path}: crops {missing} are not in the prediction store (it holds {sorted(written)})")
    else:
        kept = report_crops(store)
        names = sorted(written & set(by_name) - set(kept), key=crop_sort_key)
        if kept.keys() & written:
            log.info("not tuned on (report crops of %s): %s", ", ".join(sorted(set(kept.values()))),
                     ", ".join(sorted(kept.keys() & written, key=crop_sort_key)))
        if not names:
            raise ValueError(f"{store.path}: none of its crops {sorted(written)} has truth in {data_root} outside the "
                             f"report crops of its runs {sorted(kept)}; pass --crops IDS")
    return [split_entry(catalog, by_name[n].id) for n in names]


def check_annotated(classes: Sequence[str], entries: Sequence[SplitEntry]) -> None:
    """Every class to tune must be annotated (listed, or derivable from its atoms) in a tuning crop.

    Raises:
        ValueError: naming the classes no tuning crop annotates and the crops.
    """
    lacking = [c for c in classes if not any(derivable(c, e.classes) for e in entries)]
    if lacking:
        raise ValueError(f"no tuning crop annotates {lacking} (tuning crops: {[e.crop_name for e in entries]}): "
                         "pass --crops with crops that annotate every class of the store")
