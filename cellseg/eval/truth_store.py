"""A ground-truth store in the evaluator's layout, built from a data root: what `cellseg evaluate SUB TRUTH` reads.

    TRUTH/crop<N>/<label>    single-scale arrays, attributes voxel_size, translation (centre of voxel 0), shape
    TRUTH/crop<N>/<label>_mask   1 where a class annotated in part of the crop is annotated (`unannotated="mask"`)
    TRUTH/.zattrs            {"cellseg_truth": {"data_root", "crops", "masks"}}: the marker `--overwrite` checks

The layout of a synthetic root's `ground_truth.zarr`. Two sources:
- a crop with labels in the root (a validation crop, or any training crop named): every class listed for it in
  the manifest is read on its own annotation grid as every scorer of cellseg reads it
  (`cellseg.eval.truth.read_class_truth`: object ids for the classes scored as instances, a 0/1 mask for the
  others); a listed class the crop does not annotate is left out, and one annotated in part of the crop is
  refused, masked (`<label>_mask`, 1 where annotated) or written with background there (`unannotated`);
- a test crop (a box `cellseg import --test-box` made: EM only in the root): the user's label volumes per class
  (`cellseg.ingest.readers` formats), each either the crop's shape or the shape of the dataset's EM at s0 (as
  `cellseg import --label` takes them; the box is then cut where the crop lies). Classes the test manifest does
  not list for the crop are not written: the evaluator would score them, and `cellseg submit` never writes them.
Values: instance ids as the smallest of uint16/32/64 that holds them, semantic labels as uint8 0/1 (`> 0`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cellseg.data.crops import Catalog, Crop, Geometry, crop_id
from cellseg.data.grid import Grid
from cellseg.data.split import SplitEntry, dataset_paths, read_datasplit
from cellseg.eval.rules import MASK_SUFFIX, is_scored_as_instance

log = logging.getLogger(__name__)
MARKER = "cellseg_truth"  # the `.zattrs` entry naming a store `build_truth` wrote


@dataclass(kw_only=True)
class TruthReport:
    """What `build_truth` wrote: `crop<N>/<label>` names, and notes on what it left out or changed."""

    out: Path
    written: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def format(self) -> str:
        """A summary for the console."""
        crops = sorted({name.split("/")[0] for name in self.written})
        lines = [f"wrote {self.out}: {len(self.written)} label arrays of {len(crops)} crops ({', '.join(crops)})"]
        return "\n".join(lines + [f"  {note}" for note in self.notes])


def _as_truth(label: str, data: np.ndarray, where: str) -> np.ndarray:
    from cellseg.eval.submit import to_instance_ids

    if is_scored_as_instance(label):
        return to_instance_ids(data, where)
    return (np.asarray(data) > 0).astype(np.uint8)


def _grid(g: Geometry) -> Grid:
    return Grid.of(translation_nm=g.translation_nm, shape_vox=g.shape_vox, voxel_size_nm=g.voxel_size_nm)


UNANNOTATED = ("refuse", "background", "mask")  # what `labelled_truth` does with a class annotated in part


class PartlyAnnotated(ValueError):
    """Classes annotated in part of their crop, with `unannotated="refuse"`."""


def labelled_truth(entry: SplitEntry, crop: Crop, classes: Sequence[str] | None, notes: list[str],
                   unannotated: str = "refuse", partial: list[str] | None = None) -> dict[str, np.ndarray]:
    """Label → truth array of a crop with labels in the root, each on its class's annotation grid.

    A class annotated in part of the crop (voxels at its "unknown" value) is, by `unannotated`: "refuse":
    listed in `partial` (the caller refuses); "background": written with those voxels as background (a
    prediction there counts as a false positive); "mask": written with `<label>_mask` beside it (1 annotated,
    0 not), which the scorers multiply prediction and truth by, so nothing there counts."""
    from cellseg.data.targets import NoRequestedClass
    from cellseg.eval.truth import open_crop, read_class_truth

    wanted = [c for c in crop.classes if classes is None or c in classes]
    if not wanted:
        notes.append(f"{crop.name}: lists none of the classes asked for: left out")
        return {}
    try:
        source = open_crop(entry, wanted)
    except NoRequestedClass:
        notes.append(f"{crop.name}: annotates none of {wanted}: left out")
        return {}
    out, absent = {}, []
    opened = {p.name for p in source.plans}
    for label in wanted:
        read = read_class_truth(source, label, _grid(crop.labels[label])) if label in opened else None
        if read is None:
            absent.append(label)
            continue
        truth, annotated = read
        unknown = int(annotated.size - np.count_nonzero(annotated))
        where = f"{crop.name}/{label}"
        if unknown and unannotated == "refuse":
            if partial is not None:
                partial.append(f"{where} ({unknown} of {annotated.size} voxels)")
            continue
        if unknown and unannotated == "background":
            notes.append(f"{where}: {unknown} of {annotated.size} voxels not annotated, written as background "
                         "(--unannotated background: a prediction there counts as a false positive)")
        if unknown and unannotated == "mask":
            notes.append(f"{where}: {unknown} of {annotated.size} voxels not annotated, masked ({label}{MASK_SUFFIX})")
            out[f"{label}{MASK_SUFFIX}"] = annotated.astype(np.uint8)
        out[label] = _as_truth(label, truth, where)
    if absent:
        notes.append(f"{crop.name}: listed but not annotated, left out: {', '.join(absent)}")
    return out


def _em_s0(root: Path, dataset: str) -> Geometry:
    from cellseg.data.arrays import MultiscaleImage

    s0 = MultiscaleImage(dataset_paths(root, dataset)[0], backend="zarr").levels[0]
    return Geometry(voxel_size_nm=s0.voxel_size_nm, translation_nm=s0.translation_nm, shape_vox=s0.shape_vox)


def _box(g: Geometry, em: Geometry, where: str) -> tuple[slice, ...]:
    """The crop's voxels in the EM's s0 grid.

    Raises:
        ValueError: the crop is on another voxel size, off the grid, or not inside the EM.
    """
    if not np.allclose(g.voxel_size_nm, em.voxel_size_nm):
        raise ValueError(f"{where}: the crop's voxel size {g.voxel_size_nm} is not the EM's {em.voxel_size_nm}: "
                         f"give a label volume of the crop's shape {g.shape_vox}")
    start = (np.asarray(g.translation_nm) - np.asarray(em.translation_nm)) / np.asarray(em.voxel_size_nm)
    if not np.allclose(start, np.round(start), atol=1e-3):
        raise ValueError(f"{where}: the crop is not on the EM's voxel grid")
    lo = np.round(start).astype(int)
    hi = lo + np.asarray(g.shape_vox)
    if (lo < 0).any() or (hi > np.asarray(em.shape_vox)).any():
        raise ValueError(f"{where}: the crop's box {lo.tolist()}–{hi.tolist()} leaves the EM {em.shape_vox}")
    return tuple(slice(int(a), int(b)) for a, b in zip(lo, hi, strict=True))


def volume_truth(root: Path, crop: Crop, volumes: Mapping[str, str], *, axes: str, notes: list[str]
                 ) -> dict[str, np.ndarray]:
    """Label → truth array of a test crop from the user's label volumes (module docstring).

    Raises:
        ValueError: a volume of neither the crop's nor the EM's shape, or a box the EM does not hold.
        FileNotFoundError: a volume that does not exist.
    """
    from cellseg.ingest.readers import open_volume

    out = {}
    for label, spec in sorted(volumes.items()):
        if label not in crop.labels:
            notes.append(f"{crop.name}/{label}: not listed for the crop in the test manifest: not written")
            continue
        g, where = crop.labels[label], f"{crop.name}/{label} ({spec})"
        volume = open_volume(spec, axes=axes)
        if tuple(volume.shape) == tuple(g.shape_vox):
            data = volume.read()
        else:
            em = _em_s0(root, crop.dataset)
            if tuple(volume.shape) != tuple(em.shape_vox):
                raise ValueError(f"{where}: shape {volume.shape} is neither the crop's {g.shape_vox} nor the EM's "
                                 f"{em.shape_vox} (z, y, x)")
            data = volume.read(_box(g, em, where))
        out[label] = _as_truth(label, data, where)
    lacking = sorted(set(crop.labels) - set(volumes))
    if lacking:
        notes.append(f"{crop.name}: {len(lacking)} listed classes without a label volume, not in the truth: "
                     f"{', '.join(lacking)}")
    return out


def select_crops(root: Path, crops: str, datasplit: str | os.PathLike[str] | None
                 ) -> tuple[list[tuple[Crop, SplitEntry | None]], Catalog]:
    """The crops `crops` names ("val": the datasplit's validation crops; "test": the test manifest's; or
    comma-separated ids of training or test crops), each with its split entry (None for a test crop).

    Raises:
        ValueError: no validation crop, or an id the root does not know.
        FileNotFoundError: "val" without a datasplit.
    """
    catalog = Catalog.from_dir(root)
    tests = catalog.tests.get("2026", {})
    split_file = Path(datasplit) if datasplit else root / "datasplit.csv"
    entries = {e.crop_name: e for e in read_datasplit(split_file)} if split_file.is_file() else {}
    known = {c.name: c for c in catalog.train.values()}

    def entry(crop: Crop) -> SplitEntry:
        return entries.get(crop.name) or SplitEntry(split="validate", em_url=str(catalog.locate(crop.em_url)),
                                                    crop_url=str(catalog.locate(crop.crop_url)), classes=crop.classes)

    if crops == "val":
        if not split_file.is_file():
            raise FileNotFoundError(f"{split_file}: no datasplit to take the validation crops from (--datasplit)")
        names = [n for n, e in entries.items() if e.split == "validate" and n in known]
        if not names:
            raise ValueError(f"{split_file}: no validation crop of {root}'s catalogue")
        return [(known[n], entry(known[n])) for n in sorted(names, key=crop_id)], catalog
    if crops == "test":
        if not tests:
            raise ValueError(f"{root}: no test_crop_manifest.csv (`cellseg import --test-box` writes one)")
        return [(c, None) for c in tests.values()], catalog
    chosen: list[tuple[Crop, SplitEntry | None]] = []
    for text in crops.split(","):
        cid = crop_id(text.strip())
        if cid in catalog.train:
            chosen.append((catalog.train[cid], entry(catalog.train[cid])))
        elif cid in tests:
            chosen.append((tests[cid], None))
        else:
            raise ValueError(f"crop {text.strip()!r} is neither a training nor a test crop of {root}")
    return chosen, catalog


def write_store(out: Path, arrays: Mapping[str, Mapping[str, tuple[np.ndarray, Geometry]]], *,
                meta: Mapping[str, object], overwrite: bool) -> None:
    """Write crop → label → (array, geometry) under `out`, atomically.

    Raises:
        FileExistsError: `out` exists and `overwrite` is False, or it is not a truth store cellseg wrote.
    """
    from cellseg.data.write import TRUTH_STORE, atomic_dir, ensure_groups, write_array

    with atomic_dir(out, overwrite=overwrite, kind=TRUTH_STORE) as tmp:
        ensure_groups(tmp)
        (tmp / ".zattrs").write_text(json.dumps({MARKER: dict(meta)}, indent=2))
        for crop, labels in sorted(arrays.items()):
            ensure_groups(tmp / crop)
            for label, (data, g) in sorted(labels.items()):
                write_array(tmp / crop / label, data, attrs={"voxel_size": list(g.voxel_size_nm),
                                                             "translation": list(g.translation_nm),
                                                             "shape": list(g.shape_vox)})


def build_truth(root: str | os.PathLike[str], out: str | os.PathLike[str], *, crops: str = "val",
                classes: Sequence[str] | None = None, volumes: Mapping[str, str] | None = None,
                datasplit: str | os.PathLike[str] | None = None, axes: str = "zyx", overwrite: bool = False,
                progress: Callable[[int], None] | None = None, unannotated: str = "refuse") -> TruthReport:
    """Write the evaluator-layout truth of `crops` of the data root `root` to `out` (module docstring);
    `unannotated` says what becomes of a class annotated in part of its crop (`labelled_truth`).

    Raises:
        PartlyAnnotated: classes annotated in part, with `unannotated="refuse"` (nothing written).
        ValueError: a test crop without `volumes`, nothing to write, or what `select_crops`/`volume_truth` raise.
        FileExistsError: `out` exists (see `write_store`).
    """
    if unannotated not in UNANNOTATED:
        raise ValueError(f"--unannotated {unannotated!r}: choose one of {', '.join(UNANNOTATED)}")
    root, out = Path(root), Path(out)
    chosen, _ = select_crops(root, crops, datasplit)
    report = TruthReport(out=out)
    arrays: dict[str, dict[str, tuple[np.ndarray, Geometry]]] = {}
    partial: list[str] = []
    for crop, entry in chosen:
        if entry is not None:
            truth = labelled_truth(entry, crop, classes, report.notes, unannotated, partial)
        elif volumes:
            wanted = {k: v for k, v in volumes.items() if classes is None or k in classes}
            truth = volume_truth(root, crop, wanted, axes=axes, notes=report.notes)
        else:
            raise ValueError(f"{crop.name} is a test crop: its labels are not in {root}; give them with "
                             "--label CLASS=VOLUME")
        if truth:
            arrays[crop.name] = {label: (data, crop.labels[label.removesuffix(MASK_SUFFIX)])
                                 for label, data in truth.items()}
        if progress is not None:
            progress(1)
    if partial:
        raise PartlyAnnotated(
            f"{len(partial)} classes are annotated in part of their crop: {'; '.join(partial)}. The official layout "
            "has no unknown value: --unannotated mask writes <label>_mask beside each (nothing outside the "
            "annotation counts; cellseg evaluate does not score these masks as classes, the official evaluator "
            "would), --unannotated background writes those voxels as background (a prediction there counts as a "
            "false positive), or leave the classes out with --classes. Nothing was written")
    if not arrays:
        raise ValueError(f"nothing to write: no annotated class in {[c.name for c, _ in chosen]}")
    report.written = [f"{c}/{label}" for c, labels in sorted(arrays.items()) for label in sorted(labels)
                      if not label.endswith(MASK_SUFFIX)]
    masks = [f"{c}/{label}" for c, labels in sorted(arrays.items()) for label in sorted(labels)
             if label.endswith(MASK_SUFFIX)]
    write_store(out, arrays, meta={"data_root": str(root.resolve()), "crops": sorted(arrays), "masks": masks},
                overwrite=overwrite)
    return report
