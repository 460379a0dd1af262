"""Deterministic noise defined in world coordinates (nm), so every grid sees the same field.

Two kinds, both keyed by an integer seed and independent of how a volume is cut into blocks:
- `value_noise`: smooth lattice noise in [-1, 1] (random values at lattice nodes `spacing_nm` apart,
  smoothstep-interpolated). It shapes geometry (wavy cell borders, chromatin clumps) and textures, and
  is what makes EM blocks, crops at any voxel size and single query points agree.
- `white_noise`: one uniform value in [-1, 1] per voxel of a grid, hashed from the voxel's global index.

Coordinates come either as a broadcast grid `z (nz,1,1), y (1,ny,1), x (1,1,nx)` (evaluated separably,
a few operations per voxel) or as equally shaped point arrays (evaluated per point, for placement).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_PRIMES = (np.uint32(0x8DA6B343), np.uint32(0xD8163841), np.uint32(0xCB1AB31F))


def sub_seed(seed: int, *keys: int) -> int:
    """A 32-bit seed derived from `seed` and integer keys (stable across runs and platforms)."""
    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, *[int(k) & 0xFFFFFFFF for k in keys]])
               .generate_state(1)[0])


def hash3(iz: np.ndarray, iy: np.ndarray, ix: np.ndarray, seed: int) -> np.ndarray:
    """Hash integer lattice coordinates (broadcastable int arrays) to uint32."""
    h = (np.asarray(iz).astype(np.uint32) * _PRIMES[0]) ^ (np.asarray(iy).astype(np.uint32) * _PRIMES[1])
    h = h ^ (np.asarray(ix).astype(np.uint32) * _PRIMES[2]) ^ np.uint32(seed & 0xFFFFFFFF)
    h = np.asarray(h, dtype=np.uint32)  # keep array arithmetic: uint32 products wrap silently
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x7FEB352D)
    h ^= h >> np.uint32(15)
    h *= np.uint32(0x846CA68B)
    h ^= h >> np.uint32(16)
    return h


def _unit(h: np.ndarray) -> np.ndarray:
    """uint32 hash → float32 in [-1, 1)."""
    return (h >> np.uint32(8)).astype(np.float32) * np.float32(2.0 / (1 << 24)) - np.float32(1.0)


def _smooth(f: np.ndarray) -> np.ndarray:
    return f * f * (3.0 - 2.0 * f)


def _is_grid(z: np.ndarray, y: np.ndarray, x: np.ndarray) -> bool:
    return (z.ndim == y.ndim == x.ndim == 3 and z.shape[1:] == (1, 1) and y.shape[0] == y.shape[2] == 1
            and x.shape[:2] == (1, 1))


def _axis_taps(coord_nm: np.ndarray, spacing_nm: float) -> tuple[np.ndarray, np.ndarray]:
    q = np.asarray(coord_nm, dtype=np.float64) / spacing_nm
    i = np.floor(q)
    return i.astype(np.int64), _smooth(q - i).astype(np.float32)


def _lerp_axis(values: np.ndarray, index: np.ndarray, weight: np.ndarray, axis: int) -> np.ndarray:
    shape = [1, 1, 1]
    shape[axis] = -1
    w = weight.reshape(shape)
    return np.take(values, index, axis=axis) * (1 - w) + np.take(values, index + 1, axis=axis) * w


def _grid_noise(axes_nm: Sequence[np.ndarray], spacing_nm: Sequence[float], seed: int) -> np.ndarray:
    taps = [_axis_taps(a.ravel(), s) for a, s in zip(axes_nm, spacing_nm, strict=True)]
    lows = [int(i.min()) for i, _ in taps]
    spans = [np.arange(lo, int(i.max()) + 2) for lo, (i, _) in zip(lows, taps, strict=True)]
    lattice = _unit(hash3(spans[0][:, None, None], spans[1][None, :, None], spans[2][None, None, :], seed))
    for axis in (2, 1, 0):  # cheapest order: the lattice is small, the last pass runs at full size
        index, weight = taps[axis]
        lattice = _lerp_axis(lattice, index - lows[axis], weight, axis)
    return lattice


_CORNERS = np.array([[(c >> k) & 1 for k in (2, 1, 0)] for c in range(8)], dtype=np.int64)  # (8, 3)


def _point_noise(coords_nm: Sequence[np.ndarray], spacing_nm: Sequence[float], seed: int) -> np.ndarray:
    taps = [_axis_taps(c.ravel(), s) for c, s in zip(coords_nm, spacing_nm, strict=True)]
    index = np.stack([i for i, _ in taps])[None] + _CORNERS[:, :, None]  # (8, 3, n)
    frac = np.stack([w for _, w in taps])[None]  # (1, 3, n)
    weight = np.prod(np.where(_CORNERS[:, :, None] == 1, frac, 1 - frac), axis=1)  # (8, n)
    values = _unit(hash3(index[:, 0], index[:, 1], index[:, 2], seed))
    return (weight * values).sum(axis=0).astype(np.float32).reshape(coords_nm[0].shape)


def value_noise(z: np.ndarray, y: np.ndarray, x: np.ndarray, *, spacing_nm: float | Sequence[float],
                seed: int) -> np.ndarray:
    """Smooth noise in [-1, 1] at world positions (nm); float32, broadcast shape of the inputs.

    Args:
        z, y, x: a broadcast grid `(nz,1,1), (1,ny,1), (1,1,nx)` or point arrays of one shape.
        spacing_nm: lattice spacing (feature size), one value or (z, y, x).
        seed: selects the field.
    """
    spacing = (float(spacing_nm),) * 3 if np.isscalar(spacing_nm) else tuple(float(s) for s in spacing_nm)
    z, y, x = (np.asarray(a) for a in (z, y, x))
    if _is_grid(z, y, x):
        return _grid_noise((z, y, x), spacing, seed)
    z, y, x = np.broadcast_arrays(z, y, x)
    return _point_noise((z, y, x), spacing, seed)


def white_noise(start_vox: Sequence[int], shape_vox: Sequence[int], seed: int) -> np.ndarray:
    """Uniform noise in [-1, 1), one value per voxel, keyed by global voxel index (block-independent)."""
    iz, iy, ix = (np.arange(s, s + n, dtype=np.int64) for s, n in zip(start_vox, shape_vox, strict=True))
    return _unit(hash3(iz[:, None, None], iy[None, :, None], ix[None, None, :], seed))
