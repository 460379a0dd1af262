"""A user's labels → CellMap label arrays: per-class volumes and/or one integer volume with a class mapping.

Two kinds of input, which may be combined (each class from one input only):

- **per-class volumes** (`--label mito=mito.tif`): a binary mask or instance ids (any value > 1 anywhere
  in the volume means ids). A semantically scored class is written as a 0/1 uint8 mask; an instance class
  keeps its ids (uint32), and a binary mask of an instance class becomes ids by 26-connected components,
  as the official ground truth was made.
- **one integer volume with a mapping** (`--labels seg.tif --class-map 1=mito_mem,2=mito_lum,3=er`):
  class c is every voxel whose mapped class lies inside c (the atoms of `mito_mem` are part of `mito`),
  so the arrays of one crop agree with each other. Instance classes become connected components. Each
  voxel holds one class, so the crop also gets the `all` id array (CellMap ids, uint8), which training
  reads all classes from at once; it is written only when every class comes from the mapped volume (a
  per-class volume's voxels would be missing from it).

Class names are checked against the CellMap catalogue (`cellseg.classes`; aliases become short names).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cellseg.classes import get_class, is_instance
from cellseg.data.crops import Geometry
from cellseg.ingest.readers import Box, Volume

log = logging.getLogger(__name__)
INSTANCE_DTYPE = np.uint32  # as `cellseg synth`: one dtype for every instance array
CONNECTIVITY = 26  # the official ground truth's connected components
SCAN_SECTIONS = 16  # sections per read while scanning a label volume's values


def class_name(name: str, source: str) -> str:
    """The catalogue's short name of `name` (aliases accepted).

    Raises:
        ValueError: an unknown class, naming `source` and the closest valid names.
    """
    try:
        return get_class(name.strip()).name
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None


def parse_class_map(text: str) -> dict[int, str]:
    """`1=mito,2=er`, or a YAML/JSON file mapping label values to class names ({1: mito, 2: er}).

    Raises:
        ValueError: malformed entries, value 0 (background), values below 0 or unknown class names.
    """
    path = Path(text)
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        if not path.is_file():
            raise FileNotFoundError(f"--class-map {path}: no such file")
        import yaml

        raw = json.loads(path.read_text()) if path.suffix.lower() == ".json" else yaml.safe_load(path.read_text())
        if not isinstance(raw, Mapping):
            raise ValueError(f"{path}: expected a mapping of label value → class name, e.g. {{1: mito, 2: er}}")
        items, source = list(raw.items()), str(path)
    else:
        items, source = [], f"--class-map {text!r}"
        for part in (p.strip() for p in text.split(",") if p.strip()):
            value, sep, name = part.partition("=")
            if not sep:
                raise ValueError(f"{source}: entry {part!r} is not VALUE=CLASS (e.g. 1=mito)")
            items.append((value, name))
    mapping: dict[int, str] = {}
    for value, name in items:
        try:
            number = int(str(value).strip())
        except ValueError:
            raise ValueError(f"{source}: label value {value!r} is not an integer") from None
        if number < 1:
            raise ValueError(f"{source}: label value {number} must be >= 1 (0 is background)")
        if number in mapping:
            raise ValueError(f"{source}: label value {number} is mapped twice")
        mapping[number] = class_name(str(name), source)
    if not mapping:
        raise ValueError(f"{source}: empty class mapping")
    return mapping


def _integral(slab: np.ndarray, source: str) -> np.ndarray:
    """Check a label block holds non-negative integers; returns it as an integer array."""
    if slab.dtype == np.bool_:
        return slab.astype(np.uint8)
    if np.issubdtype(slab.dtype, np.floating):
        if not np.all(np.isfinite(slab)) or np.any(slab != np.floor(slab)):
            raise ValueError(f"{source}: label values must be whole numbers (found fractions or NaN)")
        slab = slab.astype(np.int64)
    elif not np.issubdtype(slab.dtype, np.integer):
        raise ValueError(f"{source}: label dtype {slab.dtype} is not an integer, boolean or float type")
    if slab.size and slab.min() < 0:
        raise ValueError(f"{source}: label values must be >= 0, found {slab.min()}")
    return slab


def scan_values(volume: Volume, *, distinct: bool) -> tuple[int, set[int]]:
    """(maximum value, distinct values if `distinct` else an empty set) of a label volume, read in slabs."""
    top, values = 0, set()
    for z0 in range(0, volume.shape[0], SCAN_SECTIONS):
        slab = _integral(volume.sections(z0, min(volume.shape[0], z0 + SCAN_SECTIONS)), volume.source)
        top = max(top, int(slab.max(initial=0)))
        if distinct:
            values.update(int(v) for v in np.unique(slab))
    if top > np.iinfo(INSTANCE_DTYPE).max:
        raise ValueError(f"{volume.source}: label value {top} does not fit uint32")
    return top, values


def components(mask: np.ndarray) -> np.ndarray:
    """Instance ids 1..N of a binary mask (26-connected components, uint32)."""
    import cc3d

    return cc3d.connected_components(mask.astype(np.uint8), connectivity=CONNECTIVITY, out_dtype=INSTANCE_DTYPE)


@dataclass(frozen=True, kw_only=True, eq=False)
class ClassVolume:
    """One class from its own volume (`ids`: it holds instance ids rather than a 0/1 mask)."""

    name: str
    volume: Volume
    ids: bool

    def array(self, box: Box) -> np.ndarray:
        """The class's CellMap array over `box` (module docstring)."""
        data = _integral(self.volume.read(box), self.volume.source)
        if not is_instance(self.name):
            return (data > 0).astype(np.uint8)
        return data.astype(INSTANCE_DTYPE) if self.ids else components(data > 0)


@dataclass(frozen=True, kw_only=True, eq=False)
class MappedVolume:
    """Several classes from one integer volume and a value → class mapping."""

    volume: Volume
    mapping: Mapping[int, str]

    def values_of(self, name: str) -> list[int]:
        """Label values whose class lies inside `name` (itself or one of its parts)."""
        atoms = get_class(name).atom_ids
        return [v for v, c in self.mapping.items() if get_class(c).atom_ids <= atoms]

    def arrays(self, box: Box, *, with_all: bool) -> dict[str, np.ndarray]:
        """The arrays of every mapped class over `box`, and `all` (CellMap ids) if `with_all`."""
        data = _integral(self.volume.read(box), self.volume.source)
        out = {}
        for name in dict.fromkeys(self.mapping.values()):
            mask = np.isin(data, self.values_of(name))
            out[name] = components(mask) if is_instance(name) else mask.astype(np.uint8)
        if with_all:
            ids = np.zeros(data.shape, dtype=np.uint8)
            for value, name in self.mapping.items():
                ids[data == value] = get_class(name).id
            out["all"] = ids
        return out


@dataclass(frozen=True, kw_only=True, eq=False)
class Labels:
    """Every label input of an import, on one grid.

    Attributes:
        geometry: the labels' grid (z, y, x; translation = centre of voxel 0), inside the EM's.
        per_class: classes from their own volumes.
        mapped: classes from one integer volume, or None.
    """

    geometry: Geometry
    per_class: tuple[ClassVolume, ...] = ()
    mapped: MappedVolume | None = None
    sources: dict[str, str] = field(default_factory=dict)  # class → input spec (for import.json)

    @property
    def classes(self) -> tuple[str, ...]:
        """The annotated classes: per-class inputs first, then the mapped ones, in the order given."""
        mapped = tuple(dict.fromkeys(self.mapped.mapping.values())) if self.mapped else ()
        return tuple(c.name for c in self.per_class) + mapped

    @property
    def has_all(self) -> bool:
        """True when the crops get an `all` id array (every class from the mapped volume)."""
        return self.mapped is not None and not self.per_class

    def arrays(self, box: Box) -> dict[str, np.ndarray]:
        """The CellMap arrays of one crop (label-grid voxels `box`): one per class, plus `all` if `has_all`."""
        out = {c.name: c.array(box) for c in self.per_class}
        if self.mapped:
            out.update(self.mapped.arrays(box, with_all=self.has_all))
        return out


def build_labels(per_class: Sequence[tuple[str, Volume]], mapped: tuple[Volume, Mapping[int, str]] | None,
                 geometry: Geometry) -> Labels:
    """Check the label inputs (values, classes, shapes) and gather them.

    Raises:
        ValueError: a class given twice, values of the mapped volume without a class, non-integer or
            negative labels, or volumes whose shapes differ from the labels' grid (the file is named).
    """
    seen: dict[str, str] = {}
    volumes = []
    for name, volume in per_class:
        name = class_name(name, f"--label {name}={volume.source}")
        if name in seen:
            raise ValueError(f"class {name} is given twice ({seen[name]} and {volume.source})")
        seen[name] = volume.source
        top, _ = scan_values(volume, distinct=False)
        volumes.append(ClassVolume(name=name, volume=volume, ids=top > 1))
        log.info("%s: %s from %s (%s)", name, "instance ids" if top > 1 else "binary mask", volume.source,
                 "instance" if is_instance(name) else "semantic")
    mapped_volume = None
    if mapped is not None:
        volume, mapping = mapped
        for name in mapping.values():
            if name in seen and seen[name] != volume.source:
                raise ValueError(f"class {name} is given twice ({seen[name]} and {volume.source})")
            seen[name] = volume.source
        _, values = scan_values(volume, distinct=True)
        unmapped = sorted(values - set(mapping) - {0})
        if unmapped:
            raise ValueError(f"{volume.source}: label values {unmapped[:10]} have no class in --class-map "
                             f"(mapped: {sorted(mapping)}); map them or set them to 0")
        mapped_volume = MappedVolume(volume=volume, mapping=dict(mapping))
    for volume in [v.volume for v in volumes] + ([mapped[0]] if mapped else []):
        if volume.shape != geometry.shape_vox:
            raise ValueError(f"{volume.source}: label shape {volume.shape} (z, y, x) differs from "
                             f"{geometry.shape_vox}, the shape of the other label volumes")
    return Labels(geometry=geometry, per_class=tuple(volumes), mapped=mapped_volume, sources=seen)
