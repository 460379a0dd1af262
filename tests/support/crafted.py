"""Crafted CellMap-layout data roots for the training-pipeline tests (written with our own writers)."""

from pathlib import Path

import numpy as np

from cellseg.classes import get_class
from cellseg.data.crops import Catalog, format_vector
from cellseg.data.grid import Grid
from cellseg.data.split import SplitEntry, read_datasplit, write_datasplit
from cellseg.data.targets import CropSource
from cellseg.data.write import write_multiscale

EM_VS, LABEL_VS = (4.0, 4.0, 4.0), (8.0, 8.0, 8.0)


def checker_labels(shape):
    """A position-dependent pattern: 8 nm blocks alternate between mito (ids) and ecs."""
    z, y, x = np.indices(shape)
    mito_mask = ((z // 4 + y // 4 + x // 4) % 2 == 0)
    return mito_mask


def write_root(root: Path, *, with_all: bool = True, black_slab: bool = True) -> Path:
    """One dataset, EM 4 nm 64³ whose intensity encodes the labels; crop 1 at 8 nm (24³) with mito atoms,
    ecs and nuc annotated but not golgi; crop 2 annotating only ecs."""
    ds = "jrc_test-1"
    zarr = root / ds / f"{ds}.zarr" / "recon-1"
    mask8 = checker_labels((32, 32, 32))  # the pattern over the whole volume at 8 nm
    em = np.where(np.repeat(np.repeat(np.repeat(mask8, 2, 0), 2, 1), 2, 2), 200, 60).astype(np.uint8)
    if black_slab:
        em[:, :, :6] = 0  # "outside the imaged volume": x < 24 nm
    write_multiscale(zarr / "em" / "fibsem-uint8", em, voxel_size_nm=EM_VS, translation_nm=(0, 0, 0), kind="em")
    # Crop 1: 8 nm voxels, 24^3, starting at voxel 4 of the 8 nm grid; 8 nm s0 of a 4 nm base: translation +2.
    t8 = tuple(2.0 + 8 * 4 for _ in range(3))
    sub = mask8[4:28, 4:28, 4:28]
    ids = (np.indices(sub.shape).sum(0) // 4 + 1).astype(np.uint32) * sub  # mito instance ids
    gt = zarr / "labels" / "groundtruth"
    rows = []
    arrays = {"mito_mem": sub, "mito_lum": sub, "mito_ribo": np.zeros_like(sub), "ecs": ~sub,
              "nuc": np.zeros_like(sub), "mito": ids}
    for name, data in arrays.items():
        dtype = np.uint32 if name == "mito" else np.uint8
        write_multiscale(gt / "crop1" / name, data.astype(dtype), voxel_size_nm=LABEL_VS, translation_nm=t8,
                         kind="labels")
        rows.append((1, name, LABEL_VS, t8, sub.shape))
    if with_all:
        all_ids = np.where(sub, get_class("mito_lum").id, get_class("ecs").id).astype(np.uint8)
        write_multiscale(gt / "crop1" / "all", all_ids, voxel_size_nm=LABEL_VS, translation_nm=t8, kind="labels")
    # Crop 2: only ecs, 16^3 at 8 nm starting at voxel 8.
    t8b = tuple(2.0 + 8 * 8 for _ in range(3))
    write_multiscale(gt / "crop2" / "ecs", (~mask8[8:24, 8:24, 8:24]).astype(np.uint8), voxel_size_nm=LABEL_VS,
                     translation_nm=t8b, kind="labels")
    rows.append((2, "ecs", LABEL_VS, t8b, (16, 16, 16)))
    lines = ["crop_name,dataset,class_label,voxel_size,translation,shape"]
    lines += [f"{c},{ds},{n},{format_vector(v)},{format_vector(t)},{format_vector(s).replace('.0', '')}"
              for c, n, v, t, s in rows]
    (root / "train_crop_manifest.csv").write_text("\n".join(lines) + "\n")
    em_rel, gt_rel = f"{ds}/{ds}.zarr/recon-1/em/fibsem-uint8", f"{ds}/{ds}.zarr/recon-1/labels/groundtruth"
    (root / "manifest.csv").write_text("crop_number,collection,alignment,crop_url,em_url\n"
                                       f"1,{ds},recon-1,{gt_rel}/crop1,{em_rel}\n2,{ds},recon-1,{gt_rel}/crop2,{em_rel}\n")
    # The root's own split (honoured by default, as a real root's datasplit.csv is): crop 1 trains, crop 2
    # validates. The boxes overlap, so the automatic split would keep them together, on the training side.
    write_datasplit([SplitEntry(split=split, em_url=str(root / em_rel), crop_url=str(root / gt_rel / f"crop{n}"),
                                classes=tuple(sorted(name for crop, name, *_ in rows if crop == n)))
                     for n, split in ((1, "train"), (2, "validate"))], root / "datasplit.csv")
    return root


def crop_truth(root: Path, crop: str, classes: tuple[str, ...]) -> tuple[Grid, dict[str, np.ndarray]]:
    """A training crop's labels as 0/1 float32 probabilities on the crop's own annotation grid."""
    entry = next(e for e in read_datasplit(root / "datasplit.csv") if e.crop_name == crop)
    geometry = Catalog.from_dir(root).train[int(crop[4:])].labels[classes[0]]
    grid = Grid(translation_nm=geometry.translation_nm, shape_vox=geometry.shape_vox,
                voxel_size_nm=geometry.voxel_size_nm)
    target, _ = CropSource.open(entry, classes, boundaries=False).read_targets(grid, use_all=False)
    return grid, {c: target[k].astype(np.float32) for k, c in enumerate(classes)}
