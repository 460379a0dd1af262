"""Shared test volumes for the post-processing tests (imported by the test modules)."""

from __future__ import annotations

import numpy as np
from scipy import ndimage as ndi


def ball(shape, centre_nm, radius_nm, voxel_size_nm) -> np.ndarray:
    """Voxels whose centre lies within `radius_nm` of `centre_nm` (physical, z, y, x)."""
    grids = np.ogrid[tuple(slice(0, n) for n in shape)]
    d2 = sum(((g + 0.5) * v - c) ** 2 for g, v, c in zip(grids, voxel_size_nm, centre_nm, strict=True))
    return d2 <= radius_nm**2


def random_probabilities(rng: np.random.Generator, shape, sigma: float) -> np.ndarray:
    """Smooth random field rescaled to [0, 1], float32."""
    p = ndi.gaussian_filter(rng.random(shape).astype(np.float32), sigma)
    return ((p - p.min()) / (p.max() - p.min() + 1e-6)).astype(np.float32)
