"""FIB-SEM appearance: turning a scene into uint8 EM, one block at a time.

Per voxel, from the atom raster (`rasterize.py`) of a block grown by a halo:
1. a mean grey level per atom (`LOOKS`: dark membranes and heterochromatin, mid-grey cytosol, light
   resin in the extracellular space, dense lysosomes, homogeneous lipid droplets), a small brightness
   offset per object, and textures: fine grain, mottling, dark dots (ribosomes in the cytosol,
   intraluminal vesicles in endosomes) and slow density variations, all hashed from world positions;
2. an anisotropic Gaussian point-spread function (`PSF_SIGMA_U`);
3. slow brightness drift along z (milling direction) and vertical curtaining stripes;
4. shot noise (variance proportional to the signal), from a generator seeded by (seed, dataset, block);
5. quantisation to uint8 with 1..255 inside the imaged volume and exactly 0 in the black regions.

Blocks are cut on a fixed grid (`Preset.block_vox`) and every random field is keyed by world position or
by block index, so the EM is byte-identical for a seed whatever the number of workers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cellseg.data.crops import Geometry
from cellseg.synth.atoms import ATOM_NAMES, atom
from cellseg.synth.noise import hash3, sub_seed, value_noise, white_noise
from cellseg.synth.rasterize import axes_nm, rasterize
from cellseg.synth.scene import Scene

PSF_SIGMA_U = (0.85, 0.65, 0.65)  # Gaussian PSF sigma in scene units (z, y, x)
SHOT_GAIN = 1.4  # noise variance per grey level
OBJECT_JITTER = 10.0  # ± grey levels between objects of one kind


@dataclass(frozen=True)
class Look:
    """Grey level and texture amplitudes (grey levels) of one atom class."""

    mean: float
    grain: float = 6.0  # per-voxel grain (smoothed by the PSF)
    mottle: float = 0.0  # texture at ~2 units
    dots: float = 0.0  # dark dots at ~2 units (negative = darker)
    slow: float = 0.0  # density variations at ~14 units


LOOKS: dict[str, Look] = {
    "ecs": Look(205, grain=4, slow=8),
    "pm": Look(70),
    "cyto": Look(150, grain=8, dots=-60, slow=10),
    "mito_mem": Look(62), "mito_lum": Look(108, grain=8, mottle=8), "mito_ribo": Look(62),
    "golgi_mem": Look(72), "golgi_lum": Look(150, mottle=6),
    "ves_mem": Look(72), "ves_lum": Look(168),
    "endo_mem": Look(70), "endo_lum": Look(170, dots=-60),
    "lyso_mem": Look(58), "lyso_lum": Look(92, grain=12, mottle=30),
    "ld_mem": Look(96), "ld_lum": Look(128, grain=2),
    "perox_mem": Look(72), "perox_lum": Look(118, grain=8, mottle=6),
    "er_mem": Look(70), "er_lum": Look(165),
    "eres_mem": Look(70), "eres_lum": Look(162),
    "ne_mem": Look(66), "ne_lum": Look(172), "np_out": Look(78), "np_in": Look(125),
    "hchrom": Look(85, grain=10, mottle=12), "echrom": Look(138, grain=10, mottle=10), "nucpl": Look(166, slow=6),
    "mt_out": Look(88), "mt_in": Look(158),
}


def _tables() -> dict[str, np.ndarray]:
    tables = {name: np.zeros(256, dtype=np.float32) for name in ("mean", "grain", "mottle", "dots", "slow")}
    for name in ATOM_NAMES:
        look = LOOKS[name]
        for field, table in tables.items():
            table[atom(name)] = getattr(look, field)
    return tables


TABLES = _tables()


def halo_vox(scene: Scene) -> tuple[int, int, int]:
    """Voxels of context a block needs on each side for the PSF."""
    return tuple(int(np.ceil(3 * s * scene.units.u / v)) + 1
                 for s, v in zip(PSF_SIGMA_U, scene.em.voxel_size_nm, strict=True))  # type: ignore[return-value]


def block_geometry(scene: Scene, start_vox: tuple[int, ...], shape_vox: tuple[int, ...]) -> Geometry:
    """The EM sub-grid starting at voxel `start_vox` (may extend outside the volume)."""
    em = scene.em
    return Geometry(voxel_size_nm=em.voxel_size_nm,
                    translation_nm=tuple(t + s * v for t, s, v in zip(em.translation_nm, start_vox, em.voxel_size_nm,
                                                                       strict=True)),  # type: ignore[arg-type]
                    shape_vox=tuple(shape_vox))  # type: ignore[arg-type]


def _intensity(scene: Scene, geometry: Geometry, start_vox: tuple[int, ...]) -> np.ndarray:
    raster = rasterize(scene, geometry)
    z, y, x = axes_nm(geometry)
    u, a, seed = scene.units.u, raster.atoms, sub_seed(scene.seed, scene.index, 1)
    dots = np.clip((value_noise(z, y, x, spacing_nm=2.5 * u, seed=seed + 1) - 0.35) / 0.25, 0, 1)
    image = (TABLES["mean"][a]
             + TABLES["grain"][a] * white_noise(start_vox, geometry.shape_vox, seed)
             + TABLES["mottle"][a] * value_noise(z, y, x, spacing_nm=2.2 * u, seed=seed + 2)
             + TABLES["dots"][a] * dots
             + TABLES["slow"][a] * value_noise(z, y, x, spacing_nm=14.0 * u, seed=seed + 3))
    jitter = (hash3(raster.obj, 0, 0, seed + 4) >> np.uint32(8)).astype(np.float32) / (1 << 24) - 0.5
    return image + np.where(raster.obj > 0, 2 * OBJECT_JITTER * jitter, 0).astype(np.float32)


def _drift_and_curtains(scene: Scene, geometry: Geometry) -> tuple[np.ndarray, np.ndarray]:
    z, _, x = axes_nm(geometry)
    u, em, seed = scene.units.u, scene.em, sub_seed(scene.seed, scene.index, 2)
    phase = (seed % 1000) / 1000 * 2 * np.pi
    rel_z = (z - em.translation_nm[0]) / max(em.extent_nm[0], 1.0)
    gain = 1 + 0.06 * np.sin(2 * np.pi * 1.3 * rel_z + phase) + 0.05 * (rel_z - 0.5)
    curtains = 7.0 * value_noise(z, np.zeros((1, 1, 1), np.float32), x, spacing_nm=(40 * u, 1.0, 1.2 * u), seed=seed)
    return gain.astype(np.float32), curtains


def render_block(scene: Scene, start_vox: tuple[int, int, int], shape_vox: tuple[int, int, int],
                 block_index: int) -> np.ndarray:
    """uint8 EM of the block `[start_vox, start_vox + shape_vox)` of the scene's EM grid."""
    from scipy.ndimage import gaussian_filter

    halo = halo_vox(scene)
    outer_start = tuple(s - h for s, h in zip(start_vox, halo, strict=True))
    outer_shape = tuple(n + 2 * h for n, h in zip(shape_vox, halo, strict=True))
    image = _intensity(scene, block_geometry(scene, outer_start, outer_shape), outer_start)
    sigma = [s * scene.units.u / v for s, v in zip(PSF_SIGMA_U, scene.em.voxel_size_nm, strict=True)]
    image = gaussian_filter(image, sigma=sigma, mode="nearest", truncate=3.0)
    image = image[tuple(slice(h, h + n) for h, n in zip(halo, shape_vox, strict=True))]
    core = block_geometry(scene, start_vox, shape_vox)
    gain, curtains = _drift_and_curtains(scene, core)
    image = image * gain + curtains
    rng = np.random.default_rng([scene.seed & 0xFFFFFFFF, scene.index, block_index, 3])
    image = image + np.sqrt(SHOT_GAIN * np.maximum(image, 1.0)) * rng.standard_normal(image.shape, dtype=np.float32)
    out = np.clip(np.rint(image), 1, 255).astype(np.uint8)
    out[~scene.imaged(*axes_nm(core))] = 0
    return out


def blocks(shape_vox: tuple[int, int, int], block_vox: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(start, shape) of every block of a volume, in C order."""
    ranges = [range(0, n, block_vox) for n in shape_vox]
    return [((z, y, x), tuple(min(block_vox, n - s) for s, n in zip((z, y, x), shape_vox, strict=True)))
            for z in ranges[0] for y in ranges[1] for x in ranges[2]]
