"""26-connected relabelling of instance predictions, numbered exactly like the official evaluators'.

Both eras relabel predictions by 26-connected components of equal values (2025 `skimage.measure.label`,
2026 `cc3d.connected_components`), numbered 1..N in raster order of each component's first voxel. The
numbering matters: it orders the columns of the 2025 assignment problem and decides which unmatched
components collide with truth ids in 2026.

`cc3d` writes provisional labels into its output, so for a large crop it returns uint32 even for a few
hundred objects (4 bytes per voxel). When the objects' bounding boxes are small, this module labels each
value inside its own box instead, orders the components by their first voxel's raster index, and writes
the result in the smallest dtype (uint16 for up to 65,535 objects). A component of value v lies inside v's
bounding box, and raster order inside a box agrees with raster order in the crop, so the numbering is the
same; a test checks it against `cc3d` on random volumes.
"""

from __future__ import annotations

import numpy as np

from cellseg.eval.distance import Boxes

MAX_BOX_FRACTION = 0.25  # above this sum of box volumes / crop volume, plain cc3d is cheaper
STRUCTURE_26 = np.ones((3, 3, 3), dtype=bool)


def _smallest_uint(count: int) -> np.dtype:
    for dtype in (np.uint16, np.uint32, np.uint64):
        if count <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"{count} components do not fit uint64")


def _components_in_boxes(pred: np.ndarray, boxes: Boxes
                         ) -> tuple[list[tuple[int, int, int]], dict[int, np.ndarray]]:
    """(first global raster index, value, local label) of every component, and the local label volumes."""
    from scipy.ndimage import label

    components: list[tuple[int, int, int]] = []
    local_labels: dict[int, np.ndarray] = {}
    for value, box in boxes.slices.items():
        mask = pred[box] == value
        local, count = label(mask, structure=STRUCTURE_26)
        ids, first = np.unique(local.reshape(-1), return_index=True)
        if count > 1:
            local_labels[value] = local
        origin = np.array([s.start for s in box])
        coords = np.array(np.unravel_index(first[ids != 0], mask.shape)).T + origin
        flat = np.ravel_multi_index(coords.T, pred.shape)
        components += [(int(f), value, int(k)) for f, k in zip(flat, ids[ids != 0], strict=True)]
    return components, local_labels


def relabel_26(pred: np.ndarray) -> tuple[np.ndarray, int]:
    """(components numbered 1..N in raster order of their first voxel, N), like `cc3d.connected_components`."""
    import cc3d

    if pred.dtype.kind not in "iu" or pred.size == 0:
        return cc3d.connected_components(pred, connectivity=26, return_N=True)
    boxes = Boxes.of(pred)
    volume = sum(int(np.prod([s.stop - s.start for s in b], dtype=np.int64)) for b in boxes.slices.values())
    if volume > MAX_BOX_FRACTION * pred.size:
        return cc3d.connected_components(pred, connectivity=26, return_N=True)
    components, local_labels = _components_in_boxes(pred, boxes)
    components.sort()
    out = np.zeros(pred.shape, dtype=_smallest_uint(len(components)))
    for new_id, (_, value, local_id) in enumerate(components, start=1):
        box = boxes.slices[value]
        where = local_labels[value] == local_id if value in local_labels else pred[box] == value
        out[box][where] = new_id
    return out, len(components)
