"""Writing an imported volume in the CellMap layout that `cellseg synth` writes and cellseg reads:

    ROOT/<dataset>/<dataset>.zarr/recon-1/em/fibsem-uint8/s0, s1, ...          EM (uint8, anisotropic pyramid)
    ROOT/<dataset>/<dataset>.zarr/recon-1/labels/groundtruth/crop<N>/<class>/s0, s1, ...
    ROOT/<dataset>/<dataset>.zarr/recon-1/labels/groundtruth/crop<N>/all/s0, ...  (mapped labels only)
    ROOT/manifest.csv, train_crop_manifest.csv[, test_crop_manifest.csv]       official manifest formats
    ROOT/datasplit.csv                                                          5-column CSC form

Test crops (a box to predict, `--test-box`) are EM only: they appear in `test_crop_manifest.csv`, so
`cellseg predict RUN --crops test` predicts them. Each label `s0/.zattrs` carries `class_counts` as in
synthetic roots.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from cellseg.data.crops import format_vector
from cellseg.data.inspect import EM_PATH, GT_PATH
from cellseg.data.split import SplitEntry, write_datasplit
from cellseg.data.write import ensure_groups
from cellseg.ingest.intensity import Window
from cellseg.ingest.labels import Labels
from cellseg.ingest.pyramid import Factors, write_label_pyramid, write_pyramid
from cellseg.ingest.readers import Volume
from cellseg.ingest.split import PlannedCrop


def dataset_zarr(dataset: str) -> str:
    """`<dataset>/<dataset>.zarr`, relative to the data root."""
    return f"{dataset}/{dataset}.zarr"


def em_url(dataset: str) -> str:
    """The EM multiscale group, relative to the data root."""
    return f"{dataset_zarr(dataset)}/{EM_PATH}"


def crop_url(dataset: str, crop: PlannedCrop) -> str:
    """A crop's label folder, relative to the data root."""
    return f"{dataset_zarr(dataset)}/{GT_PATH}/crop{crop.id}"


def write_em(root: Path, dataset: str, volume: Volume, window: Window, *, voxel_size_nm: Sequence[float],
             progress: Callable[[int], None] | None = None) -> tuple[list[Factors], int]:
    """Convert and write the EM pyramid; returns (per-level factors, number of s0 voxels equal to 0)."""
    group = root / em_url(dataset)
    group.parent.mkdir(parents=True, exist_ok=True)
    ensure_groups(group.parent)
    zeros = [0]

    def count(slab: np.ndarray) -> None:
        zeros[0] += int(slab.size - np.count_nonzero(slab))

    factors = write_pyramid(group, lambda z0, z1: window.apply(volume.sections(z0, z1)), shape_vox=volume.shape,
                            dtype=np.uint8, voxel_size_nm=voxel_size_nm, translation_nm=(0.0, 0.0, 0.0), kind="em",
                            on_slab=count, progress=progress)
    return factors, zeros[0]


def write_crop(root: Path, dataset: str, crop: PlannedCrop, labels: Labels) -> dict[str, int]:
    """Write one crop's label pyramids (every class, plus `all` when the labels give it); returns the
    non-zero voxel count of each class."""
    folder = root / crop_url(dataset, crop)
    folder.mkdir(parents=True)
    ensure_groups(folder)
    counts = {}
    for name, data in labels.arrays(crop.box).items():
        g = crop.geometry
        write_label_pyramid(folder / name, data, voxel_size_nm=g.voxel_size_nm, translation_nm=g.translation_nm)
        count = int(np.count_nonzero(data))
        (folder / name / "s0" / ".zattrs").write_text(json.dumps({"class_counts": {name: count}}, indent=2))
        if name != "all":
            counts[name] = count
    return counts


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ";".join(str(int(n)) for n in shape) + "]"


def crop_rows(dataset: str, crops: Sequence[PlannedCrop], classes: Sequence[str]) -> str:
    """`crop_name,dataset,class_label,voxel_size,translation,shape` (train and test crop manifests)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["crop_name", "dataset", "class_label", "voxel_size", "translation", "shape"])
    for crop in crops:
        g = crop.geometry
        for name in classes:
            writer.writerow([crop.id, dataset, name, format_vector(g.voxel_size_nm), format_vector(g.translation_nm),
                             _shape_text(g.shape_vox)])
    return out.getvalue()


def url_rows(dataset: str, crops: Sequence[PlannedCrop]) -> str:
    """`manifest.csv`: crop_number,collection,alignment,crop_url,em_url (locations relative to the root)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["crop_number", "collection", "alignment", "crop_url", "em_url"])
    for crop in crops:
        writer.writerow([crop.id, dataset, "recon-1", crop_url(dataset, crop), em_url(dataset)])
    return out.getvalue()


def write_tables(root: Path, *, final_root: Path, dataset: str, crops: Sequence[PlannedCrop],
                 classes: Sequence[str], test_classes: Sequence[str]) -> None:
    """The manifests and `datasplit.csv` (`final_root`: where `root` will end up; no table names it, the
    datasplit's locations being relative to the root, so that a copy reads its own)."""
    labelled = [c for c in crops if c.role != "test"]
    tests = [c for c in crops if c.role == "test"]
    if labelled:
        (root / "manifest.csv").write_text(url_rows(dataset, labelled))
        (root / "train_crop_manifest.csv").write_text(crop_rows(dataset, labelled, classes))
        entries = [SplitEntry(split=c.role, em_url=em_url(dataset), crop_url=crop_url(dataset, c),
                              classes=tuple(classes))
                   for c in sorted(labelled, key=lambda c: (c.role != "validate", c.id))]
        write_datasplit(entries, root / "datasplit.csv")
    else:  # EM only: an empty training manifest keeps the root readable by `Catalog.from_dir`
        (root / "train_crop_manifest.csv").write_text(crop_rows(dataset, [], classes))
    if tests:
        (root / "test_crop_manifest.csv").write_text(crop_rows(dataset, tests, test_classes))
