"""The atom classes a synthetic scene paints, with their CellMap ids (from `cellseg.classes`).

Each voxel of a scene holds exactly one atom (the most granular class). Every tested group class is
a union of these atoms, so all 48 tested classes can be derived from one atom volume.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from cellseg.classes import get_class, tested_classes

# The 31 tested atoms a scene can contain (the 17 tested groups are unions of them).
ATOM_NAMES: tuple[str, ...] = (
    "ecs", "pm", "cyto",
    "mito_mem", "mito_lum", "mito_ribo",
    "golgi_mem", "golgi_lum", "ves_mem", "ves_lum", "endo_mem", "endo_lum", "lyso_mem", "lyso_lum",
    "ld_mem", "ld_lum", "perox_mem", "perox_lum",
    "er_mem", "er_lum", "eres_mem", "eres_lum",
    "ne_mem", "ne_lum", "np_out", "np_in", "hchrom", "echrom", "nucpl",
    "mt_out", "mt_in",
)


def atom(name: str) -> int:
    """CellMap id of an atom class (e.g. `atom("mito_mem") == 3`)."""
    return get_class(name).id


@functools.cache
def scene_atom_ids(name: str) -> frozenset[int]:
    """Ids of the scene atoms a class covers (its atoms that a scene can contain)."""
    painted = {atom(n) for n in ATOM_NAMES}
    return frozenset(get_class(name).atom_ids & painted)


def lut(ids: frozenset[int] | set[int]) -> np.ndarray:
    """A 256-entry boolean lookup table: `lut(ids)[atoms]` is the mask of voxels holding one of `ids`."""
    table = np.zeros(256, dtype=bool)
    table[list(ids)] = True
    return table


def check_coverage(atom_names: Sequence[str] = ATOM_NAMES) -> None:
    """Every tested class must hold one of the atoms scenes paint (`atom_names`), else its synthetic labels would be
    empty everywhere; checked when this module is imported (a few milliseconds).

    Raises:
        RuntimeError: tested classes that none of `atom_names` covers.
    """
    painted = {atom(n) for n in atom_names}
    missing = [n for n in tested_classes() if not get_class(n).atom_ids & painted]
    if missing:
        raise RuntimeError(f"synthetic scenes cannot produce tested classes {missing}")


check_coverage()
