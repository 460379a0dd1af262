"""Training targets with unknown-masking: a `(K, z, y, x)` target and a `(K, z, y, x)` *known* mask per patch.

For each configured class k, in a given crop:
1. annotated on disk → read it (nearest neighbour, never averaged), known inside the annotated crop;
2. otherwise a group whose atoms are all annotated → the union of the atoms, known where they all are;
3. otherwise unknown — except where a *mutually exclusive* class (disjoint atom sets, see `classes.py`)
   is positive: there the class is known-negative. The evidence comes from the crop's `all` array (atom
   ids, one read for every class) when present, else from the annotated exclusive classes themselves
   (only the maximal ones: `nuc` covers `ne_mem`).
Voxels outside the annotated crop are unknown; so are EM voxels equal to the "outside the imaged volume"
value (handled by the dataset, which reads the EM).

With `boundaries=True`, every instance-scored class k also gets an auxiliary channel (after the K class
channels, in class order): the voxels of an object that touch a *different* object (6-neighbourhood).
Touching objects merge in a binary mask; this channel is what lets the watershed split them again. It is
known only where the class is read from an id array (a union of atoms carries no ids).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cellseg.data.arrays import MultiscaleImage
from cellseg.data.classes import all_classes, get_class, is_instance, mutually_exclusive
from cellseg.data.split import SplitEntry

log = logging.getLogger(__name__)
Vec3 = tuple[float, float, float]


@dataclass(frozen=True, kw_only=True)
class Grid:
    """An output grid in world space: centre of voxel 0, shape and voxel size (z, y, x; nm)."""

    translation_nm: Vec3
    shape_vox: tuple[int, int, int]
    voxel_size_nm: Vec3

    def read_kwargs(self) -> dict[str, object]:
        """Keyword arguments for `MultiscaleImage.read`."""
        return {"translation_nm": self.translation_nm, "shape_vox": self.shape_vox,
                "voxel_size_nm": self.voxel_size_nm}


@dataclass(frozen=True, kw_only=True)
class ClassPlan:
    """How class k is obtained in one crop."""

    name: str
    read: tuple[str, ...] = ()  # arrays whose union is the class (1: on disk; n: atoms)
    exclusive: tuple[str, ...] = ()  # annotated arrays whose positives make it known-negative (no `all`)
    exclusive_ids: tuple[int, ...] = ()  # `all` ids whose presence makes it known-negative

    @property
    def known(self) -> bool:
        """True if the class is annotated (directly or through its atoms) in this crop."""
        return bool(self.read)


def _maximal(names: Sequence[str]) -> tuple[str, ...]:
    """Drop classes whose atoms are covered by another class in `names` (their positives add nothing)."""
    atoms = {n: get_class(n).atom_ids for n in names}
    return tuple(n for n in names if not any(m != n and atoms[n] < atoms[m] for m in names))


def plan_class(name: str, on_disk: Sequence[str], *, has_all: bool) -> ClassPlan:
    """Decide how to obtain `name` from the arrays present in a crop."""
    cls = get_class(name)
    if name in on_disk:
        return ClassPlan(name=name, read=(name,))
    atom_names = tuple(get_class(i).name for i in sorted(cls.atom_ids))
    if cls.is_group and all(a in on_disk for a in atom_names):
        return ClassPlan(name=name, read=atom_names)
    if has_all:
        ids = tuple(c.id for c in all_classes() if c.atom_ids.isdisjoint(cls.atom_ids))
        return ClassPlan(name=name, exclusive_ids=ids)
    exclusive = [c for c in on_disk if c != "all" and mutually_exclusive(c, name)]
    return ClassPlan(name=name, exclusive=_maximal(exclusive))


@dataclass
class CropSource:
    """One training crop opened for reading: EM, its label arrays and how each class is built.

    Array handles open lazily and are re-opened in each DataLoader worker (they do not pickle).
    """

    entry: SplitEntry
    classes: tuple[str, ...]
    backend: str = "tensorstore"
    cache_bytes: int = 32 * 2**20
    on_disk: tuple[str, ...] = ()
    plans: tuple[ClassPlan, ...] = ()
    start_nm: Vec3 = (0.0, 0.0, 0.0)  # annotated box (lower corner)
    stop_nm: Vec3 = (0.0, 0.0, 0.0)
    label_voxel_size_nm: Vec3 = (1.0, 1.0, 1.0)
    boundaries: bool = False
    _images: dict[str, MultiscaleImage] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        crop_dir = Path(self.entry.crop_url)
        if not crop_dir.is_dir():
            raise FileNotFoundError(f"{crop_dir}: crop folder of datasplit row {self.entry.crop_name} not found")
        present = {p.name for p in crop_dir.iterdir() if (p / ".zattrs").is_file()}
        self.on_disk = tuple(c for c in self.entry.classes if c in present and c != "all")
        missing = sorted(set(self.entry.classes) - present - {"all"})
        if missing:
            log.warning("%s: classes listed but not on disk, treated as unannotated: %s", crop_dir, missing)
        has_all = "all" in present
        self.plans = tuple(plan_class(c, self.on_disk, has_all=has_all) for c in self.classes)
        if not any(p.known for p in self.plans):
            raise ValueError(f"{crop_dir}: annotates none of the requested classes {list(self.classes)}")
        self._set_box(has_all)

    def _set_box(self, has_all: bool) -> None:
        starts, stops, sizes = [], [], []
        for name in self.on_disk + (("all",) if has_all else ()):
            lv = self.image(name).levels[0]
            starts.append([t - v / 2 for t, v in zip(lv.translation_nm, lv.voxel_size_nm, strict=True)])
            stops.append([t - v / 2 + n * v for t, v, n in zip(lv.translation_nm, lv.voxel_size_nm, lv.shape_vox,
                                                                 strict=True)])
            sizes.append(lv.voxel_size_nm)
        self.start_nm = tuple(np.min(starts, axis=0).tolist())  # type: ignore[assignment]
        self.stop_nm = tuple(np.max(stops, axis=0).tolist())  # type: ignore[assignment]
        self.label_voxel_size_nm = tuple(np.min(sizes, axis=0).tolist())  # type: ignore[assignment]

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_images": {}}

    def image(self, name: str) -> MultiscaleImage:
        """The multiscale label group `name` of this crop ("all" included), opened once."""
        if name not in self._images:
            self._images[name] = MultiscaleImage(os.path.join(self.entry.crop_url, name), backend=self.backend,
                                                 cache_bytes=self.cache_bytes)
        return self._images[name]

    def em(self) -> MultiscaleImage:
        """The dataset's EM group (must be uint8)."""
        if "__em__" not in self._images:
            self._images["__em__"] = MultiscaleImage(self.entry.em_url, backend=self.backend, expected_dtype="uint8",
                                                     cache_bytes=self.cache_bytes)
        return self._images["__em__"]

    @property
    def name(self) -> str:
        """`crop<N>`."""
        return self.entry.crop_name

    @property
    def aux_classes(self) -> tuple[int, ...]:
        """Indices of the classes that get a boundary channel (instance-scored ones, if enabled)."""
        return tuple(k for k, c in enumerate(self.classes) if is_instance(c)) if self.boundaries else ()

    def read_targets(self, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
        """`(target, known)` on `grid`, both `(K + A, z, y, x)` bool (A boundary channels, see above)."""
        k = len(self.plans) + len(self.aux_classes)
        target = np.zeros((k, *grid.shape_vox), dtype=bool)
        known = np.zeros((k, *grid.shape_vox), dtype=bool)
        cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

        def read(name: str) -> tuple[np.ndarray, np.ndarray]:
            if name not in cache:
                values, inside = self.image(name).read(**grid.read_kwargs(), interpolation="nearest", pad_value=0,
                                                       return_mask=True)
                cache[name] = (values, inside)
            return cache[name]

        for i, plan in enumerate(self.plans):
            if plan.read:
                parts = [read(n) for n in plan.read]
                target[i] = np.logical_or.reduce([v > 0 for v, _ in parts])
                known[i] = np.logical_and.reduce([m for _, m in parts])
            elif plan.exclusive_ids:
                ids, _ = read("all")
                lut = np.zeros(int(max(ids.max(initial=0), max(plan.exclusive_ids))) + 1, dtype=bool)
                lut[list(plan.exclusive_ids)] = True
                known[i] = lut[ids]
            elif plan.exclusive:
                known[i] = np.logical_or.reduce([read(n)[0] > 0 for n in plan.exclusive])
        for j, i in enumerate(self.aux_classes, start=len(self.plans)):
            if len(self.plans[i].read) == 1:  # ids on disk
                ids, inside = read(self.plans[i].read[0])
                target[j], known[j] = touching(ids), inside
        return target, known


def touching(ids: np.ndarray) -> np.ndarray:
    """Voxels of an object with a 6-neighbour in a different object (background does not count)."""
    out = np.zeros(ids.shape, dtype=bool)
    for axis in range(ids.ndim):
        a = [slice(None)] * ids.ndim
        b = [slice(None)] * ids.ndim
        a[axis], b[axis] = slice(1, None), slice(None, -1)
        lo, hi = ids[tuple(a)], ids[tuple(b)]
        diff = (lo != hi) & (lo > 0) & (hi > 0)
        out[tuple(a)] |= diff
        out[tuple(b)] |= diff
    return out
