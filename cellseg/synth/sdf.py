"""Signed-distance primitives (nm; negative inside) and the layer rule that turns a distance into atoms.

Every function takes coordinates as broadcastable arrays `z, y, x` (a grid `(nz,1,1), (1,ny,1), (1,1,nx)`
or point arrays) and returns float32 distances of their broadcast shape.

Layer rule (`layers`): an object is a sequence of shells from the outside in, e.g. a vesicle is
`((ves_mem, 6 nm), (ves_lum, None))`. Each shell is at least one voxel thick on the grid being filled
(`min_thick_nm`, the largest voxel edge), so a 6 nm membrane rasterised at 16 nm is still a closed,
one-voxel shell instead of vanishing between voxel centres.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Coords = tuple[np.ndarray, np.ndarray, np.ndarray]
Layers = tuple[tuple[int, float | None], ...]  # (atom id, thickness nm; None = fills the core)


def local_frame(z: np.ndarray, y: np.ndarray, x: np.ndarray, center: np.ndarray,
                rot: np.ndarray) -> Coords:
    """Coordinates in an object's frame: `rot`'s columns are its axes expressed in world (z, y, x)."""
    d = (z - np.float32(center[0]), y - np.float32(center[1]), x - np.float32(center[2]))
    r = rot.astype(np.float32)
    return tuple(d[0] * r[0, k] + d[1] * r[1, k] + d[2] * r[2, k] for k in range(3))  # type: ignore[return-value]


def ellipsoid(z: np.ndarray, y: np.ndarray, x: np.ndarray, *, center: np.ndarray, radii: Sequence[float],
              rot: np.ndarray) -> np.ndarray:
    """Approximate signed distance to an ellipsoid (exact for a sphere, good near the surface)."""
    a, b, c = local_frame(z, y, x, center, rot)
    r = [np.float32(v) for v in radii]
    k0 = np.sqrt((a / r[0]) ** 2 + (b / r[1]) ** 2 + (c / r[2]) ** 2)
    k1 = np.sqrt((a / r[0] ** 2) ** 2 + (b / r[1] ** 2) ** 2 + (c / r[2] ** 2) ** 2)
    return k0 * (k0 - 1) / np.maximum(k1, np.float32(1e-6))


def polyline(z: np.ndarray, y: np.ndarray, x: np.ndarray, points: np.ndarray,
             segments: range | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Distance to a polyline and the arc length (nm from its start) of the closest point.

    Args:
        points: (n, 3) vertices in nm.
        segments: the segment indices to consider (default all n-1).
    """
    seg_len = np.linalg.norm(np.diff(points, axis=0), axis=1)
    cum = np.concatenate([[0.0], np.cumsum(seg_len)])
    best = arc = None
    for k in segments if segments is not None else range(len(points) - 1):
        a, ba = points[k].astype(np.float32), (points[k + 1] - points[k]).astype(np.float32)
        pa = (z - a[0], y - a[1], x - a[2])
        t = np.clip((pa[0] * ba[0] + pa[1] * ba[1] + pa[2] * ba[2]) / max(float(ba @ ba), 1e-9), 0, 1)
        d = np.sqrt((pa[0] - t * ba[0]) ** 2 + (pa[1] - t * ba[1]) ** 2 + (pa[2] - t * ba[2]) ** 2)
        s = np.float32(cum[k]) + t * np.float32(seg_len[k])
        if best is None:
            best, arc = d, s
        else:
            closer = d < best
            best, arc = np.where(closer, d, best), np.where(closer, s, arc)
    assert best is not None and arc is not None, "a polyline needs at least one segment"
    return best, arc


def points_distance(z: np.ndarray, y: np.ndarray, x: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Distance to the nearest of a set of points (n, 3)."""
    best = None
    for p in points.astype(np.float32):
        d2 = (z - p[0]) ** 2 + (y - p[1]) ** 2 + (x - p[2]) ** 2
        best = d2 if best is None else np.minimum(best, d2)
    assert best is not None, "no points"
    return np.sqrt(best)


def disk_sheet(z: np.ndarray, y: np.ndarray, x: np.ndarray, *, center: np.ndarray, rot: np.ndarray,
               radius_nm: float, half_thick_nm: float, warp: np.ndarray | None = None) -> np.ndarray:
    """A flat slab with a rounded rim (ER sheet): `rot[:, 0]` is its normal; `warp` bends it (nm)."""
    h, u, v = local_frame(z, y, x, center, rot)
    if warp is not None:
        h = h + warp
    rim = np.maximum(np.sqrt(u * u + v * v) - np.float32(radius_nm), 0)
    return np.sqrt(rim * rim + h * h) - np.float32(half_thick_nm)


def curved_cisterna(z: np.ndarray, y: np.ndarray, x: np.ndarray, *, center: np.ndarray, axis: np.ndarray,
                    bend_radius_nm: float, half_angle: float, half_thick_nm: float,
                    rim_swell: float = 0.6) -> np.ndarray:
    """A Golgi cisterna: a cap of a spherical shell (radius `bend_radius_nm` about `center`) around `axis`.

    The cap is swollen towards its rim by `rim_swell` (cisternae have dilated ends).
    """
    d = (z - np.float32(center[0]), y - np.float32(center[1]), x - np.float32(center[2]))
    rho = np.sqrt(d[0] ** 2 + d[1] ** 2 + d[2] ** 2)
    cos_t = (d[0] * axis[0] + d[1] * axis[1] + d[2] * axis[2]) / np.maximum(rho, np.float32(1e-6))
    theta = np.arccos(np.clip(cos_t, -1, 1))
    beyond = np.maximum((theta - np.float32(half_angle)) * np.float32(bend_radius_nm), 0)
    swell = 1 + np.float32(rim_swell) * np.clip(theta / np.float32(half_angle), 0, 1) ** 4
    h = rho - np.float32(bend_radius_nm)
    return np.sqrt(beyond * beyond + h * h) - np.float32(half_thick_nm) * swell


def layers(distance_nm: np.ndarray, spec: Layers, min_thick_nm: float) -> np.ndarray:
    """Atom ids from a signed distance: shells from the surface inwards, 0 outside (see module doc)."""
    depth = -distance_nm
    out = np.zeros(depth.shape, dtype=np.uint8)
    top = np.float32(0)
    for atom, thick in spec:
        if thick is None:
            out[depth > top] = atom
            break
        bottom = top + np.float32(max(thick, min_thick_nm))
        out[(depth > top) & (depth <= bottom)] = atom
        top = bottom
    return out


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    """A uniformly random rotation matrix (columns are the rotated axes), from a random unit quaternion."""
    w, x, y, z = rng.normal(size=4)
    n = (w * w + x * x + y * y + z * z) ** 0.5
    w, x, y, z = w / n, x / n, y / n, z / n
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def frame_from_axis(axis: np.ndarray) -> np.ndarray:
    """A rotation whose first column is the unit vector `axis`."""
    a0, a1, a2 = (float(v) for v in axis)
    n = (a0 * a0 + a1 * a1 + a2 * a2) ** 0.5
    a0, a1, a2 = a0 / n, a1 / n, a2 / n
    h0, h1, h2 = (1.0, 0.0, 0.0) if abs(a0) < 0.9 else (0.0, 1.0, 0.0)
    b0, b1, b2 = a1 * h2 - a2 * h1, a2 * h0 - a0 * h2, a0 * h1 - a1 * h0
    m = (b0 * b0 + b1 * b1 + b2 * b2) ** 0.5
    b0, b1, b2 = b0 / m, b1 / m, b2 / m
    c0, c1, c2 = a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0
    return np.array([[a0, b0, c0], [a1, b1, c1], [a2, b2, c2]])
