"""What a label array says about each voxel: its CellMap annotation metadata and the one rule that reads it.

Real CellMap label arrays carry, in `.zattrs` (schema `cellmap_schemas.annotation`)::

    {"cellmap": {"annotation": {
        "class_name": "mito",
        "annotation_type": {"type": "semantic_segmentation" | "instance_segmentation",
                            "encoding": {"absent": 0, "unknown": 255, "present": 1}},
        "complement_counts": {"absent": 3200000, "unknown": 0}}}}

`encoding` maps the possibilities to the values stored ("present" only for semantic arrays); `complement_counts`
says how many voxels of that array hold the "absent" and "unknown" values (a possibility it omits occurs 0 times):
the positives are the rest. The multiscale group may hold the class name and type, each level array its own
counts; cellseg reads level `s0`'s attributes over the group's (`read_annotation`).

The voxel rule (`Encoding`), shared by the training targets (`cellseg.data.targets`) and the scoring truth
(`cellseg.eval.truth`), so that both agree:
- a voxel outside the array, or at the "unknown" value, is unknown: neither positive nor negative;
- a voxel at the "absent" value is a known negative;
- any other value is positive ("present", any other non-absent value of a semantic array, an object id).
An array without the metadata reads as it always has: 0 absent, every other value positive, nothing unknown.

Whole arrays (`unannotated_arrays`, decided once when a crop is opened): an array whose counts say every voxel is
unknown is not annotated; nor is an array with no positive voxel while an array of a class it contains (an atom
or a smaller group) has some, or the crop's `all` array holds such ids: `mito` all zero while `mito_mem` has
voxels was never annotated, it does not say "no mitochondria". The evidence is cheap: the counts when present,
else one small level of each array (`COARSE_MAX_VOXELS`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

import numpy as np

from cellseg.classes import all_classes, get_class
from cellseg.data.arrays import Level, MultiscaleImage
from cellseg.data.grid import Grid

log = logging.getLogger(__name__)
TYPES = ("semantic_segmentation", "instance_segmentation")
POSSIBILITIES = ("absent", "unknown", "present")
COARSE_MAX_VOXELS = 64**3  # the level read for evidence: the finest one this small (256 KiB of uint8)
_REPORTED: set[str] = set()  # crops whose unannotated arrays were already logged by this process


@dataclass(frozen=True, kw_only=True)
class Encoding:
    """The stored value of each possibility (None: the array never stores it).

    Example:
        >>> enc = Encoding(absent=0, unknown=255)
        >>> enc.positive(np.array([0, 1, 7, 255]))
        array([False,  True,  True, False])
    """

    absent: int | None = 0
    unknown: int | None = None
    present: int | None = None

    def known(self, values: np.ndarray, inside: np.ndarray | None = None) -> np.ndarray:
        """Voxels that are annotated: inside the array (`inside`, default everywhere) and not at "unknown".
        Without an "unknown" value this is `inside` itself (not a copy)."""
        if self.unknown is None:
            return np.ones(values.shape, dtype=bool) if inside is None else inside
        known = values != self.unknown
        if inside is not None:
            known &= inside
        return known

    def positive(self, values: np.ndarray, known: np.ndarray | None = None) -> np.ndarray:
        """Voxels where the class is: known (`known`, default `self.known(values)`) and not at "absent"."""
        known = self.known(values) if known is None else known
        if self.absent is None:
            return known.copy()
        positive = values != self.absent
        positive &= known
        return positive

    def object_ids(self, values: np.ndarray, known: np.ndarray | None = None) -> np.ndarray:
        """The values at positive voxels and 0 elsewhere (object ids of an instance array)."""
        return np.where(self.positive(values, known), values, 0).astype(values.dtype, copy=False)


DEFAULT_ENCODING = Encoding()  # no metadata: 0 absent, every other value positive, nothing unknown


@dataclass(frozen=True, kw_only=True)
class LabelAnnotation:
    """The annotation metadata of one label group, as it applies to its level `s0`."""

    encoding: Encoding = DEFAULT_ENCODING
    num_voxels: int  # of level s0
    counts: Mapping[str, int] | None = None  # complement counts of s0 ("absent", "unknown"); None: not recorded
    class_name: str = ""

    @property
    def positives(self) -> int | None:
        """Positive voxels of `s0` by its counts (None without counts)."""
        return None if self.counts is None else self.num_voxels - sum(self.counts.values())

    @property
    def entirely_unknown(self) -> bool:
        """The counts say every voxel is unknown: nothing was annotated."""
        return self.counts is not None and self.counts.get("unknown", 0) >= self.num_voxels

    @property
    def may_hold_unknown(self) -> bool:
        """Some voxel may be unknown: the encoding has the value and the counts do not rule it out."""
        return self.encoding.unknown is not None and (self.counts is None or self.counts.get("unknown", 0) > 0)


NO_METADATA = LabelAnnotation(num_voxels=0)  # what a label group without annotation metadata reads as


def _annotation_node(attrs: Mapping[str, Any] | None) -> Mapping[str, Any]:
    node = (attrs or {}).get("cellmap")
    node = node.get("annotation") if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise ValueError(f"{where}: {value!r} is not an integer")
    return int(value)


def parse_annotation(group_attrs: Mapping[str, Any] | None, array_attrs: Mapping[str, Any] | None, *,
                     num_voxels: int, source: str) -> LabelAnnotation:
    """The annotation of a label group from its `.zattrs` and its `s0` array's (the array's keys win).

    Raises:
        ValueError: malformed metadata (named with `source`, e.g. the group's path, and the key).
    """
    node = {**_annotation_node(group_attrs), **_annotation_node(array_attrs)}
    where = f"{source}: cellmap.annotation"
    if not node:
        return LabelAnnotation(num_voxels=num_voxels)
    kind = node.get("annotation_type") or {}
    if not isinstance(kind, Mapping) or kind.get("type", TYPES[0]) not in TYPES:
        raise ValueError(f"{where}.annotation_type={kind!r}: its type must be one of {list(TYPES)}")
    encoding = kind.get("encoding", {"absent": 0})
    if not isinstance(encoding, Mapping) or set(encoding) - set(POSSIBILITIES):
        raise ValueError(f"{where}.annotation_type.encoding={encoding!r}: keys must be among {list(POSSIBILITIES)}")
    values = {k: _int(v, f"{where}.annotation_type.encoding.{k}") for k, v in encoding.items()}
    counts = node.get("complement_counts")
    if counts is not None:
        if not isinstance(counts, Mapping) or set(counts) - {"absent", "unknown"}:
            raise ValueError(f"{where}.complement_counts={counts!r}: expected a mapping of 'absent'/'unknown' "
                             "to voxel counts")
        counts = {k: _int(v, f"{where}.complement_counts.{k}") for k, v in counts.items()}
    return LabelAnnotation(encoding=Encoding(absent=values.get("absent"), unknown=values.get("unknown"),
                                             present=values.get("present")),
                           num_voxels=num_voxels, counts=counts, class_name=str(node.get("class_name", "")))


def read_annotation(image: MultiscaleImage) -> LabelAnnotation:
    """The annotation metadata of an opened label group (defaults when it has none; see the module docstring).

    Raises:
        ValueError: malformed metadata.
    """
    s0 = image.levels[0]
    return parse_annotation(image.location.read_json(".zattrs"), image.location.join(s0.path).read_json(".zattrs"),
                            num_voxels=int(np.prod(s0.shape_vox)), source=str(image.location))


def coarse_level(image: MultiscaleImage) -> Level:
    """The finest level of at most `COARSE_MAX_VOXELS` voxels (the coarsest level when none is that small)."""
    small = [lv for lv in image.levels if np.prod(lv.shape_vox) <= COARSE_MAX_VOXELS]
    return small[0] if small else image.levels[-1]


@cache
def _atoms_by_id() -> dict[int, frozenset[int]]:
    return {c.id: c.atom_ids for c in all_classes()}


class _Evidence:
    """Whether an array has positive voxels (counts, else its coarse level), each array looked at once."""

    def __init__(self, images: Mapping[str, MultiscaleImage], notes: Mapping[str, LabelAnnotation]):
        self.images, self.notes, self._seen = images, notes, {}

    def _coarse(self, name: str) -> np.ndarray:
        if name not in self._seen:
            image = self.images[name]
            self._seen[name] = self.notes[name].encoding.object_ids(image.read_level(coarse_level(image).path))
        return self._seen[name]

    def positive(self, name: str) -> bool:
        count = self.notes[name].positives
        return count > 0 if count is not None else bool(self._coarse(name).any())

    def all_ids(self) -> set[int]:
        return {int(v) for v in np.unique(self._coarse("all")) if int(v) in _atoms_by_id()}


def unannotated_arrays(images: Mapping[str, MultiscaleImage], notes: Mapping[str, LabelAnnotation], *,
                       crop: str) -> dict[str, str]:
    """The arrays of a crop to treat as not annotated, each with the reason (module docstring); logged once.

    Args:
        images: the crop's label groups by class name, "all" included when the crop has it.
        notes: their annotations (`read_annotation`), same keys.
        crop: the crop's name or folder, for the log line.
    """
    out = {n: "every voxel unknown" for n, note in notes.items() if n != "all" and note.entirely_unknown}
    evidence = _Evidence(images, notes)
    names = [n for n in notes if n != "all" and n not in out]
    for name in names:
        atoms = get_class(name).atom_ids
        inner = [b for b in names if b != name and get_class(b).atom_ids <= atoms]
        if (not inner and "all" not in notes) or evidence.positive(name):
            continue
        witnesses = [b for b in inner if evidence.positive(b)]
        if "all" in notes and any(_atoms_by_id()[v] <= atoms for v in evidence.all_ids()):
            witnesses.append("all")
        if witnesses:
            out[name] = f"all zero while {', '.join(witnesses)} {'has' if len(witnesses) == 1 else 'have'} voxels"
    if out and crop not in _REPORTED:
        _REPORTED.add(crop)
        log.warning("%s: treated as not annotated: %s", crop, "; ".join(f"{n} ({why})" for n, why in out.items()))
    return out


class LabelSource(Protocol):
    """What `LabelReads` reads from: a crop's label groups and their annotations (`CropSource`)."""

    def image(self, name: str) -> MultiscaleImage: ...

    def annotation(self, name: str) -> LabelAnnotation: ...


class LabelReads:
    """Label reads of one grid, each group read once (nearest neighbour, 0 outside it): its values and its known
    voxels, by the rule of the module docstring. Both the training targets and the scoring truth read this way.

    Example:
        >>> reads = LabelReads(crop, grid)
        >>> positive, known = reads.foreground(("mito_mem", "mito_lum")), reads.known(("mito_mem", "mito_lum"))
    """

    def __init__(self, source: LabelSource, grid: Grid):
        self.source, self.grid, self.cache = source, grid, {}

    def _read(self, name: str, pad_value: int = 0) -> tuple[np.ndarray, np.ndarray, bool]:
        if name not in self.cache:
            values, inside = self.source.image(name).read(**self.grid.read_kwargs(), interpolation="nearest",
                                                          pad_value=pad_value, return_mask=True)
            known = self.source.annotation(name).encoding.known(values, inside)
            self.cache[name] = values, known, bool(known.all())
        return self.cache[name]

    def _positive(self, name: str) -> np.ndarray:
        values, known, everywhere = self._read(name)
        encoding = self.source.annotation(name).encoding
        if everywhere and encoding.absent is not None:  # the common case, one comparison
            return values != encoding.absent
        return encoding.positive(values, known)

    def ids(self, name: str, pad_value: int = 0) -> np.ndarray:
        """The values as stored (`pad_value` outside the group)."""
        return self._read(name, pad_value)[0]

    def object_ids(self, name: str) -> np.ndarray:
        """The values at positive voxels, 0 elsewhere (the objects of an instance group)."""
        values, _, everywhere = self._read(name)
        if everywhere and self.source.annotation(name).encoding.absent == 0:  # already 0 exactly where absent
            return values
        return np.where(self._positive(name), values, 0).astype(values.dtype, copy=False)

    def foreground(self, names: Sequence[str]) -> np.ndarray:
        """Positive in any of `names` (a group from its atoms)."""
        out = self._positive(names[0])
        for n in names[1:]:
            out |= self._positive(n)
        return out

    def known(self, names: Sequence[str]) -> np.ndarray:
        """Known in every one of `names`."""
        out = self._read(names[0])[1]
        for n in names[1:]:
            out = out & self._read(n)[1]
        return out
