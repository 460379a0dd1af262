"""Where the crops go: the labels' grid inside the EM, and the labelled box cut into crops with a gap.

The labelled box is cut along one axis (`--split-axis`, default z) into three runs of whole voxels:

    [ training crops ... ][ gap ][ validation crops ]        (--val-side end, the default)

The validation run holds `val_fraction` of the box (at least one voxel); the gap is at least `gap_nm`
(rounded up to whole label voxels) and is in no crop, so every validation voxel is at least `gap_nm` away
from every training voxel along the axis: with the gap at least one training patch, no patch that
touches a training crop reaches a validation voxel. Each run is cut into crops of about `crop_nm` along
the axis (equal sizes, whole voxels); crops span the whole box on the other two axes. Crop ids count from
1 along the axis; a test box (EM voxels, outside the labelled box) gets the next id.

Positions follow the CellMap convention (`cellseg.data.crops`): translation = centre of voxel 0, in nm.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from cellseg.data.crops import Geometry
from cellseg.ingest.readers import AXES, Box

Role = Literal["train", "validate", "test"]
TOLERANCE = 1e-6  # relative slack of nm comparisons


@dataclass(frozen=True, kw_only=True)
class PlannedCrop:
    """One crop to write.

    Attributes:
        id: crop number (`crop<id>`).
        role: "train", "validate" or "test".
        box: voxel slices (z, y, x) of the labels' grid (of the EM's s0 for a test crop).
        geometry: its grid in world coordinates.
    """

    id: int
    role: Role
    box: Box
    geometry: Geometry


def em_geometry(shape_vox: Sequence[int], voxel_size_nm: Sequence[float]) -> Geometry:
    """The EM's s0 grid: voxel (0, 0, 0) centred at the origin."""
    return Geometry(voxel_size_nm=tuple(float(v) for v in voxel_size_nm), translation_nm=(0.0, 0.0, 0.0),  # type: ignore[arg-type]
                    shape_vox=tuple(int(n) for n in shape_vox))  # type: ignore[arg-type]


def label_geometry(em: Geometry, shape_vox: Sequence[int], *, voxel_size_nm: Sequence[float] | None,
                   offset_nm: Sequence[float] | None, source: str) -> Geometry:
    """The labels' grid: `voxel_size_nm` (default the EM's), lower corner `offset_nm` from the EM's (None: not
    given, 0; a given offset, 0 included, places labels of any shape).

    Raises:
        ValueError: with neither given, a shape other than the EM's; otherwise a box outside the EM.
    """
    vs = tuple(float(v) for v in (voxel_size_nm or em.voxel_size_nm))
    offset = (0.0, 0.0, 0.0) if offset_nm is None else tuple(float(o) for o in offset_nm)
    if len(vs) != 3 or min(vs) <= 0 or len(offset) != 3:
        raise ValueError(f"--labels-voxel-size {vs} / --labels-offset {offset}: need 3 values each (z, y, x, nm), "
                         f"voxel sizes positive")
    shape = tuple(int(n) for n in shape_vox)
    if voxel_size_nm is None and offset_nm is None and shape != em.shape_vox:
        raise ValueError(f"{source}: label shape {shape} (z, y, x) differs from the EM's {em.shape_vox}; labels of "
                         f"a sub-region or another grid need --labels-offset and/or --labels-voxel-size")
    start = [s + o for s, o in zip(em.start_nm, offset, strict=True)]
    geometry = Geometry(voxel_size_nm=vs, translation_nm=tuple(a + v / 2 for a, v in zip(start, vs, strict=True)),  # type: ignore[arg-type]
                        shape_vox=shape)  # type: ignore[arg-type]
    slack = [v / 2 for v in em.voxel_size_nm]  # half an EM voxel: rounding of the user's numbers
    if any(lo < elo - s or hi > ehi + s for lo, hi, elo, ehi, s in
           zip(geometry.start_nm, geometry.stop_nm, em.start_nm, em.stop_nm, slack, strict=True)):
        raise ValueError(f"{source}: the labelled box {_box_text(geometry)} nm lies (partly) outside the EM's "
                         f"{_box_text(em)} nm; check --labels-offset and --labels-voxel-size")
    return geometry


def _box_text(g: Geometry) -> str:
    return " × ".join(f"[{a:g}, {b:g})" for a, b in zip(g.start_nm, g.stop_nm, strict=True))


def sub_geometry(grid: Geometry, box: Box) -> Geometry:
    """The grid of a voxel box of `grid`."""
    return Geometry(voxel_size_nm=grid.voxel_size_nm,
                    translation_nm=tuple(t + s.start * v for t, s, v in  # type: ignore[arg-type]
                                         zip(grid.translation_nm, box, grid.voxel_size_nm, strict=True)),
                    shape_vox=tuple(s.stop - s.start for s in box))  # type: ignore[arg-type]


def _runs(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    """`start:stop` cut into pieces of about `size`, as equal as whole voxels allow."""
    count = max(1, round((stop - start) / size))
    edges = np.linspace(start, stop, count + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges) if b > a]


def plan_crops(grid: Geometry, *, axis: str, val_fraction: float, gap_nm: float, crop_nm: float,
               val_side: Literal["start", "end"] = "end") -> list[PlannedCrop]:
    """Training and validation crops of the labelled box (module docstring), in order along `axis`.

    Raises:
        ValueError: bad options, or a box too short along `axis` for validation + gap + training.
    """
    if axis not in AXES:
        raise ValueError(f"--split-axis {axis!r} must be one of z, y, x")
    if not 0 < val_fraction < 1:
        raise ValueError(f"--val-fraction {val_fraction} must be in (0, 1)")
    if gap_nm < 0 or crop_nm <= 0:
        raise ValueError(f"--gap-nm {gap_nm} must be >= 0 and --crop-nm {crop_nm} > 0")
    if val_side not in ("start", "end"):
        raise ValueError(f"--val-side {val_side!r} must be 'start' or 'end'")
    a = AXES.index(axis)
    n, v = grid.shape_vox[a], grid.voxel_size_nm[a]
    n_gap = math.ceil(gap_nm / v * (1 - TOLERANCE))
    n_val = max(1, round(val_fraction * n))
    n_train = n - n_gap - n_val
    if n_train < 1:
        raise ValueError(f"the labelled box is {n} voxels ({n * v:g} nm) along {axis}: too short for {n_val} "
                         f"validation + {n_gap} gap ({gap_nm:g} nm) + at least 1 training voxel; lower --gap-nm or "
                         f"--val-fraction, or split along another --split-axis")
    size = max(1, round(crop_nm / v))
    if val_side == "end":
        runs = [("train", r) for r in _runs(0, n_train, size)] + [("validate", r) for r in _runs(n - n_val, n, size)]
    else:
        runs = [("validate", r) for r in _runs(0, n_val, size)] + [("train", r) for r in _runs(n_val + n_gap, n, size)]
    crops = []
    for number, (role, (lo, hi)) in enumerate(runs, start=1):
        box = [slice(0, m) for m in grid.shape_vox]
        box[a] = slice(lo, hi)
        crops.append(PlannedCrop(id=number, role=role, box=tuple(box), geometry=sub_geometry(grid, tuple(box))))  # type: ignore[arg-type]
    return crops


def parse_box(text: str) -> Box:
    """`Z0:Z1,Y0:Y1,X0:X1` (voxels, end exclusive) → slices.

    Raises:
        ValueError: not three ranges of integers with start < stop.
    """
    parts = [p.strip() for p in text.split(",")]
    try:
        ranges = [tuple(int(x) for x in p.split(":")) for p in parts]
    except ValueError:
        ranges = []
    if len(ranges) != 3 or any(len(r) != 2 or not 0 <= r[0] < r[1] for r in ranges):
        raise ValueError(f"--test-box {text!r}: expected Z0:Z1,Y0:Y1,X0:X1 in EM voxels with 0 <= start < stop")
    return tuple(slice(lo, hi) for lo, hi in ranges)  # type: ignore[return-value]


def plan_test_crop(em: Geometry, box: Box, labelled: Geometry | None, number: int) -> PlannedCrop:
    """A test crop over `box` (EM s0 voxels), which must lie inside the EM and outside the labelled box.

    Raises:
        ValueError: the box leaves the EM or overlaps the labelled box.
    """
    if any(s.stop > n for s, n in zip(box, em.shape_vox, strict=True)):
        raise ValueError(f"--test-box {_slices_text(box)} leaves the EM, whose shape is {em.shape_vox} (z, y, x)")
    geometry = sub_geometry(em, box)
    if labelled is not None and all(lo < ohi - TOLERANCE and olo < hi - TOLERANCE for lo, hi, olo, ohi in
                                    zip(geometry.start_nm, geometry.stop_nm, labelled.start_nm, labelled.stop_nm,
                                        strict=True)):
        raise ValueError(f"--test-box {_slices_text(box)} overlaps the labelled box ({_box_text(labelled)} nm): its "
                         f"labels would be trained on; choose a box outside it")
    return PlannedCrop(id=number, role="test", box=box, geometry=geometry)


def _slices_text(box: Box) -> str:
    return ",".join(f"{s.start}:{s.stop}" for s in box)
