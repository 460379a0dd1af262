"""Writing a synthetic data root in the CellMap challenge layout.

    DIR/<dataset>/<dataset>.zarr/recon-1/em/fibsem-uint8/s0, s1, ...        EM (uint8, OME-NGFF 0.4)
    DIR/<dataset>/<dataset>.zarr/recon-1/labels/groundtruth/crop<N>/<class>/s0, s1, ...
    DIR/<dataset>/<dataset>.zarr/recon-1/labels/groundtruth/crop<N>/all/s0, ...
    DIR/ground_truth.zarr/crop<N>/<class>                                   test crops (evaluator layout)
    DIR/manifest.csv, train_crop_manifest.csv, test_crop_manifest.csv      official manifest formats
    DIR/datasplit.csv                                                       the 5-column CSC form
    DIR/synth.json                                                          how the root was made

Each class's label group and its level arrays carry CellMap annotation metadata (`cellmap.annotation`: class,
type, encoding; each array its complement counts, `rasterize.annotation_attrs`), as the real arrays do. Each
label `s0/.zattrs` also carries `class_counts` ({class: non-zero voxels}), the cache cellmap-data reads before
counting voxels itself (and writing the count back into the dataset).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from cellseg.data.crops import Geometry, format_vector
from cellseg.data.inspect import EM_PATH, GT_PATH
from cellseg.data.write import write_array, write_multiscale
from cellseg.synth.rasterize import all_array, annotation_attrs, class_array, rasterize
from cellseg.synth.scene import PlacedCrop, Scene

GROUND_TRUTH = "ground_truth.zarr"


def dataset_zarr(name: str) -> str:
    """`<name>/<name>.zarr`, relative to the data root."""
    return f"{name}/{name}.zarr"


def crop_url(crop: PlacedCrop) -> str:
    """The crop's label folder relative to the data root."""
    return f"{dataset_zarr(crop.dataset)}/{GT_PATH}/crop{crop.id}"


def em_url(dataset: str) -> str:
    """The EM multiscale group relative to the data root."""
    return f"{dataset_zarr(dataset)}/{EM_PATH}"


def write_em(root: Path, scene: Scene, em: np.ndarray) -> None:
    """Write a dataset's EM pyramid (translation = centre of voxel 0 per level)."""
    write_multiscale(root / em_url(scene.name), em, voxel_size_nm=scene.em.voxel_size_nm,
                     translation_nm=scene.em.translation_nm, kind="em")


def _label_arrays(scene: Scene, crop: PlacedCrop) -> dict[str, np.ndarray]:
    raster = rasterize(scene, crop.geometry)
    arrays = {name: class_array(raster, name, scene) for name in crop.classes}
    return {**arrays, "all": all_array(raster, crop.classes)}


def write_train_crop(root: Path, scene: Scene, crop: PlacedCrop) -> dict[str, int]:
    """Write a training crop's label pyramids; returns non-zero voxel counts per annotated class."""
    counts = {}
    geometry = crop.geometry
    for name, data in _label_arrays(scene, crop).items():
        group = root / crop_url(crop) / name
        write_multiscale(group, data, voxel_size_nm=geometry.voxel_size_nm, translation_nm=geometry.translation_nm,
                         kind="labels", attrs=None if name == "all" else annotation_attrs(name))
        count = int(np.count_nonzero(data))
        if name != "all":
            _annotate_levels(group, name)
            counts[name] = count
        attrs = json.loads((group / "s0" / ".zattrs").read_text()) if (group / "s0" / ".zattrs").is_file() else {}
        (group / "s0" / ".zattrs").write_text(json.dumps({**attrs, "class_counts": {name: count}}, indent=2))
    return counts


def _annotate_levels(group: Path, name: str) -> None:
    """Write each level array's annotation attributes, with the complement counts of its own voxels."""
    import zarr

    for level in sorted(p for p in group.iterdir() if (p / ".zarray").is_file()):
        data = zarr.open_array(str(level), mode="r")[...]
        (level / ".zattrs").write_text(json.dumps(annotation_attrs(name, data), indent=2))


def write_test_crop(root: Path, scene: Scene, crop: PlacedCrop) -> dict[str, int]:
    """Write a test crop's truth as single-scale arrays under `ground_truth.zarr`; returns counts."""
    g = crop.geometry
    attrs = {"voxel_size": list(g.voxel_size_nm), "translation": list(g.translation_nm), "shape": list(g.shape_vox)}
    counts = {}
    for name, data in _label_arrays(scene, crop).items():
        if name == "all":
            continue
        write_array(root / GROUND_TRUTH / f"crop{crop.id}" / name, data, attrs=attrs)
        counts[name] = int(np.count_nonzero(data))
    return counts


def _shape_text(shape: Iterable[int]) -> str:
    return "[" + ";".join(str(int(s)) for s in shape) + "]"


def crop_rows(crops: Iterable[PlacedCrop]) -> str:
    """`crop_name,dataset,class_label,voxel_size,translation,shape` rows (train/test crop manifests)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["crop_name", "dataset", "class_label", "voxel_size", "translation", "shape"])
    for crop in sorted(crops, key=lambda c: c.id):
        g: Geometry = crop.geometry
        for name in crop.classes:
            writer.writerow([crop.id, crop.dataset, name, format_vector(g.voxel_size_nm),
                             format_vector(g.translation_nm), _shape_text(g.shape_vox)])
    return out.getvalue()


def url_rows(crops: Iterable[PlacedCrop]) -> str:
    """`manifest.csv`: crop_number,collection,alignment,crop_url,em_url (locations relative to the root)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["crop_number", "collection", "alignment", "crop_url", "em_url"])
    for crop in sorted(crops, key=lambda c: c.id):
        writer.writerow([crop.id, crop.dataset, "recon-1", crop_url(crop), em_url(crop.dataset)])
    return out.getvalue()


def datasplit_rows(crops: Iterable[PlacedCrop], validate: set[int]) -> str:
    """The 5-column, fully quoted, header-less `datasplit.csv` with zarr paths relative to the data root (its
    folder), so that a copied root reads its own copy."""
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    for crop in sorted(crops, key=lambda c: (c.id not in validate, c.id)):
        zarr_path = dataset_zarr(crop.dataset)
        writer.writerow(["validate" if crop.id in validate else "train", zarr_path, EM_PATH, zarr_path,
                         f"{GT_PATH}/crop{crop.id}/[{','.join(crop.classes)}]"])
    return out.getvalue()


def write_tables(root: Path, *, final_root: Path, scenes: Sequence[Scene], validate: set[int],
                 meta: Mapping[str, object]) -> None:
    """Write the manifests, the datasplit and `synth.json` (`final_root`: where `root` will end up; no table names
    it, the datasplit's locations being relative)."""
    crops = [c for s in scenes for c in s.crops]
    train = [c for c in crops if c.role == "train"]
    test = [c for c in crops if c.role == "test"]
    (root / "manifest.csv").write_text(url_rows(train))
    (root / "train_crop_manifest.csv").write_text(crop_rows(train))
    (root / "test_crop_manifest.csv").write_text(crop_rows(test))
    (root / "datasplit.csv").write_text(datasplit_rows(train, validate))
    description = {
        **meta,
        "datasets": [{"name": s.name, "voxel_size_nm": list(s.em.voxel_size_nm), "shape_vox": list(s.em.shape_vox),
                      "translation_nm": list(s.em.translation_nm)} for s in scenes],
        "crops": [{"id": c.id, "dataset": c.dataset, "split": "test" if c.role == "test" else
                   ("validate" if c.id in validate else "train"), "classes": list(c.classes),
                   "voxel_size_nm": list(c.geometry.voxel_size_nm), "translation_nm": list(c.geometry.translation_nm),
                   "shape_vox": list(c.geometry.shape_vox)} for c in sorted(crops, key=lambda c: c.id)],
    }
    (root / "synth.json").write_text(json.dumps(description, indent=2) + "\n")
