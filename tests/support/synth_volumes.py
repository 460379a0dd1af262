"""Whole synthetic volumes with probabilities for blockwise tests: the truth labels of a `tiny` dataset
(rasterised on its EM grid by `cellseg.synth`) and probabilities made from them (smoothed, noisy, quantised)."""

from __future__ import annotations

import functools

import numpy as np

SIGMA_VOX = 1.0  # Gaussian smoothing of the truth masks: probabilities soften over about one voxel
NOISE = 0.08  # standard deviation of the additive noise (probability units)


@functools.lru_cache(maxsize=3)
def truth_volume(index: int = 0, classes: tuple[str, ...] = ("mito", "ves", "cell", "er")
                 ) -> tuple[dict[str, np.ndarray], tuple[float, float, float]]:
    """class → truth labels over the whole EM volume of dataset `index` of the tiny preset, and its voxel size."""
    from cellseg.synth.presets import get_preset
    from cellseg.synth.rasterize import class_array, rasterize
    from cellseg.synth.scene import build_scene

    preset = get_preset("tiny")
    spec = preset.datasets[index]
    scene = build_scene(spec, preset.style, seed=0, index=index, crop_ids=list(range(len(spec.crops))))
    raster = rasterize(scene, scene.em)
    return {c: class_array(raster, c, scene) for c in classes}, tuple(spec.voxel_size_nm)  # type: ignore[return-value]


def touching(ids: np.ndarray) -> np.ndarray:
    """Voxels of an object with a 26-neighbour in another object (the `<class>_boundary` target)."""
    from scipy.ndimage import grey_dilation, grey_erosion

    big = np.where(ids > 0, ids, np.iinfo(ids.dtype).max)
    return (ids > 0) & ((grey_dilation(ids, size=3) != ids) | (grey_erosion(big, size=3) != ids))


def probabilities(mask: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """uint8 round(255 p) of a smoothed, noisy version of a boolean mask."""
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(seed)
    p = gaussian_filter(mask.astype(np.float32), SIGMA_VOX) + rng.normal(0, NOISE, mask.shape).astype(np.float32)
    return np.rint(np.clip(p, 0, 1) * 255).astype(np.uint8)
