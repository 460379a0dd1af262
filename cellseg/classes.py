"""The CellMap class catalogue: 74 CellMap label ids (+3 yolk ids), their composition and how each is scored.

Sources, packaged in `cellseg/manifests/` (see the README there for provenance and licence):
`classes.csv` (ids and group composition), `classes_long_names.csv` (long names, instance flags,
yolk ids 75-77) and `tested_classes.csv` (the 48 scored classes).

Vocabulary:
- an *atom* is a class with no members (e.g. `mito_mem`); a *group* is the union of other classes
  (e.g. `mito = mito_mem | mito_lum | mito_ribo`). Every class expands to a set of atom ids.
- two classes are *mutually exclusive* when their atom sets are disjoint: a voxel positive for one is
  known to be negative for the other (`mito` vs `nuc`, `ecs` vs `cell`).
- of the 48 tested classes, 10 are scored as instances (object ids), the other 38 semantically (binary).

Example:
    >>> from cellseg.classes import get_class, atoms_of, mutually_exclusive
    >>> atoms_of("mito")
    ('mito_mem', 'mito_lum', 'mito_ribo')
    >>> mutually_exclusive("mito", "nuc"), mutually_exclusive("er", "ne")
    (True, False)
"""

from __future__ import annotations

import csv
import difflib
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Literal

MANIFEST_PACKAGE = "cellseg.manifests"


@dataclass(frozen=True, kw_only=True)
class CellMapClass:
    """One CellMap label class.

    Attributes:
        id: the CellMap class id (1-77).
        name: the short name used for arrays on disk (`mito`, `chlor_mem`).
        long_name: human-readable name ("mitochondria").
        member_ids: the ids a group is defined by in `classes.csv` (empty for an atom).
        atom_ids: the atom ids this class covers; `{id}` for an atom.
        aliases: other spellings seen in official files (`chloroplast_mem` for `chlor_mem`).
        tested: one of the 48 classes scored by the challenge.
        instance: scored as instances (object ids) rather than semantically.
    """

    id: int
    name: str
    long_name: str
    member_ids: tuple[int, ...]
    atom_ids: frozenset[int]
    aliases: tuple[str, ...] = ()
    tested: bool = False
    instance: bool = False

    @property
    def is_group(self) -> bool:
        """True for a class defined as the union of other classes."""
        return bool(self.member_ids)

    @property
    def metric(self) -> Literal["instance", "semantic"] | None:
        """How the challenge scores this class, or None if it is not scored."""
        if not self.tested:
            return None
        return "instance" if self.instance else "semantic"


def _read_csv(name: str) -> list[list[str]]:
    text = resources.files(MANIFEST_PACKAGE).joinpath(name).read_text(encoding="utf-8")
    return [row for row in csv.reader(text.splitlines()) if row]


def _parse_ids(text: str, sep: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(sep) if t.strip())


@functools.cache
def _load() -> dict[str, CellMapClass]:
    # The docs table has the short names, long names and instance flags for all 77 ids;
    # the utils table has the composition (and long spellings for chloroplast/vacuole/pd).
    docs = _read_csv("classes_long_names.csv")[1:]
    utils_name = {int(row[1]): row[0] for row in _read_csv("classes.csv")}
    tested = {row[0] for row in _read_csv("tested_classes.csv")}
    members = {int(row[1]): _parse_ids(row[2], "-") for row in docs}
    for row in _read_csv("classes.csv"):
        if members[int(row[1])] != _parse_ids(row[2], ","):
            raise RuntimeError(f"classes.csv and classes_long_names.csv disagree on class {row[0]}")

    @functools.cache
    def atoms(class_id: int) -> frozenset[int]:
        if not members[class_id]:
            return frozenset({class_id})
        return frozenset().union(*(atoms(m) for m in members[class_id]))

    table: dict[str, CellMapClass] = {}
    for name, id_text, _, long_name, instance_flag, _semantic_flag in docs:
        class_id = int(id_text)
        alias = utils_name.get(class_id, name)
        table[name] = CellMapClass(
            id=class_id,
            name=name,
            long_name=long_name,
            member_ids=members[class_id],
            atom_ids=atoms(class_id),
            aliases=(alias,) if alias != name else (),
            tested=name in tested,
            instance=name in tested and instance_flag == "True",
        )
    return table


def all_classes() -> tuple[CellMapClass, ...]:
    """All 77 classes, ordered by id."""
    return tuple(sorted(_load().values(), key=lambda c: c.id))


@functools.cache
def _by_name_or_alias() -> dict[str, CellMapClass]:
    table = dict(_load())
    for cls in _load().values():
        table.update({alias: cls for alias in cls.aliases})
    return table


def get_class(name: str | int) -> CellMapClass:
    """Look up a class by short name, official alias or id.

    Raises:
        ValueError: for an unknown name, with the closest valid names.
    """
    if isinstance(name, int):
        for cls in _load().values():
            if cls.id == name:
                return cls
        raise ValueError(f"unknown CellMap class id {name}; valid ids are 1-77")
    table = _by_name_or_alias()
    if name in table:
        return table[name]
    # Suggest by short name, alias or long name ("mitochondria" → mito).
    candidates = {**{k: v.name for k, v in table.items()}, **{c.long_name: c.name for c in _load().values()}}
    close = dict.fromkeys(candidates[m] for m in difflib.get_close_matches(name, list(candidates), n=5, cutoff=0.5))
    hint = f"; did you mean {', '.join(list(close)[:3])}?" if close else "; see `cellseg info --classes`"
    raise ValueError(f"unknown CellMap class {name!r}{hint}")


def _names(ids: Iterable[int]) -> tuple[str, ...]:
    by_id = {c.id: c.name for c in _load().values()}
    return tuple(by_id[i] for i in ids)


def atoms_of(name: str) -> tuple[str, ...]:
    """The atom names of a class, in id order (an atom is its own single atom)."""
    return _names(sorted(get_class(name).atom_ids))


def members_of(name: str) -> tuple[str, ...]:
    """The direct members of a group as listed in `classes.csv` (empty for an atom)."""
    return _names(get_class(name).member_ids)


def mutually_exclusive(a: str, b: str) -> bool:
    """True when no voxel can belong to both classes (their atom sets are disjoint)."""
    return get_class(a).atom_ids.isdisjoint(get_class(b).atom_ids)


def tested_classes() -> tuple[str, ...]:
    """The 48 classes the challenge scores, in the order of `tested_classes.csv`."""
    return tuple(row[0] for row in _read_csv("tested_classes.csv"))


def instance_classes() -> tuple[str, ...]:
    """The 10 classes scored as instances: nuc, ves, endo, lyso, ld, perox, mito, np, mt, cell.

    The official `INSTANCE_CLASSES` list also names `vim` and `instance`, but neither is in any test
    manifest (CSC issue #169), so neither is ever scored as an instance.
    """
    return tuple(n for n in tested_classes() if get_class(n).instance)


def semantic_classes() -> tuple[str, ...]:
    """The 38 tested classes scored semantically (IoU of binary masks)."""
    return tuple(n for n in tested_classes() if not get_class(n).instance)


def is_instance(name: str) -> bool:
    """True when the challenge scores `name` as instances."""
    return get_class(name).instance
