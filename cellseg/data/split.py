"""Train/validation splits by crop: built from a catalogue (stratified) or read from a `datasplit.csv`.

A split is a list of `SplitEntry` (split name, EM group location, crop label folder, annotated classes).
It is written next to each run as `datasplit.csv` in the official 5-column form, so a run records
exactly what it trained and validated on and the file loads in the challenge's own tools too.

Stratification rule (`split_catalog`): crops are shuffled with the seed; then, rarest class first, a
class annotated in ≥ 2 eligible crops but in no validation crop yet moves one of its crops (the one
annotating the fewest other classes, to keep training rich) to validation; finally random crops are
added until `validation_fraction` of the crops is reached. "Annotated" means listed for the crop in the
manifest: the manifests list classes that are annotated even where absent, so presence of foreground is
not checked here.
"""

from __future__ import annotations

import csv
import logging
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cellseg.classes import get_class
from cellseg.data.crops import Catalog, Crop
from cellseg.data.inspect import EM_PATH, GT_PATH

log = logging.getLogger(__name__)
VOXEL_TOL = 1.01  # a crop annotated at 8.05 nm still counts as "8 nm"


@dataclass(frozen=True, kw_only=True)
class SplitEntry:
    """One crop of a split."""

    split: str  # "train" or "validate"
    em_url: str  # the EM multiscale group
    crop_url: str  # the crop's label folder `.../labels/groundtruth/crop<N>`
    classes: tuple[str, ...]  # classes annotated (listed) for the crop

    @property
    def crop_name(self) -> str:
        """`crop<N>`."""
        return self.crop_url.rstrip("/").rsplit("/", 1)[-1]


def derivable(name: str, annotated: Iterable[str]) -> bool:
    """True if `name` is annotated, or is a group all of whose atoms are annotated (union)."""
    annotated = set(annotated)
    if name in annotated:
        return True
    cls = get_class(name)
    atoms = {get_class(i).name for i in cls.atom_ids}
    return cls.is_group and atoms <= annotated


def eligible(crop: Crop, classes: Sequence[str], max_voxel_size_nm: float | None) -> bool:
    """A crop is eligible if it is fine enough and annotates at least one requested class."""
    if max_voxel_size_nm is not None:
        fine = [c for c in crop.labels if max(crop.labels[c].voxel_size_nm) <= max_voxel_size_nm * VOXEL_TOL]
    else:
        fine = list(crop.labels)
    return any(derivable(c, fine) for c in classes)


def split_catalog(catalog: Catalog, classes: Sequence[str], *, validation_fraction: float, seed: int,
                  max_voxel_size_nm: float | None = None) -> list[SplitEntry]:
    """Stratified split of the catalogue's training crops (rule in the module docstring).

    Raises:
        ValueError: if no crop annotates any requested class at a fine enough voxel size.
    """
    crops = [c for c in catalog.train.values() if eligible(c, classes, max_voxel_size_nm)]
    if not crops:
        raise ValueError(f"no training crop annotates any of {list(classes)} at ≤ {max_voxel_size_nm} nm "
                         f"(catalogue {catalog.base or 'official'})")
    random.Random(seed).shuffle(crops)
    validation: list[Crop] = []
    rarity = sorted(classes, key=lambda c: sum(derivable(c, k.labels) for k in crops))
    for name in rarity:
        having = [k for k in crops if derivable(name, k.labels)]
        if len(having) >= 2 and not any(derivable(name, k.labels) for k in validation):
            pick = min((k for k in having if k not in validation), key=lambda k: len(k.labels), default=None)
            if pick is not None and len(validation) + 1 < len(crops):
                validation.append(pick)
    target = max(1, round(validation_fraction * len(crops))) if len(crops) > 1 else 0
    for k in crops:
        if len(validation) >= target:
            break
        if k not in validation:
            validation.append(k)
    chosen = {k.id for k in validation}
    return [SplitEntry(split="validate" if k.id in chosen else "train", em_url=str(catalog.locate(k.em_url)),
                       crop_url=str(catalog.locate(k.crop_url)), classes=k.classes)
            for k in sorted(crops, key=lambda k: k.id)]


def read_datasplit(path: str | os.PathLike[str]) -> list[SplitEntry]:
    """Read an official `datasplit.csv`: 5 columns (split, raw zarr, raw dataset, gt zarr,
    `gt dataset/[classes]`) or 3 columns (split, raw path, gt path with `[classes]`).

    Raises:
        ValueError: malformed rows (the line number is named).
    """
    entries = []
    with open(path, newline="") as fh:
        for line, row in enumerate(csv.reader(fh), start=1):
            if not row or row[0].startswith("#"):
                continue
            if len(row) == 5:
                raw, gt = os.path.join(row[1].strip(), row[2].strip()), os.path.join(row[3].strip(), row[4].strip())
            elif len(row) == 3:
                raw, gt = row[1].strip(), row[2].strip()
            else:
                raise ValueError(f"{path}, line {line}: expected 5 or 3 columns, got {len(row)}")
            crop_url, sep, rest = gt.rpartition("/[")
            if not sep or not rest.endswith("]"):
                raise ValueError(f"{path}, line {line}: gt path {gt!r} must end in /[class1,class2,...]")
            split = row[0].strip()
            if split not in ("train", "validate"):
                raise ValueError(f"{path}, line {line}: split {split!r} must be 'train' or 'validate'")
            classes = tuple(c.strip() for c in rest[:-1].split(",") if c.strip())
            entries.append(SplitEntry(split=split, em_url=raw, crop_url=crop_url, classes=classes))
    if not entries:
        raise ValueError(f"{path}: no rows")
    return entries


def write_datasplit(entries: Sequence[SplitEntry], path: str | os.PathLike[str]) -> Path:
    """Write the official 5-column, fully quoted form (atomically)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as fh:
        writer = csv.writer(fh, quoting=csv.QUOTE_ALL)
        for e in entries:
            raw_zarr, _, raw_ds = e.em_url.partition(".zarr/")
            gt_zarr, _, gt_ds = e.crop_url.partition(".zarr/")
            writer.writerow([e.split, raw_zarr + ".zarr", raw_ds, gt_zarr + ".zarr", f"{gt_ds}/[{','.join(e.classes)}]"])
    tmp.replace(path)
    return path


def dataset_paths(root: str | os.PathLike[str], dataset: str) -> tuple[str, str]:
    """(EM group, label root) of a dataset in a data root laid out like the challenge's."""
    zarr_dir = Path(root) / dataset / f"{dataset}.zarr"
    return str(zarr_dir / EM_PATH), str(zarr_dir / GT_PATH)
