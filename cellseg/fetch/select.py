"""Selecting crops for `cellseg fetch`: by group or id, by dataset and by class, with helpful errors.

Crops are picked from a `Catalog` by group (`all` = training and test crops, `train`, `test`) or by id,
then filtered by dataset and by class; a crop is kept when it lists at least one selected class. Test
crops are fetched as EM only: their ground truth is hidden. Test crops have no URLs in the manifests;
their EM group is the one of a training crop of the same dataset (or, failing that, another crop's URL
with the dataset name swapped).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from cellseg.classes import tested_classes
from cellseg.data.crops import CURRENT_TEST_VERSION, Catalog, Crop, crop_id

CROP_GROUPS = ("all", "train", "test")
Split = Literal["train", "test"]
Vec3 = tuple[float, float, float]


@dataclass(frozen=True, kw_only=True)
class Target:
    """A crop selected for fetching.

    Attributes:
        crop: the catalogue entry.
        split: "train" (EM and labels) or "test" (EM only).
        classes: the selected classes this crop lists (they define its box and GT voxel size).
        em_url: the dataset's EM group as the catalogue writes it (absolute, or relative to its base).
        crop_url: the crop's label group `.../labels/groundtruth/crop<N>` (same convention).
    """

    crop: Crop
    split: Split
    classes: tuple[str, ...]
    em_url: str
    crop_url: str

    def box_nm(self) -> tuple[Vec3, Vec3]:
        """Lower and upper world corners of the union of the selected classes' grids."""
        geometries = [self.crop.labels[c] for c in self.classes]
        start = tuple(min(g.start_nm[a] for g in geometries) for a in range(3))
        stop = tuple(max(g.stop_nm[a] for g in geometries) for a in range(3))
        return start, stop  # type: ignore[return-value]

    @property
    def gt_voxel_size_nm(self) -> Vec3:
        """The finest annotation voxel size per axis over the selected classes."""
        return tuple(min(self.crop.labels[c].voxel_size_nm[a] for c in self.classes)
                     for a in range(3))  # type: ignore[return-value]


def parse_crop_spec(text: str) -> str | tuple[int, ...]:
    """`all`, `train`, `test` or comma-separated crop ids (`crop` prefix allowed) from the command line."""
    text = text.strip()
    if text in CROP_GROUPS:
        return text
    try:
        return tuple(crop_id(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise ValueError(f"--crops {text!r}: expected one of {', '.join(CROP_GROUPS)} or crop ids like 1,2,3") from None


def _test_crops(catalog: Catalog) -> dict[int, Crop]:
    """The test crops of the current manifest version (`CURRENT_TEST_VERSION`), or of the only one there is."""
    if not catalog.tests:
        return {}
    version = CURRENT_TEST_VERSION if CURRENT_TEST_VERSION in catalog.tests else sorted(catalog.tests)[0]
    return dict(catalog.tests[version])


def _id_ranges(ids: Iterable[int]) -> str:
    """`1, 2, 3, 7, 9, 10` → `1-3, 7, 9-10`."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def _check_ids(ids: Sequence[int], train: Iterable[int], test: Iterable[int]) -> None:
    train, test = set(train), set(test)
    unknown = [i for i in ids if i not in train | test]
    if not unknown:
        return
    hints = [f"{i} (closest: {', '.join(map(str, sorted(train | test, key=lambda v: abs(v - i))[:3]))})"
             for i in unknown]
    raise ValueError(f"unknown crop id{'s' if len(unknown) > 1 else ''}: {'; '.join(hints)}. "
                     f"Valid: training crops {_id_ranges(train)}"
                     + (f"; test crops {_id_ranges(test)}" if test else ""))


def check_names(given: Iterable[str], valid: Iterable[str], what: str) -> None:
    """Raise a ValueError naming close matches and all valid choices when a name is unknown."""
    valid = sorted(set(valid))
    unknown = [n for n in given if n not in valid]
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
        hints.append(f"{name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    plural = what + ("es" if what.endswith("s") else "s")
    raise ValueError(f"unknown {plural if len(unknown) > 1 else what}: {'; '.join(hints)}. "
                     f"Valid {plural}: {', '.join(valid)}")


def _class_filter(classes: str | Sequence[str] | None, known: Iterable[str]) -> frozenset[str] | None:
    """None (every class) or the selected names; `tested` stands for the 48 scored classes."""
    if classes is None:
        return None
    names = [c.strip() for c in (classes.split(",") if isinstance(classes, str) else classes) if c.strip()]
    expanded = [n for c in names for n in (tested_classes() if c == "tested" else (c,))]
    check_names([n for n in names if n != "tested"], known, "class")
    return frozenset(expanded)


def _url_in_dataset(catalog: Catalog, dataset: str, default_tail: str, attr: str) -> str:
    """A dataset-level URL for a crop without one (test crops): another crop's URL with the dataset swapped."""
    for crop in catalog.train.values():
        url = getattr(crop, attr)
        if url and f"{crop.dataset}/{crop.dataset}.zarr" in url:
            head = url.split(f"{crop.dataset}/{crop.dataset}.zarr")[0]
            return f"{head}{dataset}/{dataset}.zarr/{default_tail}"
    return f"{dataset}/{dataset}.zarr/{default_tail}"


def _em_url(catalog: Catalog, crop: Crop) -> str:
    if crop.em_url:
        return crop.em_url
    same = [c.em_url for c in catalog.crops_of(crop.dataset) if c.em_url]
    return same[0] if same else _url_in_dataset(catalog, crop.dataset, "recon-1/em/fibsem-uint8", "em_url")


def _crop_url(catalog: Catalog, crop: Crop) -> str:
    tail = f"recon-1/labels/groundtruth/{crop.name}"
    return crop.crop_url or _url_in_dataset(catalog, crop.dataset, tail, "crop_url")


def select_targets(catalog: Catalog, *, crops: str | Sequence[int] = "all", datasets: Sequence[str] | None = None,
                   classes: str | Sequence[str] | None = None) -> list[Target]:
    """The crops to fetch, sorted by dataset and id.

    Args:
        catalog: where the crops are described.
        crops: "all" (training and test), "train", "test", or crop ids.
        datasets: keep only crops of these datasets.
        classes: keep only these classes ("tested" = the 48 scored ones, also inside a list); crops
            listing none of them are dropped.

    Raises:
        ValueError: unknown crop ids, datasets or classes (with close matches and the valid choices), or
            a selection that matches no crop.
    """
    test = _test_crops(catalog)
    pool: dict[int, tuple[Crop, Split]] = {i: (c, "test") for i, c in test.items()}
    pool.update({i: (c, "train") for i, c in catalog.train.items()})
    if isinstance(crops, str):
        crops = parse_crop_spec(crops)
    if isinstance(crops, str):
        ids = [i for i, (_, split) in sorted(pool.items()) if crops in ("all", split)]
    else:
        _check_ids(crops, catalog.train, test)
        ids = list(dict.fromkeys(crops))
    if datasets:
        check_names(datasets, {c.dataset for c, _ in pool.values()}, "dataset")
    wanted = _class_filter(classes, {n for c, _ in pool.values() for n in c.labels})
    targets = []
    for i in ids:
        crop, split = pool[i]
        chosen = tuple(n for n in crop.classes if wanted is None or n in wanted)
        if (datasets and crop.dataset not in datasets) or not chosen:
            continue
        targets.append(Target(crop=crop, split=split, classes=chosen, em_url=_em_url(catalog, crop),
                              crop_url=_crop_url(catalog, crop)))
    if not targets:
        raise ValueError(f"no crop matches --crops {crops!r}, --datasets {datasets!r}, --classes {classes!r}")
    return sorted(targets, key=lambda t: (t.crop.dataset, t.crop.id))
