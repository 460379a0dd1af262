"""Presets of the synthetic dataset: which datasets, their EM grids, their crops and how cells look.

Lengths inside a scene are expressed in *units* `u` = the dataset's in-plane EM voxel size (x), so a
6 nm membrane at 4 nm voxels and a 12 nm membrane at 8 nm voxels both cover 1.5 voxels: every dataset
stays resolvable at its own s0, the way organelle sizes are "scaled to the voxel size".

| preset | datasets | EM per dataset | crops (train + test) | use |
|---|---|---|---|---|
| tiny   | 3 | 72–96³          | 6 + 2  | unit tests (a few seconds) |
| small  | 4 | 176–224³        | 13 + 4 | the CPU demo (< 1 min) |
| medium | 4 | 528–648³ (≥ 1 Gvoxel in all) | 24 + 4 | GPU benchmarks (`--workers 16`) |
| quality | 4 | as `medium` | 24 + 8 | the quality benchmark (`bench/studies/quality`) |

`mirror_preset(mirror_crops(real_test_crops, scale))` (end of this file) builds a preset whose test crops are
laid out like real ones, scaled down (`bench/studies/test_set`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from cellseg.classes import tested_classes

if TYPE_CHECKING:
    from cellseg.data.crops import Crop

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



def _quality_crops(index: int, crop: Shape3, em_voxel_nm: Vec3) -> tuple[CropSpec, ...]:
    """Five full-resolution training crops (one annotating fewer classes), one coarse training crop at twice the
    EM voxel size, and two test crops: one at the EM voxel size, one at twice it (every class where that is
    still 8 nm or finer, the coarse set otherwise, as on the real coarse test crops)."""
    half: Shape3 = tuple(c // 2 for c in crop)  # type: ignore[assignment]
    coarse_test = "all" if max(em_voxel_nm) * 2 <= 8.0 else "coarse"
    return (*(_c("train", 1, crop) for _ in range(4)), _c("train", 1, crop, "no_mt_eres" if index % 2 else "groups"),
            _c("train", 2, half, "coarse"), _c("test", 1, crop), _c("test", 2, half, coarse_test))


# The quality benchmark's data (bench/studies/quality, docs/quality.md): `medium`'s four datasets, EM and cells (the same
# rendering cost) with its crops rebalanced for an 8 nm ensemble: 8 test crops instead of 4 (scored at 4,
# 5.24 x 4 x 4, 8, 10.5 x 8 x 8 and 16 nm), no training crops at 4x the EM voxel size (16-32 nm: no 8 nm model
# trains or validates on them) but one more full one per dataset, and a quarter of the training crops validating,
# so that both validation roles (tuning, report) get crops an 8 nm model uses.
QUALITY = Preset(name="quality", style=MEDIUM.style, block_vox=MEDIUM.block_vox, validation_fraction=0.25,
                 datasets=tuple(dataclasses.replace(d, crops=_quality_crops(i, d.crops[0].shape_vox, d.voxel_size_nm))
                                for i, d in enumerate(MEDIUM.datasets)))

PRESETS: dict[str, Preset] = {p.name: p for p in (TINY, SMALL, MEDIUM, QUALITY)}


def get_preset(name: str) -> Preset:
    """Look up a preset by name.

    Raises:
        ValueError: unknown name (the message lists the valid ones).
    """
    if name not in PRESETS:
        raise ValueError(f"unknown synth preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]


# ------------------------------------------------------------------------------------------------------------
# A test set laid out like a real one (`bench/studies/test_set`): one dataset per real dataset and one test crop per
# real test crop, its shape the real shape divided by `scale` (in crop voxels). A dataset's EM s0 voxel size is
# its finest real crop's; every other crop sits at s0 × 1, 2 or 4 (`CropSpec.scale`), the step nearest to the
# real ratio, so real 8× steps (4 → 32 nm) become 4× (4 → 16 nm). Crops listing every scored class annotate
# them all, the others the `coarse` set. Each dataset also gets one small training crop (runs need them).

MIRROR_MIN_CROP_VOX = 4  # smallest crop edge: a thinner crop has no interior to segment
MIRROR_TRAIN_CROP_VOX = 16  # the training crop per dataset
MIRROR_MARGIN_VOX = 8  # EM beyond the crops on every side
MIRROR_Y_ROOM = 1.5  # EM y extent per tallest crop: room beside the black corner wedge (≤ 28 % of y and x)
MIRROR_X_ROOM = 1.15  # EM x extent per summed crop width (crops lie side by side)
MIRROR_WEDGE_ROOM = 0.3  # extra EM x, as a share of its y extent: the wedge's leg
MIRROR_MIN_CELLS = 0.75  # a dataset's longest EM edge spans at least this many cell diameters (≥ 2 cells)


@dataclass(frozen=True, kw_only=True)
class MirroredCrop:
    """A synthetic test crop standing for a real one (`mirror_crops`).

    Attributes:
        real_id, dataset, real_voxel_size_nm, real_shape_vox, real_classes: the real crop (its number of labels).
        em_voxel_size_nm: the synthetic dataset's EM s0 voxel size.
        spec: the synthetic crop (scale × EM s0 voxel size, shape in crop voxels, class set).
    """

    real_id: int
    dataset: str
    real_voxel_size_nm: Vec3
    real_shape_vox: Shape3
    real_classes: int
    em_voxel_size_nm: Vec3
    spec: CropSpec

    @property
    def voxel_size_nm(self) -> Vec3:
        """The synthetic crop's voxel size."""
        return tuple(v * self.spec.scale for v in self.em_voxel_size_nm)  # type: ignore[return-value]


def _nearest_scale(ratio: float) -> int:
    """The crop scale (1, 2 or 4) nearest to `ratio` in log steps."""
    return min((1, 2, 4), key=lambda s: abs(math.log2(s) - math.log2(max(ratio, 1.0))))


def mirror_crops(real: Mapping[int, Crop], scale: float) -> list[MirroredCrop]:
    """The synthetic test crops standing for `real` (e.g. `Catalog.official().test("2026")`), by dataset then id."""
    out = []
    for dataset in sorted({c.dataset for c in real.values()}):
        crops = sorted((c for c in real.values() if c.dataset == dataset), key=lambda c: c.id)
        em_vs = min((c.geometry.voxel_size_nm for c in crops), key=math.prod)
        for crop in crops:
            g = crop.geometry
            shape = tuple(max(MIRROR_MIN_CROP_VOX, round(n / scale)) for n in g.shape_vox)
            classes = "all" if set(crop.labels) >= set(tested_classes()) else "coarse"
            spec = CropSpec(role="test", scale=_nearest_scale(g.voxel_size_nm[2] / em_vs[2]), shape_vox=shape,  # type: ignore[arg-type]
                            classes=classes)
            out.append(MirroredCrop(real_id=crop.id, dataset=dataset, real_voxel_size_nm=g.voxel_size_nm,
                                    real_shape_vox=g.shape_vox, real_classes=len(crop.labels), em_voxel_size_nm=em_vs,
                                    spec=spec))
    return out


def mirror_dataset_name(dataset: str) -> str:
    """`jrc_mus-kidney` → `synth-mus-kidney`."""
    return "synth-" + dataset.removeprefix("jrc_")


def _mirror_em_shape(crops: Sequence[CropSpec]) -> Shape3:
    """EM s0 voxels with room for the crops side by side along x, and for the black wedge."""
    extents = [tuple(n * c.scale for n in c.shape_vox) for c in crops]
    z = max(e[0] for e in extents) + 2 * MIRROR_MARGIN_VOX
    y = math.ceil(MIRROR_Y_ROOM * max(e[1] for e in extents)) + 2 * MIRROR_MARGIN_VOX
    x = math.ceil(MIRROR_X_ROOM * sum(e[2] for e in extents) + MIRROR_WEDGE_ROOM * y) + 2 * MIRROR_MARGIN_VOX
    return z, y, x


def _mirror_style(datasets: Sequence[DatasetSpec]) -> SceneStyle:
    """The `medium` preset's cells, shrunk (organelles too, down to `tiny`'s) where an EM would hold one cell."""
    style = MEDIUM.style
    longest_u = min(max(n * v / d.unit_nm for n, v in zip(d.shape_vox, d.voxel_size_nm, strict=True))
                    for d in datasets)
    shrink = min(1.0, longest_u / MIRROR_MIN_CELLS / style.cell_diameter_u)
    return SceneStyle(cell_diameter_u=style.cell_diameter_u * shrink,
                      organelle_scale=max(TINY.style.organelle_scale, style.organelle_scale * shrink))


def mirror_preset(crops: Sequence[MirroredCrop], *, name: str = "test-mirror") -> Preset:
    """A preset holding `crops` (from `mirror_crops`): per dataset its test crops in order, then a training crop.
    `generate` numbers the test crops 501, 502, ... in this order."""
    datasets = []
    for dataset in dict.fromkeys(c.dataset for c in crops):
        mine = [c for c in crops if c.dataset == dataset]
        specs = (*(c.spec for c in mine), CropSpec(role="train", scale=1, shape_vox=(MIRROR_TRAIN_CROP_VOX,) * 3))
        datasets.append(DatasetSpec(name=mirror_dataset_name(dataset), voxel_size_nm=mine[0].em_voxel_size_nm,
                                    shape_vox=_mirror_em_shape(specs), crops=specs))
    return Preset(name=name, style=_mirror_style(datasets), datasets=tuple(datasets))
