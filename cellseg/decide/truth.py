"""The scored crops' truth in the evaluator's layout, so every stage is scored by `cellseg.eval.evaluate`.

`REPORT_DIR/truth.zarr/crop<N>/<label>`: single-scale arrays with `voxel_size`, `translation` and `shape`
attributes (nm, z, y, x), exactly what the official ground-truth store holds, restricted to the classes
the runs predict (a class no run predicts would only add zeros to every stage alike):

- training crops (validation crops): each label's `s0` as annotated in the data root, at its own voxel
  size; labels listed for the crop but without an array on disk (a group given only by its atoms) are
  left out with a log line, as the official truth store would lack them too;
- test crops of a synthetic root: copied from the root's `ground_truth.zarr`.

The store is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cellseg.data.arrays import MultiscaleImage
from cellseg.data.crops import Catalog
from cellseg.data.crops import crop_id as crop_id_of
from cellseg.data.write import atomic_dir, write_array
from cellseg.decide.inputs import TRUTH_STORE

log = logging.getLogger(__name__)


def _training_labels(catalog: Catalog, crop_id: int, classes: Sequence[str]) -> dict[str, tuple[np.ndarray, dict]]:
    crop = catalog.train[crop_id]
    out = {}
    for label in (c for c in classes if c in crop.labels):
        try:
            image = MultiscaleImage(catalog.locate(crop.crop_url).join(label), backend="zarr")
        except FileNotFoundError:
            log.info("%s/%s: listed but not on disk; not scored (the official truth would lack it too)",
                     crop.name, label)
            continue
        level = image.levels[0]
        data = image.read_level(level.path)
        out[label] = (data, {"voxel_size": list(level.voxel_size_nm), "translation": list(level.translation_nm),
                             "shape": list(data.shape)})
    return out


def _test_labels(root: Path, name: str, classes: Sequence[str]) -> dict[str, tuple[np.ndarray, dict]]:
    import zarr

    out = {}
    for label in classes:
        path = root / TRUTH_STORE / name / label
        if not (path / ".zarray").is_file():
            continue
        array = zarr.open_array(str(path), mode="r")
        attrs = dict(array.attrs)
        if "voxel_size" not in attrs:
            raise ValueError(f"{path}: ground-truth array lacks the voxel_size attribute")
        out[label] = (np.asarray(array[...]), attrs)
    return out


def build_truth(out: Path, crops: Sequence[str], classes: Sequence[str], root: Path, *,
                overwrite: bool = False) -> dict[str, list[str]]:
    """Write the truth store of `crops` (module docstring); returns crop → labels written.

    Raises:
        FileExistsError: `out` exists and `overwrite` is not given.
        ValueError: no scored crop annotates any of `classes`.
    """
    catalog = Catalog.from_dir(root)
    written: dict[str, list[str]] = {}
    with atomic_dir(out, overwrite=overwrite) as tmp:
        tmp.mkdir()
        (tmp / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
        for name in crops:
            crop_id = crop_id_of(name)
            labels = (_training_labels(catalog, crop_id, classes) if crop_id in catalog.train
                      else _test_labels(root, name, classes))
            if not labels:
                log.warning("%s annotates none of %s; not scored", name, list(classes))
                continue
            (tmp / name).mkdir()
            (tmp / name / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
            for label, (data, attrs) in labels.items():
                write_array(tmp / name / label, data, attrs=attrs)
            written[name] = list(labels)
        if not written:
            raise ValueError(f"none of the scored crops {list(crops)} annotates any of the runs' classes "
                             f"{list(classes)} in {root}")
    return written


def truth_labels(path: Path) -> dict[str, list[str]]:
    """Crop → labels of an existing truth store."""
    return {crop.name: sorted(p.name for p in crop.iterdir() if (p / ".zarray").is_file())
            for crop in sorted(path.iterdir()) if crop.is_dir() and not crop.name.startswith(".")}
