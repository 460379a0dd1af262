"""A cellseg data root as an nnU-Net v2 raw dataset, read by cellseg's own readers so that nnU-Net sees the crops,
EM and supervision cellseg's runs see.

- Crops: the split a cellseg run of `config` makes (`cellseg.data.loader.make_split`); its training crops become
  `imagesTr`/`labelsTr` (fold `all`), its validation crops (the tuning crops the quality benchmark decides on) and
  the data root's test crops become prediction cases (`imagesTs`).
- Geometry: every case is its crop's box on the run's grid (`data.voxel_size_nm`, snapped to the EM lattice as
  `cellseg predict` does) enlarged by `CONTEXT_NM` on each side; the EM is read there with area interpolation, as
  cellseg's loader and predictor read it.
- Labels: `labels.label_volume` of the atoms' targets (`CropSource.read_targets`: unknown outside the crop, in
  arrays never annotated, and per the annotation metadata); the share of cellseg's known (class, voxel) pairs that
  survive nnU-Net's single ignore label is recorded per case, and the pairs where a group's own array disagrees
  with the union of its atoms (each array's coarser pyramid level is downsampled on its own).
- Files: `.tif` with a `.json` spacing sidecar (nnU-Net's `Tiff3DIO`), axes (z, y, x), spacing in nm.

`cases.json` beside the dataset maps every case to its crop, role and grids (read back by `probabilities`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.peers.nnunet.labels import LabelScheme, class_masks, label_volume
from cellseg.config.schema import RunConfig
from cellseg.data.grid import Grid
from cellseg.data.loader import make_split, open_crops
from cellseg.data.prediction_store import grid_from_json, grid_to_json
from cellseg.data.split import write_datasplit
from cellseg.data.targets import CropSource
from cellseg.infer.crop_plan import box_grid
from cellseg.infer.engine import context_grid
from cellseg.infer.selection import CropTarget, select_targets

log = logging.getLogger(__name__)

CONTEXT_NM = 512.0  # EM around each crop: half of a 128-voxel patch at 8 nm, what nnU-Net's 3d_fullres window sees
DATASET_ID = 501  # nnU-Net dataset ids 1-500 are taken by the Medical Segmentation Decathlon and public datasets
DATASET_NAME = f"Dataset{DATASET_ID:03d}_CellMap"
CASES_FILE = "cases.json"
FILE_ENDING = ".tif"
EM_PAD = 0  # EM value outside the volume (cellseg's data.em_pad_value default)


@dataclass(frozen=True)
class Case:
    """One nnU-Net case: a crop's box with context on the run's grid.

    Attributes:
        name: the case id (`crop<N>`).
        role: "train" (imagesTr/labelsTr), "tune" (validation crops) or "test".
        dataset: the CellMap dataset of the crop.
        grid: the case's grid (the crop grid enlarged by the context).
        crop_grid: the crop's box on the run's grid (what a prediction store holds).
        labels: a test crop's scored labels (empty: every class).
    """

    name: str
    role: str
    dataset: str
    grid: Grid
    crop_grid: Grid
    labels: tuple[str, ...] = ()

    @property
    def offset_vox(self) -> tuple[int, int, int]:
        """Where the crop grid starts inside the case grid, voxels (z, y, x)."""
        return tuple(round((c - g) / v) for c, g, v in zip(  # type: ignore[return-value]
            self.crop_grid.translation_nm, self.grid.translation_nm, self.grid.voxel_size_nm, strict=True))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "dataset": self.dataset, "grid": grid_to_json(self.grid),
                "crop_grid": grid_to_json(self.crop_grid), "labels": list(self.labels)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Case:
        return cls(name=doc["name"], role=doc["role"], dataset=doc["dataset"], grid=grid_from_json(doc["grid"]),
                   crop_grid=grid_from_json(doc["crop_grid"]), labels=tuple(doc["labels"]))


def case_grids(start_nm: Sequence[float], stop_nm: Sequence[float], target: CropTarget | CropSource,
               voxel_size_nm: Sequence[float]) -> tuple[Grid, Grid]:
    """(case grid, crop grid) of a box: the crop grid as `cellseg predict` lays it, enlarged by `CONTEXT_NM`."""
    crop = box_grid(start_nm, stop_nm, target.em(), voxel_size_nm)
    margin = [int(np.ceil(CONTEXT_NM / v)) for v in crop.voxel_size_nm]
    return context_grid(crop, margin), crop


def write_image(path: Path, volume: np.ndarray, spacing_nm: Sequence[float]) -> None:
    """A (z, y, x) volume as nnU-Net's Tiff3DIO reads it: `<case>_0000.tif` (or `<case>.tif` for labels) and the
    case's `<case>.json` spacing sidecar (nm, z, y, x)."""
    import tifffile

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tifffile.imwrite(tmp, volume)
    os.replace(tmp, path)
    case = path.name.removesuffix(FILE_ENDING).removesuffix("_0000")
    (path.parent / f"{case}.json").write_text(json.dumps({"spacing": [float(s) for s in spacing_nm]}))


def read_em(target: CropTarget | CropSource, grid: Grid) -> np.ndarray:
    """The EM on `grid` (uint8, `EM_PAD` outside the volume), read as cellseg's loader reads it."""
    return target.em().read(**grid.read_kwargs(), interpolation="area", pad_value=EM_PAD, dtype=np.uint8)


def training_case(crop: CropSource, scheme: LabelScheme, cfg: RunConfig, out: Path) -> dict[str, Any]:
    """Write one training crop's image and label map; returns its case record with the supervision kept."""
    grid, crop_grid = case_grids(crop.start_nm, crop.stop_nm, crop, cfg.data.voxel_size_nm)
    atoms = CropSource.open(crop.entry, scheme.atoms, backend=cfg.data.backend, cache_bytes=cfg.data.cache_bytes)
    target, known = atoms.read_targets(grid, use_all=False)
    labels = label_volume(target, known)
    del target, known
    scored_target, scored_known = crop.read_targets(grid, use_all=False)
    taught = labels != scheme.ignore
    k = len(scheme.classes)
    kept = int((scored_known[:k] & taught).sum())
    total = int(scored_known[:k].sum())
    # a group read from its own array can differ from the union of its atoms where each array's coarser pyramid
    # level was downsampled on its own (a crop annotated at 4 nm, read at 8 nm)
    masks = class_masks(labels, scheme)
    differ = sum(int((taught & scored_known[i] & (masks[c] != scored_target[i])).sum())
                 for i, c in enumerate(scheme.classes))
    del scored_target, scored_known
    spacing = grid.voxel_size_nm
    write_image(out / "imagesTr" / f"{crop.name}_0000{FILE_ENDING}", read_em(crop, grid), spacing)
    write_image(out / "labelsTr" / f"{crop.name}{FILE_ENDING}", labels, spacing)
    case = Case(name=crop.name, role="train", dataset=crop.dataset, grid=grid, crop_grid=crop_grid)
    counts = np.bincount(labels.ravel(), minlength=scheme.ignore + 1)
    return {**case.to_json(), "supervision": {"known_pairs": total, "kept_pairs": kept,
                                              "kept_share": kept / total if total else None,
                                              "differing_pairs": differ,
                                              "ignored_voxels": int(counts[scheme.ignore]),
                                              "labelled_voxels": int(counts[: scheme.ignore].sum())}}


def prediction_case(target: CropTarget, role: str, cfg: RunConfig, out: Path) -> dict[str, Any]:
    """Write one crop to predict (a validation or test crop): its image only."""
    grid, crop_grid = case_grids(target.start_nm, target.stop_nm, target, cfg.data.voxel_size_nm)
    write_image(out / "imagesTs" / f"{target.name}_0000{FILE_ENDING}", read_em(target, grid), grid.voxel_size_nm)
    return Case(name=target.name, role=role, dataset=target.dataset, grid=grid, crop_grid=crop_grid,
                labels=target.labels).to_json()


def dataset_json(scheme: LabelScheme, num_training: int) -> dict[str, Any]:
    """nnU-Net's `dataset.json` for the scheme."""
    return {"channel_names": {"0": "EM"}, "labels": scheme.dataset_labels(),
            "regions_class_order": scheme.regions_class_order(), "numTraining": num_training,
            "file_ending": FILE_ENDING, "overwrite_image_reader_writer": "Tiff3DIO",
            "description": "CellMap crops converted by cellseg's bench/peers/nnunet (labels: atoms; regions: the "
                           "scored classes; ignore: voxels where any atom is unknown)"}


def convert(cfg: RunConfig, raw: Path, *, progress: bool = True) -> dict[str, Any]:
    """Write the raw dataset of the run config `cfg` under `raw/DATASET_NAME` (train cases, prediction cases,
    `dataset.json`, `cases.json`, the run's `datasplit.csv`); returns the `cases.json` document.

    Raises:
        FileExistsError: the dataset folder exists (a converted dataset is reused, never rewritten in place).
        ValueError: no training crop annotates the classes; classes nnU-Net's regions cannot express.
    """
    from tqdm import tqdm

    scheme = LabelScheme.of(cfg.data.classes)
    out = raw / DATASET_NAME
    if out.exists():
        raise FileExistsError(f"{out}: a converted dataset is already there (remove it to convert again)")
    tmp = raw / f".{DATASET_NAME}.partial"
    tmp.mkdir(parents=True, exist_ok=True)
    entries = make_split(cfg.data)
    write_datasplit(entries, tmp / "datasplit.csv")
    train = open_crops([e for e in entries if e.split == "train"], cfg.data)
    if not train:
        raise ValueError(f"{cfg.data.root}: no training crop annotates the classes {list(cfg.data.classes)}")
    cases = [training_case(c, scheme, cfg, tmp) for c in tqdm(train, desc="training cases", disable=not progress)]
    todo = [(t, "tune") for t in select_targets("val", cfg, tmp)] + [(t, "test") for t in select_targets("test", cfg, tmp)]
    cases += [prediction_case(t, role, cfg, tmp) for t, role in tqdm(todo, desc="prediction cases",
                                                                      disable=not progress)]
    (tmp / "dataset.json").write_text(json.dumps(dataset_json(scheme, len(train)), indent=1))
    kept = sum(c["supervision"]["kept_pairs"] for c in cases if c["role"] == "train")
    known = sum(c["supervision"]["known_pairs"] for c in cases if c["role"] == "train")
    training = [Case.from_json(c) for c in cases if c["role"] == "train"]
    crop_vox = sum(int(np.prod(c.crop_grid.shape_vox)) for c in training)
    case_vox = sum(int(np.prod(c.grid.shape_vox)) for c in training)
    doc = {"data_root": str(cfg.data.root), "voxel_size_nm": list(cfg.data.voxel_size_nm), "context_nm": CONTEXT_NM,
           "scheme": scheme.to_json(), "kept_share": kept / known if known else None,
           "crop_share_of_cases": crop_vox / case_vox if case_vox else None,  # the labelled part of what it samples
           "cases": cases}
    (tmp / CASES_FILE).write_text(json.dumps(doc, indent=1))
    os.replace(tmp, out)
    log.info("%s: %d training cases (%.1f %% of cellseg's supervised (class, voxel) pairs kept under one ignore "
             "label), %d to predict", out, len(train), 100 * (doc["kept_share"] or 0), len(todo))
    return doc


def read_cases(dataset: Path) -> dict[str, Any]:
    """The `cases.json` of a converted dataset (`convert`).

    Raises:
        FileNotFoundError: the folder holds no converted dataset (names the step that makes it).
    """
    path = dataset / CASES_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no converted dataset here (run `python -m bench.peers.nnunet data` first)")
    return json.loads(path.read_text())
