"""CellMap classes as nnU-Net v2 labels: one label per *atom* (the mutually exclusive CellMap ids), every scored
class a *region* (the tuple of its atoms' labels), so that nnU-Net's region-based training (sigmoid outputs, one per
region) predicts every class, groups included.

Label 0 is background (no atom of the scheme), atoms are 1..A in CellMap id order, and the ignore label is A + 1
(nnU-Net requires it to be the highest). nnU-Net has *one* ignore label that masks every output at a voxel, so a
voxel is labelled only where every atom's answer is known there (`label_volume`); anywhere else it is ignored, never
taught as background.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellseg.classes import atoms_of, get_class

BACKGROUND = 0
MAX_LABELS = 254  # labels are written as uint8 with the ignore label above the atoms: 1..254 atoms at most


@dataclass(frozen=True)
class LabelScheme:
    """The atoms and regions of a class list.

    Attributes:
        classes: the scored classes, in the run's order: nnU-Net's regions, and its output channels, in this order.
        atoms: the atoms the classes are made of, in CellMap id order; atom i has label i + 1.
    """

    classes: tuple[str, ...]
    atoms: tuple[str, ...]

    @classmethod
    def of(cls, classes: Sequence[str]) -> LabelScheme:
        """The scheme of `classes` (CellMap names).

        Raises:
            ValueError: a class unknown to CellMap or made of no atom, a class named twice, two classes with the
                same atoms (nnU-Net would learn one region twice under two names), or more atoms than uint8
                labels hold.
        """
        classes = tuple(classes)
        if not classes:
            raise ValueError("no class to train: nnU-Net needs at least one region")
        twice = sorted({c for c in classes if classes.count(c) > 1})
        if twice:
            raise ValueError(f"classes named more than once: {twice}")
        atoms_by_class = {}
        for name in classes:
            try:
                get_class(name)
            except (KeyError, ValueError) as err:
                raise ValueError(f"{name!r} is not a CellMap class: {err}") from None
            atoms = atoms_of(name)
            if not atoms:
                raise ValueError(f"{name!r} is made of no CellMap atom: nnU-Net's regions cannot express it")
            atoms_by_class[name] = atoms
        seen: dict[tuple[str, ...], str] = {}
        for name, atoms in atoms_by_class.items():
            if atoms in seen:
                raise ValueError(f"{name!r} and {seen[atoms]!r} are the same atoms {list(atoms)}: one nnU-Net region "
                                 "cannot carry two names; leave one of them out")
            seen[atoms] = name
        ids = {a: get_class(a).id for atoms in atoms_by_class.values() for a in atoms}
        ordered = tuple(sorted(ids, key=ids.__getitem__))
        if len(ordered) > MAX_LABELS:
            raise ValueError(f"{len(ordered)} atoms need more labels than uint8 holds ({MAX_LABELS})")
        return cls(classes=classes, atoms=ordered)

    @property
    def ignore(self) -> int:
        """The ignore label: one above the last atom's."""
        return len(self.atoms) + 1

    def label_of(self, atom: str) -> int:
        """The label of an atom."""
        return self.atoms.index(atom) + 1

    def region(self, name: str) -> tuple[int, ...]:
        """The labels of a class's atoms, ascending."""
        return tuple(sorted(self.label_of(a) for a in atoms_of(name)))

    def dataset_labels(self) -> dict[str, Any]:
        """`dataset.json`'s `labels`: background, every class as its region (an int for one atom), ignore."""
        labels: dict[str, Any] = {"background": BACKGROUND}
        for name in self.classes:
            region = self.region(name)
            labels[name] = region[0] if len(region) == 1 else list(region)
        labels["ignore"] = self.ignore
        return labels

    def regions_class_order(self) -> list[int]:
        """`dataset.json`'s `regions_class_order`, one label per region in class order: the label nnU-Net paints in
        its segmentation where the region is on (later regions paint over earlier ones). Only nnU-Net's own label
        map uses it; cellseg reads the region probabilities."""
        return [self.region(name)[0] for name in self.classes]

    def to_json(self) -> dict[str, Any]:
        """What the converted dataset records of the scheme."""
        return {"classes": list(self.classes), "atoms": {a: self.label_of(a) for a in self.atoms},
                "ignore": self.ignore, "regions": {c: list(self.region(c)) for c in self.classes}}


def label_volume(target: np.ndarray, known: np.ndarray) -> np.ndarray:
    """The nnU-Net label map of one case from its atoms' targets: `(A, z, y, x)` bool each, atom i of the scheme in
    channel i (`CropSource.read_targets` of the scheme's atoms).

    A voxel where every atom is known takes the label of its positive atom (background when none is); where any
    atom is unknown, or more than one is positive (inconsistent labels), it takes the ignore label A + 1.

    Returns:
        `(z, y, x)` uint8.
    """
    if target.shape != known.shape or target.ndim != 4:
        raise ValueError(f"target {target.shape} and known {known.shape} must be the same (A, z, y, x) shape")
    atoms = target.shape[0]
    positive = target & known
    count = positive.sum(axis=0, dtype=np.uint16)
    labels = np.where(count == 1, positive.argmax(axis=0) + 1, BACKGROUND).astype(np.uint8)
    labels[~known.all(axis=0) | (count > 1)] = atoms + 1
    return labels


def class_masks(labels: np.ndarray, scheme: LabelScheme) -> Mapping[str, np.ndarray]:
    """The inverse of `label_volume` for checks: each class's mask `(z, y, x)` bool from a label map (the ignore
    label counts as negative)."""
    return {name: np.isin(labels, scheme.region(name)) for name in scheme.classes}
