"""Reading 2D slices for figures: crops of a data root (EM + labels) and prediction stores.

A figure shows one *plane*: a one-voxel-thick slab of a 3D grid (z, y, x; nm), cut across `axis` at
`index`. Every layer of a figure (EM, truth classes, predictions) is read onto that same slab in world
coordinates, so crops annotated at 2 nm, EM at 4 nm and predictions at 8 nm line up pixel for pixel:
labels by nearest neighbour (ids never averaged), EM by area averaging when coarser.

Crops come from a data root laid out like the challenge's (a `cellseg synth` root or a real download
with its manifests): training crops through `cellseg.data.targets.CropSource` (groups are unions of
their annotated atoms when not on disk), test crops from the root's `ground_truth.zarr` (single-scale
arrays with `voxel_size`/`translation` attributes, the evaluator's layout).
"""

from __future__ import annotations

import json
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from cellseg.classes import all_classes, atoms_of, get_class
from cellseg.data import resample
from cellseg.data.arrays import ArrayReader, MultiscaleImage, open_array
from cellseg.data.class_plan import plan_class
from cellseg.data.crops import TEST_VERSIONS_NEWEST_FIRST, Catalog, Crop, crop_id
from cellseg.data.grid import Grid
from cellseg.data.split import SplitEntry, dataset_paths
from cellseg.data.targets import CropSource

log = logging.getLogger(__name__)
Axis = Literal["z", "y", "x"]
AXES: tuple[Axis, ...] = ("z", "y", "x")
Vec3 = tuple[float, float, float]
TRUTH_STORE = "ground_truth.zarr"  # test-crop labels inside a data root (the evaluator's layout)


@dataclass(frozen=True, kw_only=True)
class Plane:
    """One slice of a 3D grid: `index` along `axis` (voxels of `volume`)."""

    volume: Grid
    axis: Axis
    index: int

    @property
    def num_slices(self) -> int:
        """Voxels of the volume along `axis`."""
        return self.volume.shape_vox[AXES.index(self.axis)]

    @property
    def slab(self) -> Grid:
        """The one-voxel-thick 3D grid of this slice (what every layer is read onto)."""
        a = AXES.index(self.axis)
        translation = list(self.volume.translation_nm)
        translation[a] += self.index * self.volume.voxel_size_nm[a]
        shape = list(self.volume.shape_vox)
        shape[a] = 1
        return Grid(translation_nm=tuple(translation), shape_vox=tuple(shape),  # type: ignore[arg-type]
                    voxel_size_nm=self.volume.voxel_size_nm)

    @property
    def image_axes(self) -> tuple[Axis, Axis]:
        """(row axis, column axis) of the 2D image: (y, x) for a z slice, (z, x) for y, (z, y) for x."""
        return tuple(a for a in AXES if a != self.axis)  # type: ignore[return-value]

    @property
    def pixel_size_nm(self) -> tuple[float, float]:
        """Physical (row, column) size of a pixel."""
        rows, cols = (AXES.index(a) for a in self.image_axes)
        return self.volume.voxel_size_nm[rows], self.volume.voxel_size_nm[cols]

    @property
    def position_nm(self) -> float:
        """World coordinate of the slice centre along `axis`."""
        return self.slab.translation_nm[AXES.index(self.axis)]

    @property
    def extent_nm(self) -> tuple[float, float, float, float]:
        """imshow extent (left, right, bottom, top) in world nm: voxel borders, row 0 at the top."""
        rows, cols = (AXES.index(a) for a in self.image_axes)
        t, v, n = self.volume.translation_nm, self.volume.voxel_size_nm, self.volume.shape_vox
        left, top = t[cols] - v[cols] / 2, t[rows] - v[rows] / 2
        return left, left + n[cols] * v[cols], top + n[rows] * v[rows], top

    def squeeze(self, array: np.ndarray) -> np.ndarray:
        """A slab-shaped (z, y, x) array → its 2D (rows, cols) image."""
        return np.take(array, 0, axis=AXES.index(self.axis))

    def describe(self) -> str:
        """`z=16 of 32 (at 200 nm)`, for titles."""
        return f"{self.axis}={self.index} of {self.num_slices} (at {self.position_nm:g} nm)"


def make_plane(volume: Grid, axis: str = "z", index: int | None = None, *, where: str = "") -> Plane:
    """The plane at `index` along `axis` (default: the middle slice).

    Raises:
        ValueError: unknown axis, or an index outside `0 .. n-1` (the message names `where` and the range).
    """
    if axis not in AXES:
        raise ValueError(f"axis {axis!r} is not one of {AXES}")
    n = volume.shape_vox[AXES.index(axis)]  # type: ignore[arg-type]
    index = n // 2 if index is None else int(index)
    if not 0 <= index < n:
        size = "×".join(f"{v:g}" for v in volume.voxel_size_nm)
        raise ValueError(f"{where + ': ' if where else ''}slice index {axis}={index} is out of range: "
                         f"{n} {axis} slices at {size} nm (valid 0-{n - 1})")
    return Plane(volume=volume, axis=axis, index=index)  # type: ignore[arg-type]


def box_grid(start_nm: Sequence[float], stop_nm: Sequence[float], voxel_size_nm: Sequence[float]) -> Grid:
    """The grid of `voxel_size_nm` voxels covering the box `[start_nm, stop_nm)` (at least one voxel)."""
    shape = tuple(max(1, round((b - a) / v)) for a, b, v in zip(start_nm, stop_nm, voxel_size_nm, strict=True))
    translation = tuple(a + v / 2 for a, v in zip(start_nm, voxel_size_nm, strict=True))
    return Grid(translation_nm=translation, shape_vox=shape,  # type: ignore[arg-type]
                voxel_size_nm=tuple(float(v) for v in voxel_size_nm))  # type: ignore[arg-type]


def parse_voxel_size(value: float | str | Sequence[float] | None) -> Vec3 | None:
    """`8`, `"8"`, `"8,4,4"` or `(8, 4, 4)` → (z, y, x) nm; None stays None.

    Raises:
        ValueError: not 1 or 3 positive numbers.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            parts = [float(p) for p in value.replace("x", ",").split(",") if p.strip()]
        except ValueError:
            raise ValueError(f"voxel size {value!r} is not a number or z,y,x numbers (nm)") from None
    elif isinstance(value, int | float):
        parts = [float(value)]
    else:
        parts = [float(v) for v in value]
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3 or min(parts) <= 0:
        raise ValueError(f"voxel size {value!r}: give one or three positive numbers (z, y, x; nm)")
    return tuple(parts)  # type: ignore[return-value]


def canonical_classes(names: Sequence[str]) -> tuple[str, ...]:
    """Validated short class names (aliases resolved), duplicates dropped, order kept.

    Raises:
        ValueError: an unknown class (with the closest valid names).
    """
    return tuple(dict.fromkeys(get_class(n.strip()).name for n in names if n.strip()))


def _read_em(em_url: str | None, grid: Grid) -> np.ndarray | None:
    """EM on `grid` as float32 (NaN outside the imaged volume); None without an EM group."""
    if em_url is None:
        return None
    try:
        em = MultiscaleImage(em_url, backend="zarr")
    except FileNotFoundError:
        log.warning("%s: no EM group here; drawing labels without EM", em_url)
        return None
    return em.read(**grid.read_kwargs(), interpolation="area", pad_value=np.nan, dtype="float32")  # type: ignore[return-value]


class CropView(ABC):
    """A crop opened for figures: its EM, which classes can be shown, and slab reads of them.

    Build one with `open_crop`. `classes` are the classes annotated in the crop plus the groups whose
    atoms all are; `box_start_nm`/`box_stop_nm` span the annotated arrays; `voxel_size_nm` is the
    finest annotation voxel size (the default grid of a figure).
    """

    name: str
    dataset: str
    kind: Literal["train", "test"]
    classes: tuple[str, ...]
    box_start_nm: Vec3
    box_stop_nm: Vec3
    voxel_size_nm: Vec3
    em_url: str | None

    def grid(self, voxel_size_nm: Sequence[float] | None = None) -> Grid:
        """The crop's box on a grid of `voxel_size_nm` (default: the finest annotation's)."""
        return box_grid(self.box_start_nm, self.box_stop_nm, voxel_size_nm or self.voxel_size_nm)

    def check_classes(self, names: Sequence[str]) -> tuple[str, ...]:
        """Canonical names, each shown to be readable in this crop.

        Raises:
            ValueError: an unknown class, or one this crop does not annotate.
        """
        names = canonical_classes(names)
        missing = [n for n in names if n not in self.classes]
        if missing:
            raise ValueError(f"{self.name} ({self.dataset}) does not annotate {', '.join(missing)}; "
                             f"it annotates: {', '.join(self.classes)}")
        return names

    def em(self, grid: Grid) -> np.ndarray | None:
        """EM on `grid` (float32, NaN outside the imaged volume), or None without EM."""
        return _read_em(self.em_url, grid)

    @abstractmethod
    def masks(self, grid: Grid, names: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Class → (foreground, annotated) bool arrays on `grid`."""

    @abstractmethod
    def ids(self, grid: Grid, name: str) -> np.ndarray | None:
        """Object ids of an instance class on `grid`, or None where only a union of atoms exists."""


class TrainingCrop(CropView):
    """A training crop of a catalogue, read through `CropSource` (the training targets' own code)."""

    def __init__(self, catalog: Catalog, crop: Crop):
        self.name, self.dataset, self.kind = crop.name, crop.dataset, "train"
        self._entry = SplitEntry(split="train", em_url=str(catalog.locate(crop.em_url)),
                                 crop_url=str(catalog.locate(crop.crop_url)), classes=crop.classes)
        self.em_url = self._entry.em_url
        probe = self._source(crop.classes)
        self.classes = tuple(c.name for c in all_classes()
                             if plan_class(c.name, probe.on_disk, has_all=probe.has_all).read)
        self.box_start_nm, self.box_stop_nm = probe.start_nm, probe.stop_nm
        self.voxel_size_nm = probe.label_voxel_size_nm
        self._probe = probe

    def _source(self, names: Sequence[str]) -> CropSource:
        return CropSource.open(self._entry, names, backend="zarr")

    def masks(self, grid: Grid, names: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        names = self.check_classes(names)
        if not names:
            return {}
        target, known = self._source(names).read_targets(grid, use_all=False)
        return {n: (target[k], known[k]) for k, n in enumerate(names)}

    def ids(self, grid: Grid, name: str) -> np.ndarray | None:
        if name not in self._probe.on_disk or not get_class(name).instance:
            return None
        return self._probe.image(name).read(**grid.read_kwargs(), interpolation="nearest", pad_value=0)  # type: ignore[return-value]


class HeldOutCrop(CropView):
    """A test crop: labels from the root's `ground_truth.zarr/crop<N>/<label>` (single-scale arrays with
    `voxel_size` and `translation` attributes), EM from its dataset in the root."""

    def __init__(self, root: Path, crop: Crop):
        self.name, self.dataset, self.kind = crop.name, crop.dataset, "test"
        self._dir = root / TRUTH_STORE / crop.name
        if not self._dir.is_dir():
            raise FileNotFoundError(f"{self._dir}: no ground truth for test crop {crop.name} in {root}")
        self._arrays: dict[str, tuple[ArrayReader, Vec3, Vec3]] = {}
        for path in sorted(self._dir.iterdir()):
            if (path / ".zarray").is_file() and path.name in {c.name for c in all_classes()}:
                reader = open_array(str(path), backend="zarr")
                attrs = _json(path / ".zattrs")
                try:
                    vs, tr = tuple(attrs["voxel_size"]), tuple(attrs["translation"])
                except KeyError as err:
                    raise ValueError(f"{path}: ground-truth array lacks the {err} attribute") from None
                self._arrays[path.name] = (reader, vs, tr)  # type: ignore[assignment]
        if not self._arrays:
            raise ValueError(f"{self._dir}: holds no label arrays")
        self.classes = tuple(c.name for c in all_classes() if c.name in self._arrays
                             or (c.is_group and all(a in self._arrays for a in atoms_of(c.name))))
        starts = [[t - v / 2 for t, v in zip(tr, vs, strict=True)] for _, vs, tr in self._arrays.values()]
        stops = [[t - v / 2 + n * v for t, v, n in zip(tr, vs, r.shape, strict=True)]
                 for r, vs, tr in self._arrays.values()]
        self.box_start_nm = tuple(np.min(starts, axis=0).tolist())  # type: ignore[assignment]
        self.box_stop_nm = tuple(np.max(stops, axis=0).tolist())  # type: ignore[assignment]
        self.voxel_size_nm = tuple(np.min([vs for _, vs, _ in self._arrays.values()], axis=0).tolist())  # type: ignore[assignment]
        em_url, _ = dataset_paths(root, crop.dataset)
        self.em_url = em_url

    def _read(self, name: str, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
        reader, vs, tr = self._arrays[name]
        return read_nearest(reader, voxel_size_nm=vs, translation_nm=tr, grid=grid)

    def masks(self, grid: Grid, names: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        out = {}
        for name in self.check_classes(names):
            parts = [name] if name in self._arrays else list(atoms_of(name))
            reads = [self._read(p, grid) for p in parts]
            out[name] = (np.logical_or.reduce([v > 0 for v, _ in reads]),
                         np.logical_and.reduce([inside for _, inside in reads]))
        return out

    def ids(self, grid: Grid, name: str) -> np.ndarray | None:
        if name not in self._arrays or not get_class(name).instance:
            return None
        return self._read(name, grid)[0]


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def read_nearest(reader: ArrayReader, *, voxel_size_nm: Sequence[float], translation_nm: Sequence[float],
                 grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """Nearest-neighbour read of a plain (z, y, x) array onto `grid`: (values, inside) with values 0
    outside the array. `translation_nm` is the centre of the array's voxel 0."""
    taps = [resample.axis_taps((t_out - t) / v, v_out / v, n_out, n_src, "nearest")
            for t_out, v_out, n_out, t, v, n_src in zip(grid.translation_nm, grid.voxel_size_nm, grid.shape_vox,
                                                      translation_nm, voxel_size_nm, reader.shape, strict=True)]
    inside = resample.inside_mask(taps)
    region = tuple(slice(int(t.index.min()), int(t.index.max()) + 1) for t in taps)
    values = resample.apply_taps(reader.read(region), taps, offsets=tuple(r.start for r in region))
    return np.where(inside, values, np.zeros((), dtype=values.dtype)), inside


def open_crop(root: str | os.PathLike[str], crop: int | str) -> CropView:
    """Open crop `crop` (234 or "crop234") of a data root: a training crop, else a test crop.

    Raises:
        FileNotFoundError: `root` is not a data root (no manifests).
        ValueError: no such crop in the root (the message lists the crops there).
    """
    root = Path(root)
    catalog = Catalog.from_dir(root)
    number = crop_id(crop)
    if number in catalog.train:
        return TrainingCrop(catalog, catalog.train[number])
    for version in TEST_VERSIONS_NEWEST_FIRST:
        if number in catalog.tests.get(version, {}):
            return HeldOutCrop(root, catalog.tests[version][number])
    tests = sorted({c for crops in catalog.tests.values() for c in crops})
    raise ValueError(f"crop {number} is not in {root}: training crops {_ids(catalog.train)}"
                     + (f", test crops {_ids(tests)}" if tests else ""))


def _ids(ids: Sequence[int] | dict[int, object], limit: int = 20) -> str:
    ids = sorted(ids)
    shown = ", ".join(map(str, ids[:limit]))
    return shown + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")
