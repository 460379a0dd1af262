"""Training targets with unknown-masking: a `(K, z, y, x)` target and a `(K, z, y, x)` *known* mask per patch.

For each configured class k, in a given crop:
1. annotated on disk → read it (nearest neighbour, never averaged), known inside the annotated crop;
2. otherwise a group whose atoms are all annotated → the union of the atoms, known where they all are;
3. otherwise unknown — except where a *mutually exclusive* class (disjoint atom sets, see `classes.py`)
   is positive: there the class is known-negative. The evidence comes from the crop's `all` array (atom
   ids, one read for every class) when present, else from the annotated exclusive classes themselves
   (only the maximal ones: `nuc` covers `ne_mem`).
Voxels outside the annotated crop are unknown; so are voxels an array stores as "unknown" and whole arrays that
were never annotated (both from the arrays' CellMap annotation metadata: `cellseg.data.annotation`), and EM
padding (handled by the dataset, which reads the EM: `cellseg.data.padding`).

Fast path: when the crop has its `all` array (atom ids) and `use_all` is on, every class channel comes from
that one array through lookup tables: a voxel with id v is positive for class c when atoms(v) ⊆ atoms(c),
known-negative when they are disjoint, and unknown when they only overlap (v is a coarser group there).
One read and one gather replace ~50 array reads; the result equals the per-array path on consistent data. A crop
whose class arrays may hold "unknown" voxels (their metadata says so) takes the per-array path: unknown is per
class there, while an id carries one answer for every class (`CropSource.ids_exact`).

With `boundaries=True`, every instance-scored class k also gets an auxiliary channel (after the K class
channels, in class order): the voxels of an object that touch a *different* object (6-neighbourhood).
Touching objects merge in a binary mask; this channel is what lets the watershed split them again. It is
known only where the class is read from an id array (a union of atoms carries no ids).

A crop is an immutable value (`CropSource.open` does the I/O once: lists the label groups, reads their annotation
metadata and drops the arrays that were never annotated, finds the annotated box, checks it against the EM, plans
every class). Its open array handles live apart, in one `CropArrays` per process: pickled into a DataLoader worker
it travels empty and re-opens there.

How each class is planned and its `all`-id lookup tables: `cellseg.data.class_plan`; the bit packing and the
boundary rule (`touching`): `cellseg.data.target_bits`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from cellseg.data.annotation import (
    NO_METADATA,
    LabelAnnotation,
    LabelReads,
    read_annotation,
    unannotated_arrays,
)
from cellseg.data.arrays import DEFAULT_CACHE_BYTES, Backend, MultiscaleImage
from cellseg.data.boundary_cache import BoundaryCache, PackedBits, cache_path, lattice_grid
from cellseg.data.class_plan import ClassPlan, aux_class_indices, id_lookup_tables, plan_class
from cellseg.data.grid import Grid, Vec3, vec3
from cellseg.data.split import SplitEntry
from cellseg.data.target_bits import gather_bytes, id_table, set_bit, touching, unpack_bits

log = logging.getLogger(__name__)
ALL_OUTSIDE = 255  # pad value of `all` reads: not a CellMap id, so "outside the crop" stays unknown
EM_OVERHANG_TOLERANCE = 1e-6  # share of the annotated box outside the EM still taken as "inside" (float noise)
T = TypeVar("T")


class UnusableCrop(ValueError):
    """The crop is well formed but cannot give a training sample (its annotated box lies wholly outside its EM):
    training skips it and records why. Malformed data (an EM that is not uint8, a label group without metadata)
    raises a plain `ValueError` instead, which stops training."""


class NoRequestedClass(UnusableCrop):
    """The crop annotates none of the requested classes (common: a split lists crops of every class)."""


class CropArrays:
    """The open handles of one crop: its label groups, its EM and its boundary caches, opened on first use.

    Handles belong to one process: pickled (into a DataLoader worker) this travels with the locations only,
    and the worker opens its own handles on first use.
    """

    def __init__(self, crop_url: str, em_url: str, *, backend: Backend, cache_bytes: int):
        self.crop_url, self.em_url, self.backend, self.cache_bytes = crop_url, em_url, backend, cache_bytes
        self._open: dict[Hashable, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": {}}

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        """The handle under `key`, made with `make()` the first time this process asks for it."""
        if key not in self._open:
            self._open[key] = make()
        return self._open[key]

    def label(self, name: str) -> MultiscaleImage:
        """The multiscale label group `name` of the crop ("all" included)."""
        return self.get(("label", name), lambda: MultiscaleImage(os.path.join(self.crop_url, name),
                                                                 backend=self.backend, cache_bytes=self.cache_bytes))

    def em(self) -> MultiscaleImage:
        """The dataset's EM group (must be uint8)."""
        return self.get(("em",), lambda: MultiscaleImage(self.em_url, backend=self.backend, expected_dtype="uint8",
                                                         cache_bytes=self.cache_bytes))


@dataclass(frozen=True, kw_only=True)
class CropSource:
    """One training crop: where its EM and label arrays are, its annotated box and how each class is built.

    Made by `CropSource.open`; no method changes it. Reads go through `arrays` (this process's handles).

    Example:
        >>> crop = CropSource.open(entry, ("mito", "er"), boundaries=True)
        >>> target, known = crop.read_targets(grid)  # (C, z, y, x) bool each
    """

    entry: SplitEntry
    classes: tuple[str, ...]
    on_disk: tuple[str, ...]  # listed classes with an annotated label group (`all` excluded)
    has_all: bool  # the crop has its `all` array of atom ids
    plans: tuple[ClassPlan, ...]
    start_nm: Vec3  # annotated box: lower corner (z, y, x)
    stop_nm: Vec3  # upper corner
    label_voxel_size_nm: Vec3  # finest voxel size of its label arrays
    boundaries: bool
    boundary_cache_dir: Path | None  # where `boundary_cache` keeps the boundary bits (None: per sample)
    arrays: CropArrays = field(repr=False, compare=False)
    notes: dict[str, LabelAnnotation] = field(repr=False, compare=False)  # of `on_disk` and `all`
    # Per `all` id (0-255): packed target and known bits of the C channels, each `(ceil(C/8), 256)` uint8; the
    # boundary channels are left 0 (they come from the id arrays). Computed once, when the crop is opened.
    lookup_tables: tuple[np.ndarray, np.ndarray] = field(repr=False, compare=False)

    @classmethod
    def open(cls, entry: SplitEntry, classes: Sequence[str], *, backend: Backend = "tensorstore",
             cache_bytes: int = DEFAULT_CACHE_BYTES, boundaries: bool = False,
             boundary_cache_dir: str | os.PathLike[str] | None = None) -> CropSource:
        """Open the crop of a datasplit row for the classes `classes`.

        Raises:
            FileNotFoundError: the crop folder does not exist.
            NoRequestedClass: the crop annotates none of `classes` (an `UnusableCrop`, a `ValueError`).
            UnusableCrop: the annotated box lies wholly outside the EM.
            ValueError: malformed data (an EM that is not uint8, a label group without OME-NGFF metadata).
        """
        crop_dir, classes = Path(entry.crop_url), tuple(classes)
        if not crop_dir.is_dir():
            raise FileNotFoundError(f"{crop_dir}: crop folder of datasplit row {entry.crop_name} not found")
        present = _label_groups(crop_dir, entry.classes)
        on_disk = tuple(c for c in entry.classes if c in present and c != "all")
        has_all = "all" in present
        _plans_or_raise(crop_dir, classes, on_disk, has_all)  # before any array is opened: the common skip is cheap
        arrays = CropArrays(entry.crop_url, entry.em_url, backend=backend, cache_bytes=cache_bytes)
        images = {n: arrays.label(n) for n in on_disk + (("all",) if has_all else ())}
        notes = {n: read_annotation(image) for n, image in images.items()}
        dropped = unannotated_arrays(images, notes, crop=str(crop_dir))
        on_disk = tuple(n for n in on_disk if n not in dropped)
        notes = {n: note for n, note in notes.items() if n not in dropped}
        plans = _plans_or_raise(crop_dir, classes, on_disk, has_all)
        start, stop, label_vs = _annotated_box([images[n] for n in notes])
        _check_inside_em(crop_dir, start, stop, arrays.em())
        num_channels = len(plans) + len(aux_class_indices(classes, boundaries))
        return cls(entry=entry, classes=classes, on_disk=on_disk, has_all=has_all, plans=plans, start_nm=start,
                   stop_nm=stop, label_voxel_size_nm=label_vs, boundaries=boundaries,
                   boundary_cache_dir=None if boundary_cache_dir is None else Path(boundary_cache_dir),
                   arrays=arrays, notes=notes, lookup_tables=id_lookup_tables(plans, num_channels))

    def image(self, name: str) -> MultiscaleImage:
        """The multiscale label group `name` of this crop ("all" included), opened once per process."""
        return self.arrays.label(name)

    def em(self) -> MultiscaleImage:
        """The dataset's EM group (uint8), opened once per process."""
        return self.arrays.em()

    def annotation(self, name: str) -> LabelAnnotation:
        """The annotation metadata of the label group `name` ("all" included; defaults for a group without)."""
        return self.notes.get(name) or NO_METADATA

    @property
    def name(self) -> str:
        """`crop<N>`."""
        return self.entry.crop_name

    @property
    def dataset(self) -> str:
        """`jrc_hela-2` from the EM location `.../jrc_hela-2/jrc_hela-2.zarr/recon-1/em/fibsem-uint8` ("" if none)."""
        parts = [p for p in self.entry.em_url.replace("\\", "/").split("/") if p.endswith(".zarr")]
        return parts[-1].removesuffix(".zarr") if parts else ""

    @property
    def ids_exact(self) -> bool:
        """True when the `all` ids give the targets the class arrays give: the crop has `all` and no array a class
        reads may hold "unknown" voxels (unknown is per class there; an id answers for every class at once)."""
        return self.has_all and not any(self.annotation(n).may_hold_unknown for p in self.plans for n in p.read)

    @property
    def aux_classes(self) -> tuple[int, ...]:
        """Indices of the classes that get a boundary channel (instance-scored ones, if enabled)."""
        return aux_class_indices(self.classes, self.boundaries)

    @property
    def num_channels(self) -> int:
        """K class channels plus the boundary channels."""
        return len(self.plans) + len(self.aux_classes)

    def read_targets(self, grid: Grid, *, use_all: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """`(target, known)` on `grid`, both `(C, z, y, x)` bool (C = K classes + boundary channels).

        `use_all=False` forces the per-array path (validation scores against the arrays themselves).
        """
        tbits, kbits = self.read_targets_packed(grid, use_all=use_all)
        return unpack_bits(tbits, self.num_channels), unpack_bits(kbits, self.num_channels)

    def read_targets_packed(self, grid: Grid, *, use_all: bool = True) -> PackedBits:
        """`(target_bits, known_bits)` on `grid`, each `(ceil(C / 8), z, y, x)` uint8 (channel c = bit c % 8
        of byte c // 8), written channel by channel without ever holding C boolean volumes.

        `use_all=False` forces the per-array path even when the crop has its `all` array.
        """
        shape = (-(-self.num_channels // 8), *grid.shape_vox)
        reads = LabelReads(self, grid)
        if use_all and self.ids_exact:
            tbits, kbits = (gather_bytes(table, self._all_ids(reads)) for table in self.lookup_tables)
        else:
            tbits, kbits = np.zeros(shape, np.uint8), np.zeros(shape, np.uint8)
            self._classes_from_arrays(reads, tbits, kbits)
        self._set_boundaries(reads, tbits, kbits, first_channel=len(self.plans))
        return tbits, kbits

    def read_ids_and_boundaries(self, grid: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The compact form for the GPU: `all` ids (uint8, `ALL_OUTSIDE` outside the crop) and the packed
        boundary bits `(ceil(A/8), z, y, x)` for target and known; the class bits are `lookup_tables[:, ids]`.

        Raises:
            ValueError: for a crop without an `all` array, or whose class arrays hold unknown voxels (`ids_exact`).
        """
        if not self.ids_exact:
            why = "class arrays that may hold unknown voxels" if self.has_all else "no `all` array"
            raise ValueError(f"{self.name}: {why}, so its targets cannot travel as ids")
        reads = LabelReads(self, grid)
        use_cache = bool(self.aux_classes) and self.boundary_cache_dir is not None
        cached = self.boundary_cache(grid.voxel_size_nm).read(grid) if use_cache else None
        tbits, kbits = cached if cached is not None else self._boundary_bits(reads)
        return self._all_ids(reads), tbits, kbits

    def boundary_bits(self, grid: Grid) -> PackedBits:
        """The A boundary channels alone on `grid`: packed `(target, known)`, each `(ceil(A/8), z, y, x)` uint8."""
        return self._boundary_bits(LabelReads(self, grid))

    def boundary_cache(self, voxel_size_nm: Sequence[float]) -> BoundaryCache:
        """The crop's boundary cache at this training voxel size, opened (and built if missing) once per process.

        Raises:
            ValueError: the crop was opened without a boundary cache folder.
        """
        cache_dir = self.boundary_cache_dir
        if cache_dir is None:
            raise ValueError(f"{self.name}: opened without a boundary cache folder (data.boundary_cache)")
        vs = vec3(voxel_size_nm)
        return self.arrays.get(("boundary_cache", vs), lambda: self._open_boundary_cache(cache_dir, vs))

    def _open_boundary_cache(self, cache_dir: Path, voxel_size_nm: Vec3) -> BoundaryCache:
        level = self.em().choose_level(voxel_size_nm)
        grid = lattice_grid(self.start_nm, self.stop_nm, lattice_translation_nm=level.translation_nm,
                            voxel_size_nm=voxel_size_nm)
        channels = [self.classes[i] for i in self.aux_classes]
        id_arrays = [self.plans[i].read[0] for i in self.aux_classes if len(self.plans[i].read) == 1]
        inputs: dict[str, object] = {"crop": self.entry.crop_url, "aux": channels,
                                     "arrays": {n: repr(self.image(n).levels[0]) for n in id_arrays}}
        unknown = {n: self.annotation(n).encoding.unknown for n in id_arrays if self.annotation(n).may_hold_unknown}
        if unknown:  # only then: the keys of caches built before the metadata was read stay valid
            inputs["unknown"] = unknown
        path = cache_path(cache_dir, self.name, grid, inputs=inputs)
        return BoundaryCache(path, grid, compute=self.boundary_bits, channels=channels, backend=self.arrays.backend,
                             cache_bytes=self.arrays.cache_bytes)

    def _all_ids(self, reads: LabelReads) -> np.ndarray:
        ids = reads.ids("all", pad_value=ALL_OUTSIDE)
        unknown = self.annotation("all").encoding.unknown
        if unknown is not None and unknown != ALL_OUTSIDE:
            ids = np.where(ids == unknown, np.asarray(ALL_OUTSIDE, ids.dtype), ids)
        if ids.dtype != np.uint8:
            ids = np.minimum(ids, ALL_OUTSIDE).astype(np.uint8)  # CellMap ids are <= 77
        return ids

    def _boundary_bits(self, reads: LabelReads) -> PackedBits:
        shape = (-(-len(self.aux_classes) // 8), *reads.grid.shape_vox)
        tbits, kbits = np.zeros(shape, np.uint8), np.zeros(shape, np.uint8)
        self._set_boundaries(reads, tbits, kbits, first_channel=0)
        return tbits, kbits

    def _set_boundaries(self, reads: LabelReads, tbits: np.ndarray, kbits: np.ndarray, *, first_channel: int) -> None:
        for j, i in enumerate(self.aux_classes, start=first_channel):
            if len(self.plans[i].read) == 1:  # ids on disk
                name = self.plans[i].read[0]
                set_bit(tbits, j, touching(reads.object_ids(name)))
                set_bit(kbits, j, reads.known((name,)))

    def _classes_from_arrays(self, reads: LabelReads, tbits: np.ndarray, kbits: np.ndarray) -> None:
        for i, plan in enumerate(self.plans):
            if plan.read:
                set_bit(tbits, i, reads.foreground(plan.read))
                set_bit(kbits, i, reads.known(plan.read))
            elif plan.exclusive_ids:
                set_bit(kbits, i, id_table(plan.exclusive_ids)[reads.ids("all")])
            elif plan.exclusive:
                set_bit(kbits, i, reads.foreground(plan.exclusive))


def _plans_or_raise(crop_dir: Path, classes: Sequence[str], on_disk: Sequence[str], has_all: bool
                    ) -> tuple[ClassPlan, ...]:
    plans = tuple(plan_class(c, on_disk, has_all=has_all) for c in classes)
    if not any(p.known for p in plans):
        raise NoRequestedClass(f"{crop_dir}: annotates none of the requested classes {list(classes)}")
    return plans


def _label_groups(crop_dir: Path, listed: Sequence[str]) -> set[str]:
    """The label groups of a crop folder (those with `.zattrs`); listed ones that are not there are logged."""
    present = {p.name for p in crop_dir.iterdir() if (p / ".zattrs").is_file()}
    for name in sorted((set(listed) | {"all"}) - present):
        if (crop_dir / name).is_dir():
            log.warning("%s is missing: label group %s is treated as unannotated", crop_dir / name / ".zattrs", name)
    not_found = sorted(n for n in set(listed) - present - {"all"} if not (crop_dir / n).is_dir())
    if not_found:
        log.warning("%s: classes listed but not on disk, treated as unannotated: %s", crop_dir, not_found)
    return present


def _annotated_box(labels: Sequence[MultiscaleImage]) -> tuple[Vec3, Vec3, Vec3]:
    """The box covered by the finest levels of `labels` (lower and upper corner, nm) and the finest voxel size."""
    starts, stops, sizes = [], [], []
    for image in labels:
        lv = image.levels[0]
        start = np.asarray(lv.translation_nm) - np.asarray(lv.voxel_size_nm) / 2
        starts.append(start)
        stops.append(start + np.asarray(lv.shape_vox) * np.asarray(lv.voxel_size_nm))
        sizes.append(lv.voxel_size_nm)
    return vec3(np.min(starts, axis=0)), vec3(np.max(stops, axis=0)), vec3(np.min(sizes, axis=0))


def _check_inside_em(crop_dir: Path, start_nm: Vec3, stop_nm: Vec3, em: MultiscaleImage) -> None:
    """Warn when part of the annotated box lies outside the EM's finest level (samples there read only
    padding); raise when all of it does."""
    lv = em.levels[0]
    em_start = np.asarray(lv.translation_nm) - np.asarray(lv.voxel_size_nm) / 2
    em_stop = em_start + np.asarray(lv.shape_vox) * np.asarray(lv.voxel_size_nm)
    start, stop = np.asarray(start_nm), np.asarray(stop_nm)
    overlap = np.clip(np.minimum(stop, em_stop) - np.maximum(start, em_start), 0.0, None)
    outside = 1.0 - float(np.prod(overlap / (stop - start)))
    where = f"annotated box {_box(start, stop)} nm, EM {em.location} {_box(em_start, em_stop)} nm"
    if not overlap.all():
        raise UnusableCrop(f"{crop_dir}: its annotated box lies wholly outside its EM ({where})")
    if outside > EM_OVERHANG_TOLERANCE:
        log.warning("%s: %.1f%% of its annotated box lies outside its EM (%s); samples there read padding",
                    crop_dir, 100 * outside, where)


def _box(start: np.ndarray, stop: np.ndarray) -> str:
    """`[z0, y0, x0]-[z1, y1, x1]` (z, y, x; nm)."""
    return f"[{', '.join(f'{v:g}' for v in start)}]-[{', '.join(f'{v:g}' for v in stop)}]"


