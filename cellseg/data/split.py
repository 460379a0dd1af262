"""Train/validation splits, grouped by space: built from a catalogue (stratified) or read from a `datasplit.csv`.

A split is a list of `SplitEntry` (split name, EM group location, crop label folder, annotated classes, and for
validation crops their role). It is written next to each run as `datasplit.csv` in the official 5-column form,
so a run records exactly what it trained and validated on and the file loads in the challenge's own tools too;
the roles go beside it in `validation_roles.csv` (`ROLES_FILE`).

Grouping (`spatial_groups`): crops of one dataset whose boxes overlap, or come closer than a margin (one patch
by default: a patch of one crop could then hold voxels of the other), are one group, and a group never straddles
the split. The official manifest has 35 overlapping pairs among the crops annotated at ≤ 8 nm (crop 247 overlaps
nine others): split crop by crop, validation would score voxels the model trained on.

Stratification rule (`split_catalog`): groups are shuffled with the seed; then, rarest class first, a class
held in ≥ 2 eligible groups but in no validation group yet moves one of its groups (the one listing the fewest
labels, to keep training rich) to validation; finally random groups are added until `validation_fraction` of the
crops is reached. "Held" means *with foreground*, not merely listed: the manifests list classes that are annotated
even where absent (a crop listing `ecs` may hold none), and a validation crop without a class's foreground tells
no decision anything about it (`cellseg.eval.presence`). So a listed class counts for a crop only when its finest
level holds positive voxels by the annotation metadata's complement counts (`foreground_classes`); a class
without counts, or a crop whose labels are not on disk (a remote or unfetched catalogue), falls back to the
listing. The same foreground decides the roles below, for the automatic split and for a given one alike.

A given split (the data root's `datasplit.csv` or `data.datasplit`) is checked (`straddling_pairs`): training
and validation crops whose boxes overlap are named in a warning, and `regroup` moves each spatial group that
straddles the split wholly to one side (`data.split_overlap`; `cellseg.data.loader.checked_split`). Relative
locations are relative to the data root (what `cellseg synth` and `cellseg import` write, so that a copied root
reads its own crops); absolute ones outside the data root are named (`outside_root`).

Roles (`assign_roles`): validation is split again into a **tuning** part (what every decision — checkpoint,
ensemble weights, post-processing — is made on) and a **report** part that no decision touches, group by group:
rarest class first, a class in ≥ 2 validation groups gets one in each part, a class in one group gets it in the
tuning part (a decision needs it), and the rest go to the smaller part until `report_fraction` of the crops.
With ≥ 2 validation groups each part keeps at least one: when the rule leaves a part empty (classes held by one
group each can claim every group for tuning), the group whose part loses the fewest classes only it holds there
(then the smallest, then the last in the seeded order) moves to the empty part.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cellseg.classes import get_class
from cellseg.data.annotation import parse_annotation
from cellseg.data.crops import Catalog, Crop, crop_id
from cellseg.data.inspect import EM_PATH, GT_PATH

log = logging.getLogger(__name__)
VOXEL_TOL = 1.01  # a crop annotated at 8.05 nm still counts as "8 nm"
ROLES_FILE = "validation_roles.csv"  # beside a datasplit.csv: crop_name,role ("tuning" or "report")
ROLES = ("tuning", "report")


@dataclass(frozen=True, kw_only=True)
class SplitEntry:
    """One crop of a split."""

    split: str  # "train" or "validate"
    em_url: str  # the EM multiscale group
    crop_url: str  # the crop's label folder `.../labels/groundtruth/crop<N>`
    classes: tuple[str, ...]  # classes annotated (listed) for the crop
    role: str = ""  # validation crops: "tuning" (decisions are made on it) or "report" (only scored); else ""

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


def crop_box_nm(crop: Crop) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) corner of the box every label of the crop covers (z, y, x; nm)."""
    starts = [g.start_nm for g in crop.labels.values()]
    stops = [g.stop_nm for g in crop.labels.values()]
    return np.min(starts, axis=0), np.max(stops, axis=0)


def spatial_groups(crops: Sequence[Crop], margin_nm: float = 0.0) -> list[tuple[Crop, ...]]:
    """Crops of one dataset whose boxes overlap or lie within `margin_nm` of each other (transitively), in the
    order of their first crop in `crops`."""
    parent = list(range(len(crops)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    boxes = [crop_box_nm(c) for c in crops]
    for i in range(len(crops)):
        for j in range(i + 1, len(crops)):
            if crops[i].dataset == crops[j].dataset and _close(boxes[i], boxes[j], margin_nm):
                parent[root(i)] = root(j)
    groups: dict[int, list[Crop]] = {}
    for i, crop in enumerate(crops):
        groups.setdefault(root(i), []).append(crop)
    return [tuple(g) for g in groups.values()]


def _close(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], margin_nm: float) -> bool:
    """Two (lower, upper) boxes overlap or lie within `margin_nm` of each other on every axis."""
    gap = np.maximum(a[0] - b[1], b[0] - a[1])  # per axis; negative where the boxes overlap
    return bool(np.all(gap < margin_nm))


def straddling_pairs(entries: Sequence[SplitEntry], catalog: Catalog, margin_nm: float) -> list[tuple[str, str]]:
    """(training crop, validation crop) names of one dataset whose boxes overlap or lie within `margin_nm`:
    validation would score voxels a training patch saw. Crops the catalogue does not know are not checked."""
    known = {c.name: c for c in catalog.train.values()}
    train = [known[e.crop_name] for e in entries if e.split == "train" and e.crop_name in known]
    val = [known[e.crop_name] for e in entries if e.split == "validate" and e.crop_name in known]
    return [(t.name, v.name) for t in train for v in val
            if t.dataset == v.dataset and _close(crop_box_nm(t), crop_box_nm(v), margin_nm)]


def regroup(entries: Sequence[SplitEntry], catalog: Catalog, margin_nm: float, *, to: str) -> list[SplitEntry]:
    """`entries` with every spatial group that straddles the split moved wholly to `to` ("train" or "validate";
    a crop moved to validation gets its role later, one moved to training loses it).

    Raises:
        ValueError: `to` is neither, or the split would be left without training or validation crops.
    """
    if to not in ("train", "validate"):
        raise ValueError(f"regroup to {to!r}: choose 'train' or 'validate'")
    known = {c.name: c for c in catalog.train.values()}
    side = {e.crop_name: e.split for e in entries}
    moved: set[str] = set()
    for group in spatial_groups([known[e.crop_name] for e in entries if e.crop_name in known], margin_nm):
        if len({side[c.name] for c in group}) > 1:
            moved |= {c.name for c in group if side[c.name] != to}
    out = [dataclasses.replace(e, split=to, role="") if e.crop_name in moved else e for e in entries]
    if {e.split for e in out} != {"train", "validate"}:
        raise ValueError(f"moving the {len(moved)} crops of the straddling groups to {to} leaves no "
                         f"{'validation' if to == 'train' else 'training'} crop; split the data another way")
    return out


def outside_root(entries: Sequence[SplitEntry], root: str | os.PathLike[str]) -> list[str]:
    """Names of the crops whose EM or label location is a local path outside `root` (a copied data root would
    still read the original there); remote locations are not checked."""
    base = Path(root).resolve()

    def outside(url: str) -> bool:
        return "://" not in url and not Path(url).resolve().is_relative_to(base)

    return [e.crop_name for e in entries if outside(e.em_url) or outside(e.crop_url)]


def foreground_classes(crop: Crop, catalog: Catalog) -> tuple[str, ...]:
    """The classes listed for `crop` whose finest level has foreground by its annotation metadata's complement
    counts (module docstring). A listed class without counts, or a crop whose labels are not on disk (a remote
    or unfetched catalogue), is kept: the listing is all that is known.

    Raises:
        ValueError: malformed annotation metadata (the array is named).
    """
    try:
        where = catalog.locate(crop.crop_url) if crop.crop_url else None
    except ValueError:
        where = None
    if where is None or where.kind != "file" or not Path(where.url).is_dir():
        return crop.classes
    kept = []
    for name in crop.classes:
        group = where.join(name)
        group_attrs = group.read_json(".zattrs") or {}
        levels = (group_attrs.get("multiscales") or [{}])[0].get("datasets") or [{"path": "s0"}]
        level = group.join(str(levels[0]["path"]))
        meta = level.read_json(".zarray")
        if meta is None:
            kept.append(name)
            continue
        note = parse_annotation(group_attrs, level.read_json(".zattrs"), num_voxels=int(np.prod(meta["shape"])),
                                source=group.url)
        if note.positives is None or note.positives > 0:
            kept.append(name)
    return tuple(kept)


def _with_foreground(listed: Sequence[str], crop: Crop, catalog: Catalog) -> tuple[str, ...]:
    """The classes of `listed` with foreground on `crop` (`foreground_classes`); those the catalogue does not
    list for the crop are kept (nothing is known of them)."""
    held = set(foreground_classes(crop, catalog))
    return tuple(n for n in listed if n in held or n not in crop.classes)


def _annotates(group: Sequence[Crop], name: str, present: dict[int, tuple[str, ...]]) -> bool:
    return _holds([(c.id, present[c.id]) for c in group], name)


def _size(groups: Iterable[Sequence[object]]) -> int:
    return sum(len(g) for g in groups)


def split_catalog(catalog: Catalog, classes: Sequence[str], *, validation_fraction: float, seed: int,
                  max_voxel_size_nm: float | None = None, margin_nm: float = 0.0,
                  report_fraction: float = 0.5) -> list[SplitEntry]:
    """Stratified split of the catalogue's training crops by spatial group (rules in the module docstring).

    Raises:
        ValueError: if no crop annotates any requested class at a fine enough voxel size.
    """
    crops = [c for c in sorted(catalog.train.values(), key=lambda k: k.id) if eligible(c, classes, max_voxel_size_nm)]
    if not crops:
        raise ValueError(f"no training crop annotates any of {list(classes)} at ≤ {max_voxel_size_nm} nm "
                         f"(catalogue {catalog.base or 'official'})")
    groups = spatial_groups(crops, margin_nm)
    random.Random(seed).shuffle(groups)
    present = {c.id: foreground_classes(c, catalog) for c in crops}
    validation: list[tuple[Crop, ...]] = []
    rarity = sorted(classes, key=lambda c: sum(_annotates(g, c, present) for g in groups))
    for name in rarity:
        having = [g for g in groups if _annotates(g, name, present)]
        if len(having) >= 2 and not any(_annotates(g, name, present) for g in validation):
            pick = min((g for g in having if g not in validation), key=lambda g: (sum(len(c.labels) for c in g)),
                       default=None)
            if pick is not None and _size(validation) + len(pick) < len(crops):
                validation.append(pick)
    target = max(1, round(validation_fraction * len(crops))) if len(groups) > 1 else 0
    for g in groups:
        if _size(validation) >= target:
            break
        if g not in validation and _size(validation) + len(g) < len(crops):
            validation.append(g)
    roles = assign_roles([[(c.id, present[c.id]) for c in g] for g in validation], classes,
                         report_fraction=report_fraction)
    return [SplitEntry(split="validate" if k.id in roles else "train", em_url=str(catalog.locate(k.em_url)),
                       crop_url=str(catalog.locate(k.crop_url)), classes=k.classes, role=roles.get(k.id, ""))
            for k in crops]


def assign_roles(groups: Sequence[Sequence[tuple[int, Sequence[str]]]], classes: Sequence[str], *,
                 report_fraction: float = 0.5) -> dict[int, str]:
    """Crop id → "tuning" or "report" for validation `groups` of (crop id, annotated classes) (rule in the module
    docstring)."""
    role_of: dict[int, str] = {}  # group index → role

    def give(i: int, role: str) -> None:
        role_of.setdefault(i, role)

    rarity = sorted(classes, key=lambda c: sum(_holds(g, c) for g in groups))
    for name in rarity:
        having = [i for i, g in enumerate(groups) if _holds(g, name)]
        for role in ROLES if len(having) >= 2 else ROLES[:1]:
            if not any(role_of.get(i) == role for i in having):
                free = [i for i in having if i not in role_of]
                if free:
                    give(free[0], role)
    total = _size(groups)
    for i in range(len(groups)):
        if i not in role_of:
            report = sum(len(groups[j]) for j, r in role_of.items() if r == "report")
            give(i, "report" if report < report_fraction * total else "tuning")
    if len(groups) >= 2:
        for role in ROLES:
            if role not in role_of.values():
                role_of[_cheapest_move(groups, role_of, classes)] = role
    return {crop: role_of[i] for i, g in enumerate(groups) for crop, _ in g}


def _holds(group: Sequence[tuple[int, Sequence[str]]], name: str) -> bool:
    return any(derivable(name, labels) for _, labels in group)


def _cheapest_move(groups: Sequence[Sequence[tuple[int, Sequence[str]]]], role_of: dict[int, str],
                   classes: Sequence[str]) -> int:
    """The group to move to the part that has none (module docstring): the one whose part loses the fewest
    classes only it holds there, then the smallest, then the last (the seeded order decides)."""

    def lost(i: int) -> int:
        others = [g for j, g in enumerate(groups) if j != i and role_of[j] == role_of[i]]
        return sum(_holds(groups[i], c) and not any(_holds(g, c) for g in others) for c in classes)

    return min(range(len(groups)), key=lambda i: (lost(i), len(groups[i]), -i))


def _located(url: str, base: str | os.PathLike[str]) -> str:
    """A location of a datasplit row: URLs and absolute paths as they are, relative paths under `base`."""
    if "://" in url or os.path.isabs(url):
        return url
    if "://" in str(base):
        return f"{str(base).rstrip('/')}/{url}"
    return str(Path(base).resolve() / url)


def read_datasplit(path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None) -> list[SplitEntry]:
    """Read an official `datasplit.csv`: 5 columns (split, raw zarr, raw dataset, gt zarr,
    `gt dataset/[classes]`) or 3 columns (split, raw path, gt path with `[classes]`). Relative locations are
    relative to the data root `root` (default: the file's folder, a root's own datasplit; `cellseg synth` and
    `cellseg import` write them so).

    Raises:
        ValueError: malformed rows (the line number is named).
    """
    entries = []
    base = root if root is not None else Path(path).resolve().parent
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
            entries.append(SplitEntry(split=split, em_url=_located(raw, base), crop_url=_located(crop_url, base),
                                      classes=classes))
    if not entries:
        raise ValueError(f"{path}: no rows")
    roles = read_roles(Path(path).with_name(ROLES_FILE))
    return [dataclasses.replace(e, role=roles.get(e.crop_name, "")) if e.split == "validate" else e for e in entries]


def read_roles(path: str | os.PathLike[str]) -> dict[str, str]:
    """crop name → role of a `validation_roles.csv` (empty when the file does not exist).

    Raises:
        ValueError: a malformed row or an unknown role (the line is named).
    """
    path = Path(path)
    if not path.is_file():
        return {}
    roles = {}
    with open(path, newline="") as fh:
        for line, row in enumerate(csv.reader(fh), start=1):
            if not row or row[0].startswith("#") or row == ["crop_name", "role"]:
                continue
            if len(row) != 2 or row[1].strip() not in ROLES:
                raise ValueError(f"{path}, line {line}: expected crop_name,role with role in {ROLES}, got {row}")
            roles[row[0].strip()] = row[1].strip()
    return roles


def with_roles(entries: Sequence[SplitEntry], catalog: Catalog, classes: Sequence[str], *, margin_nm: float,
               report_fraction: float = 0.5) -> list[SplitEntry]:
    """`entries` with a role for every validation crop: kept where given, else assigned by `assign_roles` over
    the spatial groups of the validation crops (crops the catalogue does not know are groups of their own)."""
    missing = [e for e in entries if e.split == "validate" and not e.role]
    if not missing:
        return list(entries)
    known = {c.name: c for c in catalog.train.values()}
    val = {e.crop_name: e for e in entries if e.split == "validate"}
    located = spatial_groups([known[name] for name in val if name in known], margin_nm)
    groups = [[(c.id, _with_foreground(val[c.name].classes, c, catalog)) for c in g] for g in located]
    groups += [[(crop_id(name), e.classes)] for name, e in val.items() if name not in known]
    roles = assign_roles(groups, classes, report_fraction=report_fraction)
    return [dataclasses.replace(e, role=roles[crop_id(e.crop_name)]) if e.split == "validate" and not e.role else e
            for e in entries]


def write_datasplit(entries: Sequence[SplitEntry], path: str | os.PathLike[str]) -> Path:
    """Write the official 5-column, fully quoted form (atomically), and the validation crops' roles beside it
    (`ROLES_FILE`) when they have any."""
    path = Path(path)
    roles = [(e.crop_name, e.role) for e in entries if e.split == "validate" and e.role]
    if roles:
        tmp_roles = path.with_name(f".{ROLES_FILE}.tmp")
        tmp_roles.write_text("crop_name,role\n" + "".join(f"{name},{role}\n" for name, role in roles))
        tmp_roles.replace(path.with_name(ROLES_FILE))
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
