"""The truth of one class of one training crop on a grid, as every scorer of cellseg reads it.

Validation during training, post-processing tuning and ensemble weight fitting score against the class's
own label arrays (never the `all` array). A class is read as objects exactly when the official scorer
scores it as instances (`is_scored_as_instance`):
- semantic: the union of its arrays (one array, or the atoms of a group);
- instance: object ids: the ids on disk when the class is one array, else the 26-connected components of
  the union of its atoms (numbered before masking, so the numbering does not depend on the annotated box).
Either is annotated where every one of its arrays covers the grid and none stores "unknown", and zero elsewhere:
the voxel rule of the training targets (`cellseg.data.annotation.LabelReads`), so that scores and training agree.
Arrays a crop never annotated (`CropSource.open` drops them) are not read. This is also the one
place that opens a crop (`CropSource`) for scoring.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cellseg.data.annotation import LabelReads
from cellseg.data.grid import Grid
from cellseg.data.split import SplitEntry
from cellseg.data.targets import CropSource, NoRequestedClass
from cellseg.eval.relabel import relabel_26
from cellseg.eval.rules import is_scored_as_instance

BACKEND = "zarr"  # the crops scored are small and read once: no shared chunk cache needed


def open_crop(entry: SplitEntry, classes: Sequence[str]) -> CropSource:
    """A training crop opened to read the truth of `classes`.

    Raises:
        NoRequestedClass: the crop annotates none of `classes` (a ValueError).
        ValueError: the crop's box lies outside its EM volume.
        FileNotFoundError: the crop folder does not exist.
    """
    return CropSource.open(entry, tuple(classes), backend=BACKEND)


def read_class_truth(crop: CropSource | SplitEntry, class_name: str, grid: Grid
                     ) -> tuple[np.ndarray, np.ndarray] | None:
    """(truth, annotated) of one class on `grid`, both (z, y, x); None where the crop does not annotate it.

    `truth` is bool for semantic classes and object ids for instance classes (module docstring), 0 outside
    `annotated` (bool). A split entry is opened for the class alone (`open_crop`).

    Raises:
        ValueError: `crop` is a crop opened without `class_name`.
    """
    if isinstance(crop, SplitEntry):
        try:
            crop = open_crop(crop, (class_name,))
        except NoRequestedClass:
            return None  # the class is not annotated in this crop
    plans = {p.name: p for p in crop.plans}
    if class_name not in plans:
        raise ValueError(f"{crop.name}: opened for {list(crop.classes)}, not for {class_name!r}")
    names = plans[class_name].read
    if not names:
        return None
    reads = LabelReads(crop, grid)  # the same voxel rule as the training targets (`cellseg.data.annotation`)
    annotated = reads.known(names)
    if len(names) == 1 and is_scored_as_instance(class_name):  # ids on disk
        ids = reads.object_ids(names[0])
        return np.where(annotated, ids, 0).astype(ids.dtype), annotated
    union = reads.foreground(names)
    if is_scored_as_instance(class_name):  # a union of atoms: its objects are the connected components
        ids = relabel_26(union)[0]
        return np.where(annotated, ids, 0).astype(ids.dtype), annotated
    return union & annotated, annotated
