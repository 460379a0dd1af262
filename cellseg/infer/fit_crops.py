"""Which crops `cellseg ensemble --weights auto` fits on, and where their labels are: the members' common
*tuning* crops (validation crops of their runs' datasplit.csv whose role in `validation_roles.csv` is "tuning";
a split without roles counts every validation crop as a tuning crop) or the crops asked for, located in the
data root the members were predicted from (or `--truth`). The *report* crops are never fitted on: they are
kept for measuring what the decisions made on the tuning crops are worth."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from cellseg.data.crops import Catalog, crop_id, crop_name, crop_sort_key
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.split import ROLES_FILE, SplitEntry, read_datasplit

log = logging.getLogger(__name__)


def _root_from_run(run_dir: str) -> str | None:
    import yaml

    try:
        return yaml.safe_load((Path(run_dir) / "config.yaml").read_text())["data"]["root"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None


def resolve_data_root(stores: Sequence[PredictionStore], data_root: str | Path | None) -> Path | None:
    """The data root holding the validation labels: the given one, else the one the members record.

    Raises:
        ValueError: members recording different data roots (pass one explicitly).
    """
    if data_root is not None:
        return Path(data_root)
    roots = set()
    for store in stores:
        root = store.provenance.get("data_root") or (
            _root_from_run(store.provenance["run_dir"]) if store.provenance.get("run_dir") else None)
        if root:
            roots.add(str(root))
    if len(roots) > 1:
        raise ValueError(f"the members were predicted from different data roots {sorted(roots)}; pass --truth DATA_ROOT")
    return Path(roots.pop()) if roots else None


def _splits(stores: Sequence[PredictionStore], root: Path | None) -> dict[str, list[SplitEntry]]:
    """The members' run datasplits by file; without any, the data root's."""
    found = {}
    for store in stores:
        run_dir = store.provenance.get("run_dir")
        if run_dir and (Path(run_dir) / "datasplit.csv").is_file():
            path = Path(run_dir) / "datasplit.csv"
            found[str(path)] = read_datasplit(path, root=root)  # relative rows: under the data root
    if not found and root is not None and (root / "datasplit.csv").is_file():
        found[str(root / "datasplit.csv")] = read_datasplit(root / "datasplit.csv")
    return found


def tuning_names(path: str, entries: Sequence[SplitEntry]) -> set[str]:
    """The tuning crops of one datasplit: validation crops not set aside as report crops.

    Raises:
        ValueError: validation crops that are all report crops (nothing to make decisions on).
    """
    validation = [e for e in entries if e.split == "validate"]
    tuning = {e.crop_name for e in validation if e.role != "report"}
    if validation and not tuning:
        raise ValueError(f"{path}: no tuning crop (its validation crops {[e.crop_name for e in validation]} are all "
                         f"report crops in {ROLES_FILE}); pass --crops IDS to fit on chosen crops")
    return tuning


def _validation_names(splits: dict[str, list[SplitEntry]], available: Sequence[str]) -> list[str]:
    if not splits:
        raise ValueError("--weights auto needs validation crops: no member's provenance names a run_dir with a "
                         "datasplit.csv and the data root has none; pass --crops IDS (and --truth DATA_ROOT)")
    tuning_sets = [tuning_names(path, entries) for path, entries in splits.items()]
    report = {e.crop_name for entries in splits.values() for e in entries if e.role == "report"}
    names = set.intersection(*tuning_sets) - report
    if set.union(*tuning_sets) - names:
        log.info("not used for fitting (a member trained on them, or a run keeps them for reports): %s",
                 sorted(set.union(*tuning_sets) - names, key=crop_sort_key))
    if names - set(available):
        log.warning("tuning crops not predicted by every member, not used for fitting: %s",
                    sorted(names - set(available), key=crop_sort_key))
    return sorted(names & set(available), key=crop_sort_key)


def validation_entries(stores: Sequence[PredictionStore], *, data_root: str | Path | None = None,
                       crops: Sequence[str] | None = None, available: Sequence[str]) -> list[SplitEntry]:
    """The crops to fit on, with their label locations (rules in `cellseg.infer.ensemble_fit`, step 1).

    Args:
        crops: crop ids/names, or None (or ["val"]) for the members' tuning crops.
        available: the crops every member predicted.

    Raises:
        ValueError: no validation crop found, a requested crop missing from a member, or a crop whose
            labels cannot be located.
    """
    root = resolve_data_root(stores, data_root)
    splits = _splits(stores, root)
    if crops is None or list(crops) == ["val"]:
        names = _validation_names(splits, available)
    else:
        names = [crop_name(c) for c in crops]
        lacking = [n for n in names if n not in available]
        if lacking:
            raise ValueError(f"fitting crops {lacking} are not in every member store (crops in all: {list(available)})")
    if not names:
        raise ValueError(f"no validation crop is predicted by every member (tuning crops of "
                         f"{sorted(splits)}; crops in all: {list(available)})")
    # Labels: an explicit data root's catalogue; else where the datasplit rows say, the catalogue for the rest.
    rows = {} if data_root is not None else {e.crop_name: e for entries in splits.values() for e in entries}
    if all(n in rows for n in names):
        return [rows[n] for n in names]
    if root is None:
        raise ValueError(f"no labels known for crops {[n for n in names if n not in rows]}: pass --truth DATA_ROOT")
    catalog = Catalog.from_dir(root)
    return [rows[n] if n in rows else _catalog_entry(catalog, n, root) for n in names]


def _catalog_entry(catalog: Catalog, name: str, root: Path) -> SplitEntry:
    crop = catalog.train.get(crop_id(name))
    if crop is None or not crop.crop_url:
        raise ValueError(f"{name}: not a training crop with labels in {root} (training crops: "
                         f"{[c.name for c in catalog.train.values()]})")
    return SplitEntry(split="validate", em_url=str(catalog.locate(crop.em_url)),
                      crop_url=str(catalog.locate(crop.crop_url)), classes=crop.classes)
