"""A synthetic scene: cells, nuclei and organelles as analytic shapes in world space (nm), plus crop boxes.

One scene is built per dataset, deterministically from `(seed, dataset index)`:
1. cells: a Voronoi tiling of jittered seeds with a wavy extracellular cleft; about one region in five
   is extracellular space;
2. one nucleus per cell at its seed;
3. black (not imaged) regions: a corner wedge along z and optionally the first z slices;
4. crops: boxes on crop grids aligned to the EM grid (translation = EM start + k·crop voxel + half a crop
   voxel), aimed at the band between a nucleus and its cell border, imaged, not overlapping each other;
5. a "kit" of every organelle kind inside every crop, then organelles everywhere to the preset density.

EM (`render.py`) and labels (`rasterize.py`) are both rasterised from the scene, so they agree on
every grid.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cellseg.data.crops import Geometry
from cellseg.synth import populate, sdf
from cellseg.synth.kinds import CYTO, Units, box_of
from cellseg.synth.presets import CLASS_SETS, CropSpec, DatasetSpec, Role, SceneStyle
from cellseg.synth.shapes import Cells, Nucleus, Shape

PLACEMENT_ROUNDS = 5
HalfSpace = tuple[np.ndarray, np.ndarray]  # (point, normal): black where (p - point) · normal < 0


@dataclass(frozen=True, kw_only=True)
class PlacedCrop:
    """A crop box of a scene: its id, role, annotated classes and grid."""

    id: int
    dataset: str
    role: Role
    classes: tuple[str, ...]
    geometry: Geometry


@dataclass(frozen=True, kw_only=True, eq=False)
class Scene:
    """Everything needed to rasterise one dataset (see the module docstring).

    Attributes:
        objects: object id → (kind, parent object id); kinds are instance class names (`mito`, `np`)
            or `er`, `eres`, `golgi`.
        black: half-spaces outside which nothing was imaged (EM value 0).
    """

    name: str
    index: int
    seed: int
    em: Geometry
    units: Units
    cells: Cells
    shapes: tuple[Shape, ...]
    objects: Mapping[int, tuple[str, int]]
    black: tuple[HalfSpace, ...]
    crops: tuple[PlacedCrop, ...]

    @functools.cached_property
    def _boxes(self) -> tuple[np.ndarray, np.ndarray]:
        lo = np.array([s.lo_nm for s in self.shapes], dtype=float).reshape(-1, 3)
        hi = np.array([s.hi_nm for s in self.shapes], dtype=float).reshape(-1, 3)
        return lo, hi

    def shapes_in(self, lo_nm: Sequence[float], hi_nm: Sequence[float]) -> list[Shape]:
        """Shapes whose bounding box meets the box [lo, hi], in painting order."""
        lo, hi = self._boxes
        hit = np.all(lo <= np.asarray(hi_nm), axis=1) & np.all(hi >= np.asarray(lo_nm), axis=1)
        return [self.shapes[i] for i in np.flatnonzero(hit)]

    def imaged(self, z: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
        """True where the volume was imaged (outside every black region)."""
        out = np.ones(np.broadcast_shapes(np.shape(z), np.shape(y), np.shape(x)), dtype=bool)
        for point, normal in self.black:
            out &= (z - point[0]) * normal[0] + (y - point[1]) * normal[1] + (x - point[2]) * normal[2] >= 0
        return out

    @functools.cached_property
    def _luts(self) -> dict[str, np.ndarray]:
        return {}

    def instance_lut(self, kind: str) -> np.ndarray:
        """Object id → id of the object of `kind` that is it or its ancestor (0 if none)."""
        if kind not in self._luts:
            table = np.zeros(max(self.objects, default=0) + 1, dtype=np.uint32)
            for obj in self.objects:
                node = obj
                while node and self.objects[node][0] != kind:
                    node = self.objects[node][1]
                table[obj] = node
            self._luts[kind] = table
        return self._luts[kind]


def make_cells(rng: np.random.Generator, lo: np.ndarray, hi: np.ndarray, units: Units,
               diameter_nm: float, seed: int) -> Cells:
    """Jittered-lattice Voronoi seeds covering the box (and half a cell beyond)."""
    start, stop = lo - diameter_nm / 2, hi + diameter_nm / 2
    counts = np.maximum(1, np.round((stop - start) / diameter_nm)).astype(int)
    grid = np.array(list(itertools.product(*(range(n) for n in counts))), dtype=float)
    seeds = start + (grid + 0.5 + rng.uniform(-0.4, 0.4, grid.shape)) * (stop - start) / counts
    ids = np.where(rng.random(len(seeds)) < 0.12, 0, np.arange(1, len(seeds) + 1)).astype(np.uint16)
    central = int(np.argmin(np.linalg.norm(seeds - (lo + hi) / 2, axis=1)))
    ids[central] = central + 1  # the cell nearest the volume centre always exists
    return Cells(seeds_nm=seeds, cell_ids=ids, gap_nm=units.m(4.0), lake_nm=units.s(4.0), pm_nm=units.m(1.75),
                 wobble_nm=units.s(6.0), feature_nm=units.s(24.0), warp_nm=0.09 * diameter_nm,
                 warp_feature_nm=0.6 * diameter_nm, seed=seed)


def make_nuclei(builder: populate.Builder, cells: Cells) -> None:
    """One nucleus per cell, centred on its seed, about half as wide as the distance to the next seed."""
    u, rng = builder.units, builder.rng
    seeds = cells.seeds_nm
    gaps = np.linalg.norm(seeds[:, None] - seeds[None], axis=2) + np.eye(len(seeds)) * 1e12
    for k in np.flatnonzero(cells.cell_ids):
        r = rng.uniform(0.55, 0.65) * gaps[k].min() / 2
        radii = (r, r * rng.uniform(0.85, 1.0), r * rng.uniform(0.7, 0.9))
        wobble = u.s(1.5)
        cell = int(cells.cell_ids[k])
        lo, hi = box_of(seeds[k][None], r + wobble + u.u)
        builder.nuclei[cell] = Nucleus(
            obj=builder.new_object("nuc"), cell=cell, over=CYTO, lo_nm=lo, hi_nm=hi,
            center=seeds[k], radii=radii, rot=sdf.random_rotation(rng), wobble_nm=wobble, mem_nm=u.m(1.5),
            lum_nm=u.s(2.0), hchrom_nm=u.s(5.0), feature_nm=u.s(6.0), seed=int(rng.integers(2**31)))
    builder.layers["nucleus"].extend(builder.nuclei.values())


def black_regions(rng: np.random.Generator, em: Geometry, z_black_vox: int) -> tuple[HalfSpace, ...]:
    """A corner wedge (running along z) cut off in y/x, plus the first `z_black_vox` slices."""
    lo, hi = np.array(em.start_nm), np.array(em.stop_nm)
    sy, sx = rng.choice([-1.0, 1.0], size=2)
    corner = np.array([lo[0], lo[1] if sy > 0 else hi[1], lo[2] if sx > 0 else hi[2]])
    leg = rng.uniform(0.18, 0.28) * min(hi[1] - lo[1], hi[2] - lo[2])
    normal = np.array([0.0, sy, sx]) / np.sqrt(2)
    regions = [(corner + np.array([0.0, sy * leg, 0.0]), normal)]
    if z_black_vox:
        regions.append((np.array([lo[0] + z_black_vox * em.voxel_size_nm[0], 0, 0]), np.array([1.0, 0, 0])))
    return tuple(regions)


def _crop_geometry(em: Geometry, scale: int, shape: Sequence[int], center_nm: np.ndarray) -> Geometry | None:
    vs = np.array(em.voxel_size_nm) * scale
    start = np.array(em.start_nm)
    room = np.floor(np.array(em.extent_nm) / vs + 1e-6).astype(int) - np.array(shape)
    if np.any(room < 0):
        return None
    k = np.clip(np.round((center_nm - start) / vs - np.array(shape) / 2), 0, room).astype(int)
    return Geometry(voxel_size_nm=tuple(map(float, vs)), translation_nm=tuple(map(float, start + (k + 0.5) * vs)),
                    shape_vox=tuple(int(s) for s in shape))  # type: ignore[arg-type]


def _center(geometry: Geometry) -> np.ndarray:
    return (np.array(geometry.start_nm) + np.array(geometry.stop_nm)) / 2


def _fits(geometry: Geometry, scene_black: Sequence[HalfSpace], taken: Sequence[Geometry], pad_nm: float) -> bool:
    lo, hi = np.array(geometry.start_nm), np.array(geometry.stop_nm)
    for other in taken:
        if np.all(lo < np.array(other.stop_nm) + pad_nm) and np.all(hi > np.array(other.start_nm) - pad_nm):
            return False
    corners = np.array(list(itertools.product(*zip(lo, hi, strict=True))))
    for point, normal in scene_black:
        if np.any((corners - point) @ normal < 0):
            return False
    return True


def _near(nuclei: Mapping[int, Nucleus], lo: np.ndarray, hi: np.ndarray) -> list[Nucleus]:
    near = [n for n in nuclei.values() if np.linalg.norm(n.center - np.clip(n.center, lo, hi)) < np.mean(n.radii)]
    return near or list(nuclei.values())


def _nucleus_site(rng: np.random.Generator, nuclei: Mapping[int, Nucleus], lo: np.ndarray, hi: np.ndarray,
                  extent_nm: np.ndarray) -> np.ndarray:
    """A crop centre just outside a nucleus, so the crop holds nuclear envelope, nucleus and cytosol."""
    candidates = _near(nuclei, lo, hi)
    nucleus = candidates[int(rng.integers(len(candidates)))]
    direction = rng.normal(size=3)
    direction /= np.linalg.norm(direction)
    radius = 1 / np.sqrt(np.sum((nucleus.rot.T @ direction / np.asarray(nucleus.radii)) ** 2))
    return nucleus.center + direction * (radius + 0.2 * float(np.min(extent_nm)))


def _border_site(rng: np.random.Generator, cells: Cells, nuclei: Mapping[int, Nucleus], lo: np.ndarray,
                 hi: np.ndarray) -> np.ndarray:
    """A point on the border between a cell and a neighbouring region (pm, extracellular space, cytosol)."""
    candidates = _near(nuclei, lo, hi)
    center = candidates[int(rng.integers(len(candidates)))].center
    others = cells.seeds_nm[np.linalg.norm(cells.seeds_nm - center, axis=1) > 1e-6]
    if not len(others):  # a volume holding a single cell has no cell-cell border: any point will do
        return rng.uniform(lo, hi)
    nearest = others[np.argsort(np.linalg.norm(others - center, axis=1))[:4]]
    return (center + nearest[int(rng.integers(len(nearest)))]) / 2


def _aim(rng: np.random.Generator, number: int, attempt: int, cells: Cells, nuclei: Mapping[int, Nucleus],
         lo: np.ndarray, hi: np.ndarray, extent: np.ndarray) -> np.ndarray:
    if attempt >= 400:
        return rng.uniform(lo, hi)
    if number % 2:
        return _border_site(rng, cells, nuclei, lo, hi)
    return _nucleus_site(rng, nuclei, lo, hi, extent)


def _sample_crop(rng: np.random.Generator, crop: CropSpec, number: int, em: Geometry, cells: Cells,
                 nuclei: Mapping[int, Nucleus], black: Sequence[HalfSpace], taken: Sequence[Geometry]
                 ) -> Geometry | None:
    """Random placements: 400 aimed ones (see `place_crops`), then 200 anywhere in or near a cell."""
    lo, hi = np.array(em.start_nm), np.array(em.stop_nm)
    extent = np.array(crop.shape_vox) * np.array(em.voxel_size_nm) * crop.scale
    for attempt in range(600):
        aim = _aim(rng, number, attempt, cells, nuclei, lo, hi, extent)
        geometry = _crop_geometry(em, crop.scale, crop.shape_vox, aim + rng.normal(size=3) * 0.05 * extent)
        slack = 0.2 if number % 2 == 0 else 0.35  # nucleus-aimed crops must stay on their nucleus
        if geometry is None or (attempt < 400 and np.any(np.abs(_center(geometry) - aim) > slack * extent)):
            continue
        center = _center(geometry)
        if cells.depth(center[:1], center[1:2], center[2:])[1][0] < -cells.gap_nm:
            continue  # deep in extracellular space
        if _fits(geometry, black, taken, pad_nm=max(em.voxel_size_nm)):
            return geometry
    return None


def _scan_crop(crop: CropSpec, em: Geometry, black: Sequence[HalfSpace], taken: Sequence[Geometry]
               ) -> Geometry | None:
    """The first free position on a lattice of quarter-crop steps (the fallback when sampling fails)."""
    vs = np.array(em.voxel_size_nm) * crop.scale
    step = np.array(crop.shape_vox) * vs / 4
    axes = [np.arange(lo + e / 2, hi - e / 2 + 1e-6, s) for lo, hi, e, s in
            zip(em.start_nm, em.stop_nm, np.array(crop.shape_vox) * vs, step, strict=True)]
    for center in itertools.product(*axes):
        geometry = _crop_geometry(em, crop.scale, crop.shape_vox, np.array(center))
        if geometry is not None and _fits(geometry, black, taken, pad_nm=max(em.voxel_size_nm)):
            return geometry
    return None


def place_crops(rng: np.random.Generator, spec: DatasetSpec, em: Geometry, cells: Cells,
                nuclei: Mapping[int, Nucleus], black: Sequence[HalfSpace], crop_ids: Sequence[int]
                ) -> tuple[PlacedCrop, ...]:
    """Place every crop of `spec` inside the imaged volume, none overlapping another.

    Crops alternate between two aims: just outside a nucleus (envelope, pores, chromatin) and on a cell
    border (plasma membrane, extracellular space), so that a few crops together hold every class. If
    random placement fails, a lattice scan takes the first free position.

    Raises:
        ValueError: the crops of the preset cannot be placed (volume too small for its crops).
    """
    for _ in range(PLACEMENT_ROUNDS):  # earlier crops can block later ones: start over a few times
        placed: list[Geometry] = []
        for number, crop in enumerate(spec.crops):
            geometry = (_sample_crop(rng, crop, number, em, cells, nuclei, black, placed)
                        or _scan_crop(crop, em, black, placed))
            if geometry is None:
                break
            placed.append(geometry)
        else:
            return tuple(PlacedCrop(id=i, dataset=spec.name, role=c.role, classes=CLASS_SETS[c.classes], geometry=g)
                         for i, c, g in zip(crop_ids, spec.crops, placed, strict=True))
    raise ValueError(f"preset dataset {spec.name}: cannot place its {len(spec.crops)} crops in an EM volume of "
                     f"{spec.shape_vox} voxels without overlaps or black regions")


def build_scene(spec: DatasetSpec, style: SceneStyle, *, seed: int, index: int, crop_ids: Sequence[int]) -> Scene:
    """Build the scene of dataset number `index` of a preset (deterministic in `seed` and `index`)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFF, index, 0x5CE7E]))
    units = Units(u=spec.unit_nm, scale=style.organelle_scale)
    em = Geometry(voxel_size_nm=spec.voxel_size_nm, translation_nm=spec.origin_nm, shape_vox=spec.shape_vox)
    lo, hi = np.array(em.start_nm), np.array(em.stop_nm)
    diameter = style.cell_diameter_u * units.u
    cells = make_cells(rng, lo, hi, units, diameter, seed=int(rng.integers(2**31)))
    builder = populate.Builder(units=units, cells=cells, nuclei={}, rng=rng)
    make_nuclei(builder, cells)
    black = black_regions(rng, em, spec.z_black_vox)
    crops = place_crops(rng, spec, em, cells, builder.nuclei, black, crop_ids)
    for crop in crops:
        populate.plant_kit(builder, np.array(crop.geometry.start_nm), np.array(crop.geometry.stop_nm))
    populate.fill(builder, lo, hi, density=style.density, cell_diameter_nm=diameter)
    return Scene(name=spec.name, index=index, seed=seed, em=em, units=units, cells=cells,
                 shapes=tuple(builder.shapes), objects=dict(builder.objects), black=black, crops=crops)
