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

Fast path: when the crop has its `all` array (atom ids) and `use_all` is on, every class channel comes from
that one array through lookup tables: a voxel with id v is positive for class c when atoms(v) ⊆ atoms(c),
known-negative when they are disjoint, and unknown when they only overlap (v is a coarser group there).
One read and one gather replace ~50 array reads; the result equals the per-array path on consistent data.

With `boundaries=True`, every instance-scored class k also gets an auxiliary channel (after the K class
channels, in class order): the voxels of an object that touch a *different* object (6-neighbourhood).
Touching objects merge in a binary mask; this channel is what lets the watershed split them again. It is
known only where the class is read from an id array (a union of atoms carries no ids).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cellseg.classes import all_classes, get_class, is_instance, mutually_exclusive
from cellseg.data.arrays import MultiscaleImage
from cellseg.data.grid import Grid, Vec3
from cellseg.data.split import SplitEntry

if TYPE_CHECKING:
    from cellseg.data.boundary_cache import BoundaryCache

log = logging.getLogger(__name__)
ALL_OUTSIDE = 255  # pad value of `all` reads: not a CellMap id, so "outside the crop" stays unknown


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
    cache_bytes: int = 256 * 2**20
    on_disk: tuple[str, ...] = ()
    plans: tuple[ClassPlan, ...] = ()
    start_nm: Vec3 = (0.0, 0.0, 0.0)  # annotated box (lower corner)
    stop_nm: Vec3 = (0.0, 0.0, 0.0)
    label_voxel_size_nm: Vec3 = (1.0, 1.0, 1.0)
    boundaries: bool = False
    boundary_cache_dir: str | None = None  # where `boundary_cache` keeps the boundary bits (None: per sample)
    use_all: bool = True
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
        has_all = self.has_all = "all" in present
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
        state = {**self.__dict__, "_images": {}}
        state.pop("_all_tables", None)  # cached_property: recomputed on demand
        state.pop("_boundary_caches", None)  # reopened in each worker
        return state

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

    @property
    def num_channels(self) -> int:
        """K class channels plus the boundary channels."""
        return len(self.plans) + len(self.aux_classes)

    def read_targets_packed(self, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
        """`(target_bits, known_bits)` on `grid`, each `(ceil(C / 8), z, y, x)` uint8 (channel c = bit c % 8
        of byte c // 8), written channel by channel without ever holding C boolean volumes."""
        shape = (-(-self.num_channels // 8), *grid.shape_vox)
        reads = _Reads(self, grid)
        if self.use_all and self.has_all:
            tbits, kbits = (_gather_bytes(table, self._all_ids(reads)) for table in self._all_tables)
        else:
            tbits, kbits = np.zeros(shape, np.uint8), np.zeros(shape, np.uint8)
            self._classes_from_arrays(reads, tbits, kbits)
        self._boundaries(reads, tbits, kbits, first_channel=len(self.plans))
        return tbits, kbits

    def read_ids_and_boundaries(self, grid: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The compact form for the GPU: `all` ids (uint8, `ALL_OUTSIDE` outside the crop) and the packed
        boundary bits `(ceil(A/8), z, y, x)` for target and known; the class bits are `lookup_tables[:, ids]`.

        Raises:
            ValueError: for a crop without an `all` array.
        """
        if not self.has_all:
            raise ValueError(f"{self.name}: no `all` array, so its targets cannot travel as ids")
        reads = _Reads(self, grid)
        cached = self._cached_boundaries(grid) if self.aux_classes and self.boundary_cache_dir else None
        if cached is not None:
            return self._all_ids(reads), *cached
        shape = (-(-len(self.aux_classes) // 8), *grid.shape_vox)
        tbits, kbits = np.zeros(shape, np.uint8), np.zeros(shape, np.uint8)
        self._boundaries(reads, tbits, kbits, first_channel=0)
        return self._all_ids(reads), tbits, kbits

    def _cached_boundaries(self, grid: Grid) -> tuple[np.ndarray, np.ndarray] | None:
        return self._cached_boundaries_for(tuple(grid.voxel_size_nm)).read(grid)

    def _cached_boundaries_for(self, voxel_size_nm: tuple[float, ...]) -> BoundaryCache:
        """The crop's boundary cache at this voxel size, opened (and built if missing) once per process."""
        from cellseg.data.boundary_cache import BoundaryCache

        caches = self.__dict__.setdefault("_boundary_caches", {})
        if voxel_size_nm not in caches:
            caches[voxel_size_nm] = BoundaryCache(self, voxel_size_nm,  # type: ignore[arg-type]
                                                  Path(str(self.boundary_cache_dir)))
        return caches[voxel_size_nm]

    @property
    def lookup_tables(self) -> tuple[np.ndarray, np.ndarray]:
        """Per `all` id (0-255): packed target and known bits of the C channels, each `(ceil(C/8), 256)` uint8;
        the boundary channels are left 0 (they come from the id arrays)."""
        return self._all_tables

    def _all_ids(self, reads: _Reads) -> np.ndarray:
        ids = reads.ids("all", pad_value=ALL_OUTSIDE)
        if ids.dtype != np.uint8:
            ids = np.minimum(ids, ALL_OUTSIDE).astype(np.uint8)  # CellMap ids are <= 77
        return ids

    def _boundaries(self, reads: _Reads, tbits: np.ndarray, kbits: np.ndarray, *, first_channel: int) -> None:
        for j, i in enumerate(self.aux_classes, start=first_channel):
            if len(self.plans[i].read) == 1:  # ids on disk
                name = self.plans[i].read[0]
                _set_bit(tbits, j, touching(reads.ids(name)))
                _set_bit(kbits, j, reads.inside((name,)))

    def _classes_from_arrays(self, reads: _Reads, tbits: np.ndarray, kbits: np.ndarray) -> None:
        for i, plan in enumerate(self.plans):
            if plan.read:
                _set_bit(tbits, i, reads.foreground(plan.read))
                _set_bit(kbits, i, reads.inside(plan.read))
            elif plan.exclusive_ids:
                _set_bit(kbits, i, _lut(plan.exclusive_ids)[reads.ids("all")])
            elif plan.exclusive:
                _set_bit(kbits, i, reads.foreground(plan.exclusive))

    @functools.cached_property
    def _all_tables(self) -> tuple[np.ndarray, np.ndarray]:
        """Per id v of `all` (0-255): packed target bits and packed known bits, shape (ceil(C/8), 256).

        Id 0 (annotated background) is known-negative for every annotated class; `ALL_OUTSIDE` (255, not a
        CellMap id) marks voxels outside the crop: unknown for everything.
        """
        nbytes = -(-self.num_channels // 8)
        t, k = np.zeros((nbytes, 256), np.uint8), np.zeros((nbytes, 256), np.uint8)
        for i, plan in enumerate(self.plans):
            atoms_c, bit = get_class(plan.name).atom_ids, np.uint8(1 << (i & 7))
            if plan.read:
                k[i >> 3, 0] |= bit
            for cls in all_classes():
                if cls.atom_ids <= atoms_c and plan.read:
                    t[i >> 3, cls.id] |= bit
                if cls.atom_ids.isdisjoint(atoms_c) or (plan.read and cls.atom_ids <= atoms_c):
                    k[i >> 3, cls.id] |= bit
        return t, k

    def read_targets(self, grid: Grid, *, use_all: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`(target, known)` on `grid`, both `(C, z, y, x)` bool (C = K classes + boundary channels).

        `use_all=False` forces the per-array path (validation scores against the arrays themselves).
        """
        saved, self.use_all = self.use_all, self.use_all if use_all is None else use_all
        try:
            tbits, kbits = self.read_targets_packed(grid)
        finally:
            self.use_all = saved
        return unpack_bits(tbits, self.num_channels), unpack_bits(kbits, self.num_channels)


class _Reads:
    """Label reads of one grid, each array read once (values and inside-the-array mask)."""

    def __init__(self, crop: CropSource, grid: Grid):
        self.crop, self.grid, self.cache = crop, grid, {}

    def _read(self, name: str, pad_value: int = 0) -> tuple[np.ndarray, np.ndarray]:
        if name not in self.cache:
            self.cache[name] = self.crop.image(name).read(**self.grid.read_kwargs(), interpolation="nearest",
                                                          pad_value=pad_value, return_mask=True)
        return self.cache[name]

    def ids(self, name: str, pad_value: int = 0) -> np.ndarray:
        return self._read(name, pad_value)[0]

    def foreground(self, names: Sequence[str]) -> np.ndarray:
        out = self._read(names[0])[0] > 0
        for n in names[1:]:
            out |= self._read(n)[0] > 0
        return out

    def inside(self, names: Sequence[str]) -> np.ndarray:
        out = self._read(names[0])[1]
        for n in names[1:]:
            out = out & self._read(n)[1]
        return out


def _set_bit(bits: np.ndarray, channel: int, mask: np.ndarray) -> None:
    """bits[channel // 8] |= mask << (channel % 8), in place (a scalar OR when the mask is all True)."""
    bit = np.uint8(1 << (channel & 7))
    if mask.all():
        np.bitwise_or(bits[channel >> 3], bit, out=bits[channel >> 3])
        return
    np.bitwise_or(bits[channel >> 3], mask.view(np.uint8) * bit, out=bits[channel >> 3])


def _gather_bytes(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """`table[:, ids]` for a (nbytes, 256) uint8 table, as one 8-byte gather per voxel plus a transpose."""
    nbytes = table.shape[0]
    wide = np.zeros((256, 8), np.uint8)
    wide[:, :nbytes] = table.T
    gathered = wide.view(np.uint64).ravel()[ids]  # (z, y, x) uint64: the voxel's 8 bytes
    return np.ascontiguousarray(np.moveaxis(gathered.view(np.uint8).reshape(*ids.shape, 8)[..., :nbytes], -1, 0))


def _lut(ids: Sequence[int]) -> np.ndarray:
    """Boolean lookup table over CellMap ids 0-255 that is True at `ids`."""
    table = np.zeros(256, dtype=bool)
    table[list(ids)] = True
    return table


def unpack_bits(bits: np.ndarray, num_channels: int) -> np.ndarray:
    """`(ceil(C/8), ...)` uint8 → `(C, ...)` bool (inverse of the packing above)."""
    out = np.empty((num_channels, *bits.shape[1:]), dtype=bool)
    for c in range(num_channels):
        np.not_equal(bits[c >> 3] & np.uint8(1 << (c & 7)), 0, out=out[c])
    return out


def touching(ids: np.ndarray) -> np.ndarray:
    """Voxels of an object with a 6-neighbour in a different object (background does not count).

    Work is restricted to the bounding box of the objects (instance classes are sparse in a patch).
    """
    out = np.zeros(ids.shape, dtype=bool)
    if not ids.any():
        return out
    mask = ids != 0
    nonzero = [np.flatnonzero(mask.any(axis=tuple(a for a in range(ids.ndim) if a != d))) for d in range(ids.ndim)]
    box = tuple(slice(n[0], n[-1] + 1) for n in nonzero)
    sub, sub_mask, sub_out = ids[box], mask[box], out[box]
    for axis in range(ids.ndim):
        a = [slice(None)] * ids.ndim
        b = [slice(None)] * ids.ndim
        a[axis], b[axis] = slice(1, None), slice(None, -1)
        a, b = tuple(a), tuple(b)
        diff = np.not_equal(sub[a], sub[b])  # in place from here on: no further temporaries
        diff &= sub_mask[a]
        diff &= sub_mask[b]
        sub_out[a] |= diff
        sub_out[b] |= diff
    return out
