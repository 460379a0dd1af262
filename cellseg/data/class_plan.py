"""How each configured class is obtained in one crop (`plan_class`), and the per-id lookup tables of its fast path.

A class annotated on disk is read; a group whose atoms are all annotated is their union; any other class is
unknown except where a mutually exclusive class is positive (from the `all` ids when the crop has them, else
from the maximal annotated exclusive classes). `id_lookup_tables` turns the plans into the packed target and
known bits of every `all` id, so a crop with `all` gets every class channel from one gather
(`cellseg.data.targets`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cellseg.classes import all_classes, get_class, is_instance, mutually_exclusive


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


def aux_class_indices(classes: Sequence[str], boundaries: bool) -> tuple[int, ...]:
    """Indices of the classes that get a boundary channel: the instance-scored ones, when `boundaries` is on."""
    return tuple(k for k, c in enumerate(classes) if is_instance(c)) if boundaries else ()


def id_lookup_tables(plans: Sequence[ClassPlan], num_channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Per id v of `all` (0-255): packed target bits and packed known bits, shape (ceil(C/8), 256).

    Id 0 (annotated background) is known-negative for every annotated class; `targets.ALL_OUTSIDE` (255, not a
    CellMap id) marks voxels outside the crop: unknown for everything.
    """
    nbytes = -(-num_channels // 8)
    t, k = np.zeros((nbytes, 256), np.uint8), np.zeros((nbytes, 256), np.uint8)
    for i, plan in enumerate(plans):
        atoms_c, bit = get_class(plan.name).atom_ids, np.uint8(1 << (i & 7))
        if plan.read:
            k[i >> 3, 0] |= bit
        for cls in all_classes():
            if cls.atom_ids <= atoms_c and plan.read:
                t[i >> 3, cls.id] |= bit
            if cls.atom_ids.isdisjoint(atoms_c) or (plan.read and cls.atom_ids <= atoms_c):
                k[i >> 3, cls.id] |= bit
    return t, k
