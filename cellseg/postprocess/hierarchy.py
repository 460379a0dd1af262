"""Hierarchy-aware decoding: predictions that obey the class relations of the catalogue (`cellseg.classes`).

Two options, chosen per class (`hierarchy` in its parameters, tuned by `cellseg.postprocess.tune`). Each edits
the class's probability on the model grid (z, y, x) before the class is decoded, so the decoding itself (post-ops,
instances, the refinement on annotation grids in `native.py`) is unchanged and runs the same on both grids:

- "union", for a group G (`mito = mito_mem | mito_lum | mito_ribo`): G contains each of its atoms.
  `p_G ← max(p_G, φ_a(p_a))` over the atoms a of G, with `φ_a(p) = t_G + s_a (p − t_a)`,
  `s_a = (1 − t_G) / (1 − t_a)`, the affine map carrying the atom's threshold t_a onto the group's t_G (and
  1 onto 1). On the model grid the group's mask becomes exactly the union `{p_G > t_G} ∪ ⋃ {p_a > t_a}` (a
  voxel of an atom is lifted one float32 step above t_G at least, so rounding cannot drop it). On an
  annotation grid the same holds for the interpolated probabilities, before post-ops: `lin` is a convex
  combination, so `lin(max(p_G, φ(p_a))) ≥ φ(lin(p_a))`, which exceeds t_G wherever `lin(p_a) > t_a`: every
  voxel the atom's own decoding marks is foreground of the group. The group's post-ops (hole filling, size
  filter, instances) then act on the union.
- "argmax", for an atom a: atoms are mutually exclusive, so where a is positive (`p_a > t_a`) and another
  atom b is positive with a strictly higher probability (`p_b > t_b`, `p_b > p_a`), the voxel is b's:
  `p_a ← 0` there. On the model grid a keeps exactly the voxels it wins (ties keep both); on an annotation
  grid, the edited probability is interpolated, so the boundary between two atoms falls between the source
  voxels they won.

Which classes take part: only those the crop's prediction holds (its channels). A group uses the atoms of it
that are predicted, whatever is missing (no atom predicted: no change); an atom competes with every other
predicted atom. Each option reads the other classes' *unedited* probabilities and their thresholds, never
their edited ones, so the decision for one class does not depend on the others' and is tuned alone.

Memory (model grid): "union" holds the edited copy plus one atom's probability at a time; "argmax" reads the
predicted atoms once per crop into `Rivals` (9 bytes a voxel), which every atom of the crop then uses.

Example:
    >>> p = union_probability(p_mito, 0.5, [(p_mito_mem, 0.3), (p_mito_lum, 0.6)])  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from cellseg.classes import atoms_of, get_class

OPTIONS = ("union", "argmax")
NONE = -1.0  # a rival probability where no rival atom is positive


def option_for(class_name: str) -> str:
    """The option a class can take: "union" for a group, "argmax" for an atom."""
    return "union" if get_class(class_name).is_group else "argmax"


def check_option(class_name: str, option: str | None) -> None:
    """Raises ValueError unless `option` is None or the one `option_for(class_name)` names."""
    if option is not None and option != option_for(class_name):
        kind = "a group" if get_class(class_name).is_group else "an atom"
        raise ValueError(f"{class_name}: hierarchy option {option!r} is not one of {OPTIONS} valid for it "
                         f"({class_name} is {kind}: only {option_for(class_name)!r} applies)")


def is_atom(class_name: str) -> bool:
    """True for a class with no members."""
    return not get_class(class_name).is_group


def partners(class_name: str, present: Iterable[str]) -> tuple[str, ...]:
    """The predicted classes an option of `class_name` reads: a group's predicted atoms, or the other predicted
    atoms of an atom (module docstring); empty when the option would change nothing."""
    present = list(present)
    if get_class(class_name).is_group:
        return tuple(a for a in atoms_of(class_name) if a in present)
    return tuple(c for c in present if c != class_name and is_atom(c))


def union_probability(prob: np.ndarray, threshold: float, atoms: Iterable[tuple[np.ndarray, float]]) -> np.ndarray:
    """A group's probability raised to its atoms' (module docstring, "union"); `atoms` yields (probability,
    threshold) pairs on the same grid and may read them lazily. Returns a new float32 array."""
    out = np.array(prob, dtype=np.float32, copy=True)
    t_g = np.float32(threshold)
    lifted = np.nextafter(t_g, np.float32(2))  # the smallest float32 above t_G
    for p_a, t_a in atoms:
        if t_a >= 1 or t_g >= 1:
            continue  # never positive: nothing to add
        p_a = np.asarray(p_a, np.float32)
        phi = (t_g + np.float32((1 - threshold) / (1 - t_a)) * (p_a - np.float32(t_a))).astype(np.float32, copy=False)
        np.maximum(phi, lifted, out=phi, where=p_a > np.float32(t_a))
        np.maximum(out, np.minimum(phi, np.float32(1)), out=out)
    return out


@dataclass(frozen=True)
class Rivals:
    """The two most probable positive atoms of every voxel (module docstring, "argmax").

    Attributes:
        names: the atoms, in the order read.
        first: float32, the highest probability of a positive atom (`NONE` where none is positive).
        winner: uint8 index into `names` of the atom holding `first`.
        second: float32, the second highest (`NONE` where fewer than two are positive).
    """

    names: tuple[str, ...]
    first: np.ndarray
    winner: np.ndarray
    second: np.ndarray

    @classmethod
    def of(cls, atoms: Iterable[tuple[str, np.ndarray, float]]) -> Rivals:
        """Read (name, probability, threshold) triples one at a time (at most 255 atoms)."""
        names: list[str] = []
        first = second = winner = None
        for name, prob, threshold in atoms:
            prob = np.asarray(prob, np.float32)
            value = np.where(prob > np.float32(threshold), prob, np.float32(NONE))
            if first is None:
                first, second = value, np.full_like(value, NONE)
                winner = np.zeros(value.shape, np.uint8)
            else:
                beats = value > first
                np.copyto(second, np.where(beats, first, np.maximum(second, value)))
                np.copyto(first, value, where=beats)
                winner[beats] = len(names)
            names.append(name)
        if first is None:
            raise ValueError("no atoms to compare")
        if len(names) > 255:
            raise ValueError(f"{len(names)} atoms: at most 255 are compared")
        return cls(names=tuple(names), first=first, winner=winner, second=second)

    def best_other(self, name: str) -> np.ndarray:
        """Per voxel, the highest probability of a positive atom other than `name` (`NONE` where none)."""
        if name not in self.names:
            return self.first
        return np.where(self.winner == self.names.index(name), self.second, self.first)


def argmax_probability(prob: np.ndarray, threshold: float, rival: np.ndarray) -> np.ndarray:
    """An atom's probability, 0 where it is positive and a positive rival is more probable (module docstring,
    "argmax"); `rival` is `Rivals.best_other`. Returns a new float32 array."""
    lost = (prob > np.float32(threshold)) & (rival > prob)
    return np.where(lost, np.float32(0), prob).astype(np.float32, copy=False)


def edited_probability(class_name: str, option: str | None, prob: np.ndarray, *, present: Sequence[str],
                       threshold_of: Callable[[str], float], read: Callable[[str], np.ndarray],
                       rivals: Callable[[], Rivals]) -> np.ndarray:
    """`prob` with the class's option applied (unchanged when None or when no partner is predicted).

    Args:
        present: the classes the crop's prediction holds.
        threshold_of: class → its threshold.
        read: class → its unedited probability on `prob`'s grid (called once per partner, lazily).
        rivals: the crop's `Rivals` over its predicted atoms (called only for "argmax").
    """
    check_option(class_name, option)
    names = partners(class_name, present) if option else ()
    if not names:
        return prob
    if option == "union":
        return union_probability(prob, threshold_of(class_name), ((read(a), threshold_of(a)) for a in names))
    return argmax_probability(prob, threshold_of(class_name), rivals().best_other(class_name))


def crop_rivals(present: Sequence[str], *, threshold_of: Callable[[str], float],
                read: Callable[[str], np.ndarray]) -> Rivals:
    """`Rivals` over the predicted atoms of a crop, each read once."""
    return Rivals.of((a, read(a), threshold_of(a)) for a in present if is_atom(a))
