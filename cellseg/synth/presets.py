"""Presets of the synthetic dataset: which datasets, their EM grids, their crops and how cells look.

Lengths inside a scene are expressed in *units* `u` = the dataset's in-plane EM voxel size (x), so a
6 nm membrane at 4 nm voxels and a 12 nm membrane at 8 nm voxels both cover 1.5 voxels: every dataset
stays resolvable at its own s0, the way organelle sizes are "scaled to the voxel size".

| preset | datasets | EM per dataset | crops (train + test) | use |
|---|---|---|---|---|
| tiny   | 3 | 72–96³          | 6 + 2  | unit tests (a few seconds) |
| small  | 4 | 176–224³        | 13 + 4 | the CPU demo (< 1 min) |
| medium | 4 | 528–648³ (≥ 1 Gvoxel in all) | 24 + 4 | GPU benchmarks (`--workers 16`) |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cellseg.data.classes import tested_classes

Vec3 = tuple[float, float, float]
Shape3 = tuple[int, int, int]
Role = Literal["train", "test"]

_NOT_MT_ERES = {"mt", "mt_in", "mt_out", "eres", "eres_mem", "eres_lum"}
_ATOMS_LEFT_OUT = {"hchrom", "echrom", "mito_ribo", "golgi_mem", "golgi_lum", "ld_mem", "ld_lum"}
CLASS_SETS: dict[str, tuple[str, ...]] = {
    # every tested class (like most real crops, which list all 48)
    "all": tested_classes(),
    # microtubules and ER exit sites not annotated
    "no_mt_eres": tuple(c for c in tested_classes() if c not in _NOT_MT_ERES),
    # groups annotated but some of their atoms not (chromatin, mito ribosomes, Golgi, lipid droplet parts)
    "groups": tuple(c for c in tested_classes() if c not in _ATOMS_LEFT_OUT),
    # what coarse real crops (16-32 nm) annotate: large organelles only
    "coarse": ("cell", "ecs", "nuc", "mito", "ld", "ld_mem", "ld_lum", "perox", "perox_mem", "perox_lum",
               "er", "golgi", "lyso", "endo"),
}


@dataclass(frozen=True, kw_only=True)
class CropSpec:
    """One crop to place in a dataset.

    Attributes:
        role: "train" (labels under the dataset's groundtruth; split into train/validate later) or
            "test" (labels only in `ground_truth.zarr`).
        scale: crop voxel size = EM s0 voxel size × scale (1, 2 or 4).
        shape_vox: crop shape in crop voxels (z, y, x).
        classes: key of `CLASS_SETS`: the classes annotated in this crop.
    """

    role: Role
    scale: int
    shape_vox: Shape3
    classes: str = "all"

    def __post_init__(self) -> None:
        if self.classes not in CLASS_SETS:
            raise ValueError(f"unknown class set {self.classes!r}; choose one of {sorted(CLASS_SETS)}")
        if self.scale not in (1, 2, 4):
            raise ValueError(f"crop scale must be 1, 2 or 4 (× EM s0 voxel size), got {self.scale}")


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """One synthetic dataset (one FIB-SEM volume).

    Attributes:
        name: dataset name (`<name>/<name>.zarr`).
        voxel_size_nm: EM s0 voxel size (z, y, x).
        shape_vox: EM s0 shape.
        origin_nm: translation of EM s0 (centre of voxel 0).
        crops: crops to place, in order.
        z_black_vox: leading z slices left black (not imaged), besides a black corner wedge.
    """

    name: str
    voxel_size_nm: Vec3
    shape_vox: Shape3
    crops: tuple[CropSpec, ...]
    origin_nm: Vec3 = (0.0, 0.0, 0.0)
    z_black_vox: int = 0

    @property
    def unit_nm(self) -> float:
        """The scene length unit: the in-plane (x) voxel size."""
        return float(self.voxel_size_nm[2])


@dataclass(frozen=True, kw_only=True)
class SceneStyle:
    """How cells look, in scene units (see the module docstring).

    Attributes:
        cell_diameter_u: typical cell diameter.
        organelle_scale: multiplies organelle sizes (not membrane thicknesses).
        density: multiplies organelle counts.
    """

    cell_diameter_u: float
    organelle_scale: float
    density: float = 1.0


@dataclass(frozen=True, kw_only=True)
class Preset:
    """A named set of datasets plus generation settings.

    Attributes:
        block_vox: EM is rendered in cubes of this many voxels (fixed per preset, so outputs do not
            depend on the number of workers).
        validation_fraction: share of training crops put in the validation split (at least enough to
            cover every class).
    """

    name: str
    datasets: tuple[DatasetSpec, ...]
    style: SceneStyle
    block_vox: int = 128
    validation_fraction: float = 0.2

    @property
    def num_em_voxels(self) -> int:
        """EM s0 voxels over all datasets."""
        return sum(d.shape_vox[0] * d.shape_vox[1] * d.shape_vox[2] for d in self.datasets)


def _c(role: Role, scale: int, shape: int | Shape3, classes: str = "all") -> CropSpec:
    shape3 = (shape, shape, shape) if isinstance(shape, int) else shape
    return CropSpec(role=role, scale=scale, shape_vox=shape3, classes=classes)


ANISO_VOXEL_NM = (2.62, 2.0, 2.0)  # jrc_hela-2's EM voxel size; scaled up per preset


def _aniso(factor: float) -> Vec3:
    return tuple(round(v * factor, 4) for v in ANISO_VOXEL_NM)  # type: ignore[return-value]


TINY = Preset(name="tiny", style=SceneStyle(cell_diameter_u=110, organelle_scale=0.75), block_vox=96, datasets=(
    DatasetSpec(name="synth-iso4-1", voxel_size_nm=(4.0, 4.0, 4.0), shape_vox=(96, 96, 96), z_black_vox=2,
                crops=(_c("train", 1, 32), _c("train", 2, 16, "no_mt_eres"), _c("test", 1, 32))),
    DatasetSpec(name="synth-aniso-1", voxel_size_nm=_aniso(2), shape_vox=(72, 96, 96),
                crops=(_c("train", 1, (24, 32, 32)), _c("train", 1, (24, 32, 32), "groups"))),
    DatasetSpec(name="synth-iso8-1", voxel_size_nm=(8.0, 8.0, 8.0), shape_vox=(80, 80, 80),
                origin_nm=(800.0, 400.0, 1200.0),
                crops=(_c("train", 1, 32), _c("train", 2, 16, "coarse"), _c("test", 2, 16, "coarse"))),
))

SMALL = Preset(name="small", style=SceneStyle(cell_diameter_u=170, organelle_scale=1.2), datasets=(
    DatasetSpec(name="synth-iso4-1", voxel_size_nm=(4.0, 4.0, 4.0), shape_vox=(224, 224, 224), z_black_vox=3,
                crops=(_c("train", 1, 64), _c("train", 1, 64), _c("train", 1, 64, "no_mt_eres"),
                       _c("train", 4, 20, "coarse"), _c("test", 1, 64))),
    DatasetSpec(name="synth-aniso-1", voxel_size_nm=_aniso(2), shape_vox=(176, 224, 224),
                crops=(_c("train", 1, (48, 64, 64)), _c("train", 1, (48, 64, 64)),
                       _c("train", 1, (48, 64, 64), "groups"), _c("test", 2, (24, 32, 32), "coarse"))),
    DatasetSpec(name="synth-iso8-1", voxel_size_nm=(8.0, 8.0, 8.0), shape_vox=(192, 192, 192),
                origin_nm=(800.0, 400.0, 1200.0),
                crops=(_c("train", 1, 56), _c("train", 1, 56, "no_mt_eres"), _c("train", 2, 32, "coarse"),
                       _c("test", 1, 56))),
    DatasetSpec(name="synth-iso4-2", voxel_size_nm=(4.0, 4.0, 4.0), shape_vox=(192, 192, 192),
                origin_nm=(0.0, 2000.0, 4000.0),
                crops=(_c("train", 1, 64), _c("train", 1, 64, "groups"), _c("train", 2, 32),
                       _c("test", 1, 64))),
))

_M = 648  # 3 × 648³ + 528 × 648² ≈ 1.04 Gvoxel; 648 = 6 render blocks of 108
MEDIUM = Preset(name="medium", style=SceneStyle(cell_diameter_u=300, organelle_scale=1.5), block_vox=108, datasets=tuple(
    DatasetSpec(name=name, voxel_size_nm=vs, shape_vox=shape, origin_nm=origin, z_black_vox=black,
                crops=(_c("train", 1, crop), _c("train", 1, crop), _c("train", 1, crop),
                       _c("train", 1, crop, "no_mt_eres" if i % 2 else "groups"),
                       _c("train", 2, tuple(c // 2 for c in crop), "coarse"),  # type: ignore[arg-type]
                       _c("train", 4, tuple(c // 4 for c in crop), "coarse"),  # type: ignore[arg-type]
                       _c("test", 1, crop)))
    for i, (name, vs, shape, origin, black, crop) in enumerate((
        ("synth-iso4-1", (4.0, 4.0, 4.0), (_M, _M, _M), (0.0, 0.0, 0.0), 4, (160, 160, 160)),
        ("synth-aniso-1", _aniso(2), (528, _M, _M), (0.0, 0.0, 0.0), 0, (128, 160, 160)),
        ("synth-iso8-1", (8.0, 8.0, 8.0), (_M, _M, _M), (800.0, 400.0, 1200.0), 0, (160, 160, 160)),
        ("synth-iso4-2", (4.0, 4.0, 4.0), (_M, _M, _M), (0.0, 2000.0, 4000.0), 2, (160, 160, 160)),
    ))
))

PRESETS: dict[str, Preset] = {p.name: p for p in (TINY, SMALL, MEDIUM)}


def get_preset(name: str) -> Preset:
    """Look up a preset by name.

    Raises:
        ValueError: unknown name (the message lists the valid ones).
    """
    if name not in PRESETS:
        raise ValueError(f"unknown synth preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]
