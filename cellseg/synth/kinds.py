"""Organelle recipes: random size, shape and orientation of each organelle kind, as placement candidates.

Sizes are in scene units (`Units.u` nm, see `presets.py`): `Units.s(x)` scales an organelle size by the
preset's organelle scale, `Units.m(x)` is an (unscaled) membrane thickness. A `Candidate` carries the
spheres used for collision tests and a function that builds the painted shapes once an object id and a
cell are known.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cellseg.synth import sdf
from cellseg.synth.atoms import atom
from cellseg.synth.organelles import Blob, Golgi, Mito, Tube
from cellseg.synth.shapes import Shape

CYTO = frozenset({atom("cyto")})
BuildFn = Callable[[int, int], list[Shape]]  # (object id, cell id) -> shapes


@dataclass(frozen=True, kw_only=True)
class Units:
    """Length units of one scene (nm)."""

    u: float
    scale: float

    def s(self, x: float) -> float:
        """An organelle size of `x` units, scaled by the preset's organelle scale."""
        return x * self.u * self.scale

    def m(self, x: float) -> float:
        """A membrane thickness of `x` units (not scaled)."""
        return x * self.u


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """An organelle ready to be placed: collision spheres and a builder for its shapes."""

    kind: str
    centers: np.ndarray  # (n, 3)
    radii: np.ndarray  # (n,)
    build: BuildFn


def box_of(centers: np.ndarray, radii: np.ndarray | float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Bounding box (lo, hi) of spheres."""
    r = np.broadcast_to(np.asarray(radii, dtype=float), (len(centers),))[:, None]
    return tuple(map(float, (centers - r).min(axis=0))), tuple(map(float, (centers + r).max(axis=0)))


# Outer-to-inner layers per membrane-bound blob kind; membrane thickness in units (× Units.m).
BLOB_LAYERS = {
    "ves": (("ves_mem", 1.5), ("ves_lum", None)),
    "endo": (("endo_mem", 1.5), ("endo_lum", None)),
    "lyso": (("lyso_mem", 1.75), ("lyso_lum", None)),
    "ld": (("ld_mem", 1.0), ("ld_lum", None)),
    "perox": (("perox_mem", 1.5), ("perox_lum", None)),
    "eres": (("eres_mem", 1.5), ("eres_lum", None)),
}
BLOB_RADIUS_U = {"ves": (4.0, 5.5), "endo": (6.0, 9.0), "lyso": (5.5, 8.0), "ld": (6.0, 10.0),
                 "perox": (4.5, 6.5), "eres": (3.5, 4.5)}


def blob(units: Units, kind: str, center: np.ndarray, rng: np.random.Generator) -> Candidate:
    """A vesicle-like organelle of `kind` (a key of `BLOB_LAYERS`)."""
    r = units.s(rng.uniform(*BLOB_RADIUS_U[kind]))
    radii = tuple(r * f for f in (1.0, rng.uniform(0.8, 1.0), rng.uniform(0.7, 1.0)))
    rot = sdf.random_rotation(rng)
    spec = tuple((atom(name), None if t is None else units.m(t)) for name, t in BLOB_LAYERS[kind])
    wobble = 0.08 * r if kind in ("endo", "lyso") else 0.0
    seed = int(rng.integers(2**31))

    def build(obj: int, cell: int) -> list[Shape]:
        lo, hi = box_of(center[None], r + wobble + units.u)
        return [Blob(obj=obj, cell=cell, over=CYTO | _ER if kind == "eres" else CYTO, lo_nm=lo, hi_nm=hi,
                     center=center, radii=radii, rot=rot, layers=spec, wobble_nm=wobble, seed=seed)]

    return Candidate(kind=kind, centers=center[None], radii=np.array([r + wobble]), build=build)


_ER = frozenset({atom("er_mem"), atom("er_lum")})


def mito(units: Units, center: np.ndarray, rng: np.random.Generator) -> Candidate:
    """A bent, capsule-shaped mitochondrion with cristae and matrix ribosomes."""
    r, length = units.s(rng.uniform(6.0, 8.0)), units.s(rng.uniform(14.0, 36.0))
    frame = sdf.random_rotation(rng)
    axis, side = frame[:, 0], frame[:, 1]
    bend = side * rng.uniform(-0.25, 0.25) * length
    points = np.stack([center - axis * length / 2, center + bend, center + axis * length / 2])
    num = max(2, int(np.ceil(length / r)) + 1)
    t = np.linspace(0, 1, num)[:, None]
    spine = np.where(t < 0.5, points[0] + (points[1] - points[0]) * 2 * t, points[1] + (points[2] - points[1]) * (2 * t - 1))
    inner = r - units.m(2.5)
    ribo_count = int(rng.poisson(max(1.0, length * inner * inner / units.s(5.0) ** 3)))
    ribo = spine[rng.integers(len(spine), size=ribo_count)] + rng.normal(size=(ribo_count, 3)) * inner * 0.35

    def build(obj: int, cell: int) -> list[Shape]:
        lo, hi = box_of(points, r + units.u)
        return [Mito(obj=obj, cell=cell, over=CYTO, lo_nm=lo, hi_nm=hi, points=points, radius_nm=r,
                     mem_nm=units.m(2.5), crista_nm=units.m(1.5), crista_spacing_nm=units.s(5.0), side=side,
                     ribosomes=ribo, ribosome_nm=units.m(1.2))]

    return Candidate(kind="mito", centers=spine, radii=np.full(len(spine), r), build=build)


def golgi(units: Units, center: np.ndarray, rng: np.random.Generator, size: float = 1.0) -> Candidate:
    """A stack of 3-6 curved cisternae centred at `center` (`size` < 1: fewer, smaller cisternae)."""
    count = max(3, round(int(rng.integers(4, 7)) * size))
    half = units.m(1.5) + units.s(1.0)
    spacing = 2 * half + units.s(2.0)
    bend = units.s(rng.uniform(20.0, 30.0)) * size
    half_angle = float(rng.uniform(0.4, 0.6))
    axis = sdf.random_rotation(rng)[:, 0]
    origin = center - axis * bend
    radii = tuple(bend + (k - (count - 1) / 2) * spacing for k in range(count))
    reach = float(np.hypot(max(radii) * np.sin(half_angle) + half, count * spacing / 2 + half))
    # Collision spheres: the stack is a curved disc, so a centre sphere and four rim spheres as thick as
    # the stack hug it much better than one bounding sphere.
    thick = (count - 1) * spacing / 2 + half
    rim = [center + sdf.frame_from_axis(axis)[:, k] * sign * bend * np.sin(half_angle)
           for k in (1, 2) for sign in (-1, 1)]
    centers = np.stack([center, *rim])

    def build(obj: int, cell: int) -> list[Shape]:
        lo, hi = box_of(center[None], reach + units.u)
        return [Golgi(obj=obj, cell=cell, over=CYTO, lo_nm=lo, hi_nm=hi, center=origin, axis=axis,
                      bend_radii_nm=radii, half_angle=half_angle, half_thick_nm=half, mem_nm=units.m(1.5))]

    return Candidate(kind="golgi", centers=centers, radii=np.full(len(centers), thick), build=build)


def random_walk(start: np.ndarray, direction: np.ndarray, *, step_nm: float, num_steps: int,
                turn: float, rng: np.random.Generator) -> np.ndarray:
    """A smooth random path: each step turns the direction by about `turn` radians."""
    points, d = [start], direction / np.linalg.norm(direction)
    for _ in range(num_steps):
        d = d + rng.normal(size=3) * turn
        d /= np.linalg.norm(d)
        points.append(points[-1] + d * step_nm)
    return np.array(points)


def tube_parts(points: np.ndarray, *, obj: int, cell: int, radius_nm: float, layers: sdf.Layers,
               margin_nm: float, over: frozenset[int] = CYTO, per_part: int = 3) -> list[Shape]:
    """Split a polyline tube into parts of `per_part` segments with tight bounding boxes."""
    shapes: list[Shape] = []
    for first in range(0, len(points) - 1, per_part):
        stop = min(first + per_part, len(points) - 1)
        lo, hi = box_of(points[first:stop + 1], radius_nm + margin_nm)
        shapes.append(Tube(obj=obj, cell=cell, over=over, lo_nm=lo, hi_nm=hi, points=points, first_segment=first,
                           stop_segment=stop, radius_nm=radius_nm, layers=layers))
    return shapes
