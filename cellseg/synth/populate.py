"""Placing organelles in the cytosol: collision-free compact organelles, ER and microtubule paths, pores.

`Builder` keeps the object table (id → kind, parent) and the shapes in painting order:
nuclei, pores, compact organelles, ER, ER exit sites, microtubules. Two entry points use it:
`plant_kit` guarantees that a crop box holds one organelle of every kind (so every class occurs in
every richly annotated crop), `fill` populates the whole volume to the preset's density.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cellseg.synth import kinds, sdf
from cellseg.synth.atoms import atom
from cellseg.synth.kinds import Candidate, Units
from cellseg.synth.organelles import Sheet
from cellseg.synth.shapes import Cells, Nucleus, Pore, Shape

PLACE_BATCH = 16  # candidates tested per vectorised call
LAYER_ORDER = ("nucleus", "pore", "organelle", "er", "eres", "mt")
COMPACT_KINDS = ("mito", "golgi", "endo", "lyso", "ld", "perox", "ves")
# Volume fraction of the cytosol each compact kind takes when filling (before `SceneStyle.density`).
FILL_FRACTION = {"mito": 0.12, "golgi": 0.03, "endo": 0.015, "lyso": 0.015, "ld": 0.015, "perox": 0.01,
                 "ves": 0.03}


class Builder:
    """Collects the objects of one scene while placing them without overlaps."""

    def __init__(self, *, units: Units, cells: Cells, nuclei: dict[int, Nucleus], rng: np.random.Generator):
        self.units, self.cells, self.nuclei, self.rng = units, cells, nuclei, rng
        self.objects: dict[int, tuple[str, int]] = {}
        self.layers: dict[str, list[Shape]] = {name: [] for name in LAYER_ORDER}
        self._centers = np.zeros((0, 3))
        self._radii = np.zeros(0)

    def new_object(self, kind: str, parent: int = 0) -> int:
        """Register an object and return its id (1, 2, ...)."""
        obj = len(self.objects) + 1
        self.objects[obj] = (kind, parent)
        return obj

    @property
    def shapes(self) -> list[Shape]:
        """All shapes in painting order."""
        return [s for name in LAYER_ORDER for s in self.layers[name]]

    def cyto_cells(self, cands: Sequence[Candidate]) -> list[int]:
        """Per candidate: the cell whose cytosol holds all its spheres clear of pm and nucleus, or 0.

        All spheres of all candidates are tested in one vectorised call (placement is batched).
        """
        centers = np.concatenate([c.centers for c in cands])
        radii = np.concatenate([c.radii for c in cands]) + self.units.m(2.5)
        owner = np.repeat(np.arange(len(cands)), [len(c.radii) for c in cands])
        cell, depth = self.cells.depth(centers[:, 0], centers[:, 1], centers[:, 2])
        ok = (cell > 0) & (depth > radii + self.cells.pm_nm)
        for cell_id in np.unique(cell[ok]):
            nucleus = self.nuclei.get(int(cell_id))
            here = np.flatnonzero(ok & (cell == cell_id))
            if nucleus is not None and len(here):
                p = centers[here]
                ok[here] &= nucleus.sdf(p[:, 0], p[:, 1], p[:, 2]) > radii[here]
        result = []
        for k in range(len(cands)):
            mine = owner == k
            same = np.all(cell[mine] == cell[mine][0])
            result.append(int(cell[mine][0]) if same and np.all(ok[mine]) else 0)
        return result

    def _free(self, cand: Candidate) -> bool:
        if not len(self._radii):
            return True
        gap = np.linalg.norm(cand.centers[:, None] - self._centers[None], axis=2)
        return bool(np.all(gap > cand.radii[:, None] + self._radii[None] + self.units.m(1.0)))

    def commit(self, cand: Candidate, cell: int, *, layer: str = "organelle", obj: int | None = None) -> int:
        """Add a placed candidate's shapes; returns its object id."""
        obj = obj if obj is not None else self.new_object(cand.kind)
        self.layers[layer].extend(cand.build(obj, cell))
        self._centers = np.concatenate([self._centers, cand.centers])
        self._radii = np.concatenate([self._radii, cand.radii])
        return obj

    def place(self, make: Callable[[np.ndarray], Candidate], lo: np.ndarray, hi: np.ndarray,
              attempts: int = 40) -> bool:
        """Try random centres in the box [lo, hi] (in batches) until a candidate fits."""
        for first in range(0, attempts, PLACE_BATCH):
            cands = [make(self.rng.uniform(lo, hi)) for _ in range(min(PLACE_BATCH, attempts - first))]
            for cand, cell in zip(cands, self.cyto_cells(cands), strict=True):
                if cell and self._free(cand):
                    self.commit(cand, cell)
                    return True
        return False

    def cyto_point(self, lo: np.ndarray, hi: np.ndarray, attempts: int = 16) -> tuple[np.ndarray, int] | None:
        """A random cytosol point in the box (clear of organelles), with its cell."""
        points = [Candidate(kind="", centers=self.rng.uniform(lo, hi)[None], radii=np.zeros(1), build=_nothing)
                  for _ in range(attempts)]
        for cand, cell in zip(points, self.cyto_cells(points), strict=True):
            if cell and self._free(cand):
                return cand.centers[0], cell
        return None

    def add_path(self, kind: str, start: np.ndarray, cell: int, *, length_nm: float) -> np.ndarray:
        """An ER tubule or a microtubule through `start`, painted only in the cytosol of `cell`."""
        u = self.units
        step = u.s(6.0) if kind == "er" else u.m(10.0)
        turn = 0.35 if kind == "er" else 0.08
        half = max(1, int(length_nm / step / 2))
        d = sdf.random_rotation(self.rng)[:, 0]
        fwd = kinds.random_walk(start, d, step_nm=step, num_steps=half, turn=turn, rng=self.rng)
        back = kinds.random_walk(start, -d, step_nm=step, num_steps=half, turn=turn, rng=self.rng)
        points = np.concatenate([back[::-1], fwd[1:]])
        if kind == "er":
            r, spec = u.s(rng_uniform(self.rng, 2.6, 3.4)), ((atom("er_mem"), u.m(1.5)), (atom("er_lum"), None))
        else:
            r, spec = u.m(3.0), ((atom("mt_out"), u.m(1.2)), (atom("mt_in"), None))
        obj = self.new_object(kind)
        self.layers["er" if kind == "er" else "mt"].extend(
            kinds.tube_parts(points, obj=obj, cell=cell, radius_nm=r, layers=spec, margin_nm=4 * u.u))
        return points

    def add_sheet(self, center: np.ndarray, cell: int) -> None:
        """A warped ER sheet centred in the cytosol."""
        u = self.units
        radius, half, warp = u.s(rng_uniform(self.rng, 12.0, 24.0)), u.s(3.2), u.s(4.0)
        lo, hi = kinds.box_of(center[None], radius + half + warp + 6 * u.u)
        self.layers["er"].append(Sheet(
            obj=self.new_object("er"), cell=cell, over=kinds.CYTO, lo_nm=lo, hi_nm=hi, center=center,
            rot=sdf.random_rotation(self.rng), radius_nm=radius, half_thick_nm=half, warp_nm=warp,
            seed=int(self.rng.integers(2**31)), layers=((atom("er_mem"), u.m(1.5)), (atom("er_lum"), None))))

    def add_eres(self, point: np.ndarray, cell: int) -> None:
        """An ER exit site: two or three small buds clustered on an ER tubule."""
        obj = self.new_object("eres")
        for _ in range(int(self.rng.integers(2, 4))):
            offset = self.rng.normal(size=3) * self.units.s(2.0)
            cand = kinds.blob(self.units, "eres", point + offset, self.rng)
            self.layers["eres"].extend(cand.build(obj, cell))

    def add_pores(self, nucleus: Nucleus, count: int, lo: np.ndarray | None = None,
                  hi: np.ndarray | None = None, attempts: int = 60) -> int:
        """Up to `count` nuclear pores on `nucleus` (inside the box, if given), kept apart; returns how many."""
        u, placed = self.units, 0
        r_in, r_out = u.s(1.8), u.s(3.6)
        existing = [s.point for s in self.layers["pore"] if isinstance(s, Pore) and s.nucleus is nucleus]
        for _ in range(attempts):
            point, normal = surface_point(nucleus, self.rng.normal(size=3))
            inside = lo is None or bool(np.all(point > lo + r_out) and np.all(point < hi - r_out))
            if not inside or any(np.linalg.norm(point - p) < 3 * r_out for p in existing):
                continue
            reach = r_out + nucleus.envelope_nm(4 * u.u) + nucleus.wobble_nm + 8 * u.u
            box = kinds.box_of(point[None], reach)
            self.layers["pore"].append(Pore(
                obj=self.new_object("np", parent=nucleus.obj), cell=nucleus.cell,
                over=frozenset({atom("ne_mem"), atom("ne_lum")}), lo_nm=box[0], hi_nm=box[1], nucleus=nucleus,
                point=point, normal=normal, r_in_nm=r_in, r_out_nm=r_out))
            existing.append(point)
            placed += 1
            if placed == count:
                break
        return placed


def _nothing(obj: int, cell: int) -> list[Shape]:
    return []


def rng_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    """One uniform draw as a Python float."""
    return float(rng.uniform(lo, hi))


def surface_point(nucleus: Nucleus, direction: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Point on the (unperturbed) nuclear ellipsoid in a local direction, and its outward normal."""
    d = direction / np.linalg.norm(direction)
    radii = np.asarray(nucleus.radii)
    local = d / np.sqrt(np.sum((d / radii) ** 2))
    normal = nucleus.rot @ (local / radii**2)
    return nucleus.center + nucleus.rot @ local, normal / np.linalg.norm(normal)


def compact(builder: Builder, kind: str, size: float = 1.0) -> Callable[[np.ndarray], Candidate]:
    """The candidate factory for a compact organelle kind."""
    u, rng = builder.units, builder.rng
    if kind == "mito":
        return lambda c: kinds.mito(u, c, rng)
    if kind == "golgi":
        return lambda c: kinds.golgi(u, c, rng, size)
    return lambda c: kinds.blob(u, kind, c, rng)


def plant_kit(builder: Builder, lo: np.ndarray, hi: np.ndarray) -> None:
    """Put one organelle of every kind (two mitochondria, three vesicles) inside the box [lo, hi]."""
    for nucleus in builder.nuclei.values():
        builder.add_pores(nucleus, 3, lo, hi)
    for size in (1.0, 0.75, 0.55):  # a Golgi stack is large: shrink it until one fits
        if builder.place(compact(builder, "golgi", size), lo, hi, attempts=48):
            break
    for kind, n in (("mito", 2), ("endo", 1), ("lyso", 1), ("ld", 1), ("perox", 1), ("ves", 3)):
        for _ in range(n):
            builder.place(compact(builder, kind), lo, hi, attempts=80)
    length = float(np.linalg.norm(hi - lo))
    for kind in ("er", "mt", "mt"):
        found = builder.cyto_point(lo, hi)
        if found is not None:
            points = builder.add_path(kind, found[0], found[1], length_nm=length)
            if kind == "er":
                builder.add_eres(points[len(points) // 2], found[1])
    found = builder.cyto_point(lo, hi)
    if found is not None:
        builder.add_sheet(*found)


def fill(builder: Builder, lo: np.ndarray, hi: np.ndarray, *, density: float, cell_diameter_nm: float) -> None:
    """Populate the whole box to the preset's density (pores on every nucleus, organelles, ER, microtubules)."""
    u = builder.units
    for nucleus in builder.nuclei.values():
        area = 4 * np.pi * float(np.mean(nucleus.radii)) ** 2
        builder.add_pores(nucleus, int(density * area / u.s(24.0) ** 2))
    cyto_nm3 = 0.45 * float(np.prod(hi - lo))
    volumes = {"mito": np.pi * u.s(7) ** 2 * u.s(25) + 4 / 3 * np.pi * u.s(7) ** 3, "golgi": (u.s(30)) ** 3 * 0.3}
    for kind in COMPACT_KINDS:
        r = u.s(float(np.mean(kinds.BLOB_RADIUS_U.get(kind, (1.0, 1.0)))))
        one = volumes.get(kind, 4 / 3 * np.pi * r**3 * 0.8)
        for _ in range(int(density * FILL_FRACTION[kind] * cyto_nm3 / one)):
            builder.place(compact(builder, kind), lo, hi, attempts=12)
    num_cells = max(1.0, float(np.prod(hi - lo)) / cell_diameter_nm**3)
    for kind, per_cell in (("er", 60), ("mt", 14)):
        for _ in range(int(density * per_cell * num_cells)):
            found = builder.cyto_point(lo, hi, attempts=8)
            if found is not None:
                points = builder.add_path(kind, found[0], found[1], length_nm=cell_diameter_nm)
                if kind == "er" and builder.rng.random() < 0.2:
                    builder.add_eres(points[int(builder.rng.integers(len(points)))], found[1])
    for _ in range(int(density * 25 * num_cells)):
        found = builder.cyto_point(lo, hi, attempts=8)
        if found is not None:
            builder.add_sheet(*found)
