"""Scene primitives: cells, nuclei with envelope and pores (this file); organelles in `organelles.py`.

A `Shape` paints atom ids onto voxel centres given as broadcast coordinates in nm. The rasteriser
(`rasterize.py`) evaluates each shape only inside its bounding box, writes its atoms where it paints
(non-zero), where the voxel currently holds an atom listed in `over` and belongs to the shape's cell,
and records the shape's object id there. Order matters: later shapes paint over earlier ones.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np

from cellseg.synth import sdf
from cellseg.synth.atoms import atom
from cellseg.synth.noise import value_noise

Vec3 = tuple[float, float, float]


@dataclass(frozen=True, kw_only=True, eq=False)
class Shape(abc.ABC):
    """Base of every painted primitive.

    Attributes:
        obj: object id recorded where the shape paints (see `Scene.objects`).
        cell: id of the cell the shape lives in; it paints only inside that cell.
        over: atom ids the shape may overwrite.
        lo_nm, hi_nm: bounding box (z, y, x) outside which the shape paints nothing.
    """

    obj: int
    cell: int
    over: frozenset[int]
    lo_nm: Vec3
    hi_nm: Vec3

    @abc.abstractmethod
    def paint(self, z: np.ndarray, y: np.ndarray, x: np.ndarray, min_thick_nm: float) -> np.ndarray:
        """Atom ids (uint8, 0 = leave as is) at the given voxel centres."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Cells:
    """Cells tiling space: Voronoi regions of `seeds_nm` in warped space, separated by a wavy cleft.

    Space is warped by a smooth displacement field (`warp_nm`, features `warp_feature_nm`) before the
    Voronoi test, so cell borders are curved rather than planar. Regions whose `cell_ids` entry is 0
    are extracellular. Inside a cell, the outermost `pm_nm` is plasma membrane and the rest cytosol
    (organelles are painted over the cytosol afterwards).
    """

    seeds_nm: np.ndarray  # (K, 3)
    cell_ids: np.ndarray  # (K,) uint16; 0 = an extracellular region
    gap_nm: float  # width of the thin extracellular cleft between neighbouring cells
    lake_nm: float  # extra half-width where the cleft widens into extracellular pockets
    pm_nm: float
    wobble_nm: float
    feature_nm: float
    warp_nm: float
    warp_feature_nm: float
    seed: int

    @property
    def reach_nm(self) -> float:
        """Beyond this depth inside a cell nothing depends on the exact distance to its border."""
        return self.gap_nm / 2 + self.lake_nm + self.wobble_nm + self.pm_nm + 1.0

    def _relevant(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        # Seeds that can be the nearest one, or whose border lies within `reach_nm`, for a point in the box.
        nearest = np.clip(self.seeds_nm, lo, hi)
        d_min = np.linalg.norm(self.seeds_nm - nearest, axis=1)
        far = np.where(self.seeds_nm - lo > hi - self.seeds_nm, lo, hi)
        d_max = np.linalg.norm(self.seeds_nm - far, axis=1)
        second = np.sort(d_max)[min(1, len(d_max) - 1)]
        return np.flatnonzero(d_min <= second + 2 * self.reach_nm)

    def _warp(self, z: np.ndarray, y: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        shift = [self.warp_nm * value_noise(z, y, x, spacing_nm=self.warp_feature_nm, seed=self.seed + 3 + k)
                 for k in range(3)]
        return z + shift[0], y + shift[1], x + shift[2]

    @staticmethod
    def _voronoi(z: np.ndarray, y: np.ndarray, x: np.ndarray, seeds: np.ndarray,
                 cap_nm: float) -> tuple[np.ndarray, np.ndarray]:
        """(index of the nearest seed, distance to its region's border capped at `cap_nm`) per position."""
        d2 = [(z - s[0]) ** 2 + (y - s[1]) ** 2 + (x - s[2]) ** 2 for s in seeds]  # a few seeds after pruning
        nearest = np.zeros(d2[0].shape, dtype=np.int32)
        best = d2[0]
        for k in range(1, len(seeds)):
            closer = d2[k] < best
            nearest[closer], best = k, np.where(closer, d2[k], best)
        border = np.full(best.shape, np.float32(cap_nm))
        pair = np.linalg.norm(seeds[:, None] - seeds[None], axis=2).astype(np.float32)
        for k in range(len(seeds)):
            to_k = (d2[k] - best) / (2 * np.maximum(pair[nearest, k], np.float32(1e-3)))
            border = np.where(nearest == k, border, np.minimum(border, to_k))
        return nearest, border

    def depth(self, z: np.ndarray, y: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(cell id, depth in nm below the cell's outer surface; <= 0 outside any cell) per position."""
        z, y, x = (np.asarray(a, dtype=np.float32) for a in (z, y, x))
        lo = np.array([a.min() for a in (z, y, x)], dtype=np.float64) - self.warp_nm
        hi = np.array([a.max() for a in (z, y, x)], dtype=np.float64) + self.warp_nm
        keep = self._relevant(lo, hi)
        nearest, border = self._voronoi(*self._warp(z, y, x), self.seeds_nm[keep].astype(np.float32),
                                        2 * self.reach_nm)
        half_gap = self.gap_nm / 2 + self.lake_nm * np.clip(
            value_noise(z, y, x, spacing_nm=3 * self.feature_nm, seed=self.seed + 1), 0, 1)
        wobble = self.wobble_nm * (0.75 * value_noise(z, y, x, spacing_nm=self.feature_nm, seed=self.seed)
                                   + 0.35 * value_noise(z, y, x, spacing_nm=self.feature_nm / 3, seed=self.seed + 2))
        ids = self.cell_ids[keep][nearest]
        depth = np.where(ids > 0, border - half_gap + wobble, -border - half_gap)  # ecs regions: < 0 everywhere
        return np.where(depth > 0, ids, 0).astype(np.uint16), depth.astype(np.float32)

    def paint(self, z: np.ndarray, y: np.ndarray, x: np.ndarray,
              min_thick_nm: float) -> tuple[np.ndarray, np.ndarray]:
        """(atoms, cell ids) of the background: ecs, pm and cytosol."""
        cell, depth = self.depth(z, y, x)
        atoms = np.full(depth.shape, atom("ecs"), dtype=np.uint8)
        atoms[depth > 0] = atom("pm")
        atoms[depth > max(self.pm_nm, min_thick_nm)] = atom("cyto")
        return atoms, cell


@dataclass(frozen=True, kw_only=True, eq=False)
class Nucleus(Shape):
    """A wavy ellipsoidal nucleus: envelope (membrane, lumen, membrane), chromatin and nucleoplasm."""

    center: np.ndarray
    radii: Vec3
    rot: np.ndarray
    wobble_nm: float
    mem_nm: float
    lum_nm: float
    hchrom_nm: float  # depth of the peripheral heterochromatin band below the envelope
    feature_nm: float  # size of chromatin clumps
    seed: int

    def sdf(self, z: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Signed distance to the nuclear surface (outer envelope membrane)."""
        wobble = value_noise(z, y, x, spacing_nm=4 * self.feature_nm, seed=self.seed)
        return sdf.ellipsoid(z, y, x, center=self.center, radii=self.radii, rot=self.rot) + self.wobble_nm * wobble

    def envelope_nm(self, min_thick_nm: float) -> float:
        """Envelope thickness on a grid with this minimum layer thickness."""
        return 2 * max(self.mem_nm, min_thick_nm) + max(self.lum_nm, min_thick_nm)

    def paint(self, z: np.ndarray, y: np.ndarray, x: np.ndarray, min_thick_nm: float) -> np.ndarray:
        d = self.sdf(z, y, x)
        spec = ((atom("ne_mem"), self.mem_nm), (atom("ne_lum"), self.lum_nm), (atom("ne_mem"), self.mem_nm),
                (atom("nucpl"), None))
        out = sdf.layers(d, spec, min_thick_nm)
        inner = -d - self.envelope_nm(min_thick_nm)
        clumps = value_noise(z, y, x, spacing_nm=self.feature_nm, seed=self.seed + 1)
        band = value_noise(z, y, x, spacing_nm=2 * self.feature_nm, seed=self.seed + 2)
        mottle = value_noise(z, y, x, spacing_nm=1.5 * self.feature_nm, seed=self.seed + 3)
        hetero = (inner < self.hchrom_nm * (0.7 + 0.6 * band)) & (band > -0.5) | (clumps > 0.42)
        out[(inner > 0) & (mottle > 0.0)] = atom("echrom")
        out[(inner > 0) & hetero] = atom("hchrom")
        return out


@dataclass(frozen=True, kw_only=True, eq=False)
class Pore(Shape):
    """A nuclear pore: a plug through the envelope (ring `np_out` around a channel `np_in`)."""

    nucleus: Nucleus
    point: np.ndarray  # on the nuclear surface
    normal: np.ndarray  # outward unit normal
    r_in_nm: float
    r_out_nm: float

    def paint(self, z: np.ndarray, y: np.ndarray, x: np.ndarray, min_thick_nm: float) -> np.ndarray:
        depth = -self.nucleus.sdf(z, y, x)
        in_band = (depth > 0) & (depth <= self.nucleus.envelope_nm(min_thick_nm))
        _, b, c = sdf.local_frame(z, y, x, self.point, sdf.frame_from_axis(self.normal))
        radial = np.broadcast_to(np.sqrt(b * b + c * c), depth.shape)
        r_in = max(self.r_in_nm, min_thick_nm / 2)
        r_out = max(self.r_out_nm, r_in + min_thick_nm)
        out = np.zeros(radial.shape, dtype=np.uint8)
        out[in_band & (radial < r_out)] = atom("np_out")
        out[in_band & (radial < r_in)] = atom("np_in")
        return out
