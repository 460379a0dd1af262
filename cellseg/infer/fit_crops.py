"""Which crops `cellseg ensemble --weights auto` fits on, and where their labels are: the members' common
validation crops (from their runs' datasplit.csv) or the crops asked for, located in the data root the members
were predicted from (or `--truth`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from cellseg.data.crops import Catalog, crop_id, crop_name, crop_sort_key
from cellseg.data.split import SplitEntry, read_datasplit
from cellseg.infer.store import PredictionStore

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


def _splits(stores: Sequence[PredictionStore], root: Path | None) -> list[list[SplitEntry]]:
    """The members' run datasplits; without any, the data root's."""
    found = []
    for store in stores:
        run_dir = store.provenance.get("run_dir")
        if run_dir and (Path(run_dir) / "datasplit.csv").is_file():
            found.append(read_datasplit(Path(run_dir) / "datasplit.csv"))
    if not found and root is not None and (root / "datasplit.csv").is_file():
        found.append(read_datasplit(root / "datasplit.csv"))
    return found


def _validation_names(splits: list[list[SplitEntry]], available: Sequence[str]) -> list[str]:
    if not splits:
        raise ValueError("--weights auto needs validation crops: no member's provenance names a run_dir with a "
                         "datasplit.csv and the data root has none; pass --crops IDS (and --truth DATA_ROOT)")
    val_sets = [{e.crop_name for e in entries if e.split == "validate"} for entries in splits]
    names = set.intersection(*val_sets)
    if set.union(*val_sets) - names:
        log.info("not used for fitting (a member trained on them): %s", sorted(set.union(*val_sets) - names))
    if names - set(available):
        log.warning("validation crops not predicted by every member, not used for fitting: %s",
                    sorted(names - set(available), key=crop_sort_key))
    return sorted(names & set(available), key=crop_sort_key)


def validation_entries(stores: Sequence[PredictionStore], *, data_root: str | Path | None = None,
                       crops: Sequence[str] | None = None, available: Sequence[str]) -> list[SplitEntry]:
    """The crops to fit on, with their label locations (rules in `cellseg.infer.ensemble_fit`, step 1).

    Args:
        crops: crop ids/names, or None (or ["val"]) for the members' validation crops.
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
        raise ValueError(f"no validation crop is predicted by every member (crops in all: {list(available)})")
    # Labels: an explicit data root's catalogue; else where the datasplit rows say, the catalogue for the rest.
    rows = {} if data_root is not None else {e.crop_name: e for entries in splits for e in entries}
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
