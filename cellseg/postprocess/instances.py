"""Instances of one class from its probability (and boundary) map: the algorithm, and its CPU path.

Inputs: P, the class probability (z, y, x) float32; optionally B, the probability of its `<class>_boundary`
channel (voxels of an object that touch another object); the voxel size v (z, y, x; nm); the class's
`InstanceParams` (threshold t, boundary threshold t_b, seed distance s in nm, minimum size in nm³,
hole filling). Output: object ids, uint32, 0 = background, 1..N consecutive.

1. Foreground F = {P > t}, compared in float32 (`spec.float32_threshold`).
2. Holes (with `fill_holes`): every 6-connected component of the background that does not touch the
   array border joins F (6-connected background is the complement topology of 26-connected objects).
3. Core C = F ∖ {B > t_b} when the boundary channel is present and used, else C = F.
4. Distance: the integer metric of `spec.DistanceMetric` (a step along axis a is w_a units; the finest axis
   is 32 units; anisotropic voxels keep their aspect to within 1/64). D²(x) is the exact squared distance
   from x to the nearest voxel outside C; voxels beyond the array border count as inside C, so an object
   cut by the crop border is not eroded from it.
5. Markers M = {x ∈ C : D²(x) > T} with T = floor((s / unit)²): the voxels farther than s from the
   object's edge (s = 0 gives M = C). Seeds = the 26-connected components of M, ids 1..n₁ in raster
   order of their first voxel.
6. Growth through the core: each voxel of C connected through C to a seed takes the id of the seed
   nearest to it in 26-neighbour steps within C; equally near seeds → the larger id. (This is the
   fixed point of synchronous dilation with `max`, the rule both implementations run.)
7. 26-connected components of C that hold no seed (thinner than 2s everywhere) get ids n₁+1..n₂ in
   raster order of their first voxel: erosion only ever splits objects, it never deletes one.
8. Growth into the rest of F (boundary voxels), by the rule of step 6 from every labelled core voxel,
   through F. 26-connected components of F without any core voxel get ids n₂+1..n₃ (raster order).
9. Objects with fewer than ceil(min_size_nm3 / (v_z v_y v_x)) voxels are removed; the others are
   renumbered 1..N in id order (uint32; N < 2³¹ is checked).

Every step is integer or boolean arithmetic with one tie-break (the larger id), so the result does not
depend on how a step is computed. The CPU path below uses `cc3d` for components and per-component
bounding boxes for the growth (a component with one seed is filled at once); `gpu.py` computes the same
steps with torch tensors (CPU or CUDA): iterated min-label propagation with pointer jumping for
components, iterated 3×3×3 max-pooling for growth. The two are tested equal voxel for voxel.

Compared with the textbook pipeline (distance transform → `peak_local_max` → watershed on −D), the
seeds here are erosion cores rather than single peaks, which never over-split an elongated object along
its ridge, and the growth is geodesic rather than ordered by D, which is what makes it parallel and exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cellseg.postprocess.morphology import (
    capped_sq_distance,
    components,
    fill_components,
    fill_holes,
    remove_small,
)
from cellseg.postprocess.params import InstanceParams
from cellseg.postprocess.spec import DistanceMetric, float32_threshold, min_voxels


def check_probability(prob: np.ndarray, *, name: str = "probability") -> np.ndarray:
    """A (z, y, x) float32 array (what `PredictionStore.read` returns).

    Raises:
        ValueError: another dtype or dimensionality.
    """
    if prob.ndim != 3:
        raise ValueError(f"{name}: expected a (z, y, x) array, got shape {prob.shape}")
    if prob.dtype != np.float32:
        raise ValueError(f"{name}: expected float32 probabilities, got {prob.dtype} (both paths compare in float32)")
    return prob


def segment_instances(prob: np.ndarray, boundary: np.ndarray | None = None, *, voxel_size_nm: Sequence[float],
                      params: InstanceParams) -> np.ndarray:
    """Object ids (uint32, 1..N) of one instance class on the CPU (algorithm in the module docstring)."""
    check_probability(prob)
    fg = prob > np.float32(float32_threshold(params.threshold))
    if params.fill_holes:
        fg = fill_holes(fg)
    core = fg
    if boundary is not None and params.use_boundary:
        check_probability(boundary, name="boundary probability")
        if boundary.shape != prob.shape:
            raise ValueError(f"boundary shape {boundary.shape} differs from the probability's {prob.shape}")
        core = fg & ~(boundary > np.float32(float32_threshold(params.boundary_threshold)))
    metric = DistanceMetric.of(voxel_size_nm)
    threshold_sq = metric.threshold_sq(params.seed_distance_nm)
    markers = core & (capped_sq_distance(core, metric, threshold_sq) > threshold_sq) if threshold_sq > 0 else core
    seeds, n = components(markers, 26)
    labels, n = fill_components(core, seeds, n)
    if core is not fg:
        labels, n = fill_components(fg, labels, n)
    labels, n = remove_small(labels, n, min_voxels(params.min_size_nm3, voxel_size_nm))
    return labels.astype(np.uint32)
