"""Rasterising a scene on any voxel grid, and deriving the CellMap label arrays from the result.

`rasterize` samples the scene at voxel centres: one atom id, one cell id and one (innermost) object id
per voxel. Everything written to disk derives from that one raster, so the arrays of a crop agree with
each other by construction:
- an atom class is `atoms == id` (uint8 0/1);
- a semantic group is the union of its atoms (uint8 0/1);
- an instance class holds one id per object (uint32), relabelled by 26-connected components so each id
  is exactly one connected component (what the official evaluators assume), numbered 1..N (skipping 255,
  the "unknown" value of the encoding below, in a crop of 255 objects or more);
- `all` holds atom ids, with atoms the crop does not annotate replaced by their smallest annotated
  group (or 0), as in the official `all` arrays.

Every class array carries CellMap annotation metadata (`annotation_attrs`, schema `cellmap_schemas.annotation`):
its class, semantic or instance type, the encoding `{"absent": 0, "unknown": 255}` (plus `"present": 1` for
semantic arrays) and the complement counts of its own voxels. Synthetic crops are annotated everywhere, so the
"unknown" count is 0.

uint32 for instance ids: a large real crop can hold more than 65,535 vesicles or microtubule pieces,
and one dtype for every instance array keeps readers simple; zstd makes the extra bytes nearly free.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from cellseg.classes import get_class
from cellseg.data.crops import Geometry
from cellseg.synth.atoms import ATOM_NAMES, atom, lut, scene_atom_ids
from cellseg.synth.scene import Scene

INSTANCE_DTYPE = np.uint32
CONNECTIVITY = 26
ABSENT, UNKNOWN, PRESENT = 0, 255, 1  # the stored value of each annotation possibility


@dataclass(frozen=True, kw_only=True, eq=False)
class Raster:
    """A scene sampled on a grid: atom ids (uint8), cell ids (uint16), object ids (uint32)."""

    atoms: np.ndarray
    cell: np.ndarray
    obj: np.ndarray


def axes_nm(geometry: Geometry) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Voxel-centre coordinates of a grid, as a broadcast triple `(nz,1,1), (1,ny,1), (1,1,nx)` (float32)."""
    out = []
    for axis, (t, v, n) in enumerate(zip(geometry.translation_nm, geometry.voxel_size_nm, geometry.shape_vox,
                                         strict=True)):
        shape = [1, 1, 1]
        shape[axis] = n
        out.append((t + v * np.arange(n, dtype=np.float64)).astype(np.float32).reshape(shape))
    return out[0], out[1], out[2]


@functools.lru_cache(maxsize=64)
def _over_lut(ids: frozenset[int]) -> np.ndarray:
    return lut(ids)


def _index_box(geometry: Geometry, lo_nm: tuple[float, ...], hi_nm: tuple[float, ...]) -> tuple[slice, ...] | None:
    box = []
    for t, v, n, lo, hi in zip(geometry.translation_nm, geometry.voxel_size_nm, geometry.shape_vox, lo_nm, hi_nm,
                               strict=True):
        start, stop = max(0, int(np.ceil((lo - t) / v))), min(n, int(np.floor((hi - t) / v)) + 1)
        if start >= stop:
            return None
        box.append(slice(start, stop))
    return tuple(box)


def rasterize(scene: Scene, geometry: Geometry) -> Raster:
    """Sample the scene at the voxel centres of `geometry` (any voxel size, inside or outside the EM box)."""
    z, y, x = axes_nm(geometry)
    min_thick = float(max(geometry.voxel_size_nm))
    atoms, cell = scene.cells.paint(z, y, x, min_thick)
    obj = np.zeros(atoms.shape, dtype=np.uint32)
    for shape in scene.shapes_in(geometry.start_nm, geometry.stop_nm):
        box = _index_box(geometry, shape.lo_nm, shape.hi_nm)
        if box is None:
            continue
        new = shape.paint(z[box[0]], y[:, box[1]], x[:, :, box[2]], min_thick)
        current = atoms[box]
        ok = (new != 0) & _over_lut(shape.over)[current] & (cell[box] == shape.cell)
        current[ok] = new[ok]
        obj[box][ok] = shape.obj
    return Raster(atoms=atoms, cell=cell, obj=obj)


def class_array(raster: Raster, name: str, scene: Scene) -> np.ndarray:
    """The label array of one class (module docstring: dtypes and meaning)."""
    import cc3d

    cls = get_class(name)
    mask = lut(scene_atom_ids(name))[raster.atoms]
    if not cls.instance:
        return mask.astype(np.uint8)
    source = raster.cell if name == "cell" else scene.instance_lut(name)[raster.obj]
    ids = np.where(mask, source, 0).astype(INSTANCE_DTYPE)
    ids = cc3d.connected_components(ids, connectivity=CONNECTIVITY, out_dtype=INSTANCE_DTYPE)
    if ids.max(initial=0) >= UNKNOWN:  # no object takes the "unknown" value
        ids[ids >= UNKNOWN] += 1
    return ids


def annotation_attrs(name: str, data: np.ndarray | None = None) -> dict[str, object]:
    """The `cellmap.annotation` attributes of a class's label group (`data` None) or of one of its level arrays
    (with the complement counts of `data`)."""
    instance = get_class(name).instance
    encoding = {"absent": ABSENT, "unknown": UNKNOWN, **({} if instance else {"present": PRESENT})}
    note: dict[str, object] = {"class_name": name, "annotation_type": {
        "type": "instance_segmentation" if instance else "semantic_segmentation", "encoding": encoding}}
    if data is not None:
        note["complement_counts"] = {"absent": int(np.count_nonzero(data == ABSENT)),
                                     "unknown": int(np.count_nonzero(data == UNKNOWN))}
    return {"cellmap": {"annotation": note}}


def all_array(raster: Raster, annotated: Iterable[str]) -> np.ndarray:
    """The `all` array: most granular annotated class id per voxel (uint8)."""
    annotated = set(annotated)
    table = np.zeros(256, dtype=np.uint8)
    for name in ATOM_NAMES:
        table[atom(name)] = _granular_id(name, annotated)
    return table[raster.atoms]


def _granular_id(atom_name: str, annotated: set[str]) -> int:
    if atom_name in annotated:
        return atom(atom_name)
    groups = [get_class(g) for g in annotated if atom(atom_name) in get_class(g).atom_ids]
    return min(groups, key=lambda g: len(g.atom_ids)).id if groups else 0
