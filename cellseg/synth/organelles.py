"""Organelle primitives painted into the cytosol: membrane-bound blobs, mitochondria, tubes (ER, microtubules),
ER sheets and Golgi stacks. See `shapes.py` for the painting contract."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cellseg.synth import sdf
from cellseg.synth.atoms import atom
from cellseg.synth.noise import value_noise
from cellseg.synth.shapes import Shape, Vec3


@dataclass(frozen=True, kw_only=True, eq=False)
class Blob(Shape):
    """A membrane-bound ellipsoid (vesicle, endosome, lysosome, lipid droplet, peroxisome, ER exit site)."""

    center: np.ndarray
    radii: Vec3
    rot: np.ndarray
    layers: sdf.Layers
    wobble_nm: float = 0.0
    seed: int = 0

    def paint(self, z: np.ndarray, y: np.ndarray, x: np.ndarray, min_thick_nm: float) -> np.ndarray:
        d = sdf.ellipsoid(z, y, x, center=self.center, radii=self.radii, rot=self.rot)
        if self.wobble_nm:
            d = d + self.wobble_nm * value_noise(z, y, x, spacing_nm=min(self.radii), seed=self.seed)
        return sdf.layers(d, self.layers, min_thick_nm)


@dataclass(frozen=True, kw_only=True, eq=False)
class Mito(Shape):
    """A mitochondrion: a bent capsule with a double-membrane shell, lamellar cristae and matrix ribosomes.

    Cristae are plates across the long axis every `crista_spacing_nm`, each attached to alternate sides
    (`side`) and reaching 70 % across the matrix; they are labelled `mito_mem` like the envelope.
    """

    points: np.ndarray  # (n, 3) centre line
    radius_nm: float
    mem_nm: float
    crista_nm: float
    crista_spacing_nm: float
    side: np.ndarray  # unit vector across the long axis
    ribosomes: np.ndarray  # (m, 3) centres of matrix ribosomes
    ribosome_nm: float

    def paint(self, z: np.ndarray, y: np.ndarray, x: np.ndarray, min_thick_nm: float) -> np.ndarray:
        dist, arc = sdf.polyline(z, y, x, self.points)
        out = sdf.layers(dist - np.float32(self.radius_nm),
                         ((atom("mito_mem"), self.mem_nm), (atom("mito_lum"), None)), min_thick_nm)
        lumen = out == atom("mito_lum")
        mid = self.points.mean(axis=0)
        lateral = (z - mid[0]) * self.side[0] + (y - mid[1]) * self.side[1] + (x - mid[2]) * self.side[2]
        index = np.floor(arc / np.float32(self.crista_spacing_nm))
        phase = arc - (index + 0.5) * np.float32(self.crista_spacing_nm)
        sign = np.where(index % 2 == 0, np.float32(1), np.float32(-1))
        crista = lumen & (np.abs(phase) < max(self.crista_nm, min_thick_nm) / 2) & (
            sign * lateral > -0.4 * self.radius_nm)
        out[crista] = atom("mito_mem")
        if len(self.ribosomes):
            near = sdf.points_distance(z, y, x, self.ribosomes) < max(self.ribosome_nm, min_thick_nm / 2)
            out[lumen & ~crista & near] = atom("mito_ribo")
        return out


@dataclass(frozen=True, kw_only=True, eq=False)
class Tube(Shape):
    """One part of a tube along a polyline (ER tubule, microtubule).

    Long tubes are split into parts (segments `first_segment` to `stop_segment`) so that each part has
    a tight bounding box; a part also looks at its neighbouring segments so that joints paint identically.
    """

    points: np.ndarray  # (n, 3) the whole centre line
    first_segment: int
    stop_segment: int
    radius_nm: float
    layers: sdf.Layers

    def paint(self, z: np.ndarray, y: np.ndarray, x: np.ndarray, min_thick_nm: float) -> np.ndarray:
        segments = range(max(0, self.first_segment - 1), min(len(self.points) - 1, self.stop_segment + 1))
        dist, _ = sdf.polyline(z, y, x, self.points, segments)
        radius = max(self.radius_nm, 0.6 * min_thick_nm)  # stays a connected tube on coarse grids
        return sdf.layers(dist - np.float32(radius), self.layers, min_thick_nm)


@dataclass(frozen=True, kw_only=True, eq=False)
class Sheet(Shape):
    """A gently warped ER sheet (cisterna): membrane around a thin lumen, with a rounded rim."""

    center: np.ndarray
    rot: np.ndarray  # first column: the sheet normal
    radius_nm: float
    half_thick_nm: float
    warp_nm: float
    seed: int
    layers: sdf.Layers

    def paint(self, z: np.ndarray, y: np.ndarray, x: np.ndarray, min_thick_nm: float) -> np.ndarray:
        warp = self.warp_nm * value_noise(z, y, x, spacing_nm=self.radius_nm, seed=self.seed)
        half = max(self.half_thick_nm, min_thick_nm)
        d = sdf.disk_sheet(z, y, x, center=self.center, rot=self.rot, radius_nm=self.radius_nm,
                           half_thick_nm=half, warp=warp)
        return sdf.layers(d, self.layers, min_thick_nm)


@dataclass(frozen=True, kw_only=True, eq=False)
class Golgi(Shape):
    """A Golgi stack: parallel curved cisternae (caps of concentric spheres) with swollen rims."""

    center: np.ndarray  # common centre of curvature
    axis: np.ndarray  # unit vector from the centre to the middle of the stack
    bend_radii_nm: tuple[float, ...]  # one per cisterna
    half_angle: float
    half_thick_nm: float
    mem_nm: float

    def paint(self, z: np.ndarray, y: np.ndarray, x: np.ndarray, min_thick_nm: float) -> np.ndarray:
        half = max(self.half_thick_nm, min_thick_nm)
        d = None
        for bend in self.bend_radii_nm:
            dk = sdf.curved_cisterna(z, y, x, center=self.center, axis=self.axis, bend_radius_nm=bend,
                                     half_angle=self.half_angle, half_thick_nm=half)
            d = dk if d is None else np.minimum(d, dk)
        assert d is not None, "a Golgi stack needs cisternae"
        return sdf.layers(d, ((atom("golgi_mem"), self.mem_nm), (atom("golgi_lum"), None)), min_thick_nm)
