"""Writing a submission: our predictions, resampled onto each test crop's grid, zipped in the official format.

Input (`PREDICTIONS`): a zarr store laid out `crop<N>/<label>`, each label either an OME-NGFF
multiscale group (read with `MultiscaleImage` at the crop's grid) or a single-scale array with
`voxel_size` and `translation` attributes (nm, z, y, x; translation = centre of voxel 0). Any voxel size
works; the crop's grid is read in world coordinates, so nothing is left for the evaluator to resample.

How values are brought onto the grid (decided here, documented in docs/scoring.md):
- instance labels (the official instance list): nearest neighbour; ids must be non-negative integers
  (integral floats are accepted); written as uint16, uint32 or uint64, whichever holds the largest id,
  never wrapped (the official packer's uint8 cast turns id 256 into background);
- semantic labels with integer or bool values (binary masks): nearest, then `> 0`;
- semantic labels with float values (probabilities): "area" averaging when down-sampling, linear
  otherwise, then `> threshold` (default 0.5, in [0, 1)). Writing binary masks matters: the evaluator
  thresholds an unresampled array at `> 0`, so a raw probability of 0.01 would count as foreground.
  NaN or infinite values are refused with an error naming the crop and label: thresholded, they would
  silently become background.

A (crop, label) of the manifest that the prediction store lacks is written as an empty array (all zeros:
uint8 for a semantic label, uint16 ids for an instance label, the same attributes), unless `allow_missing`
leaves it out. An empty array never scores below a missing one and usually far above it: under the 2026
rules a missing semantic label counts every voxel of the crop as a false negative of the class, pooled over
crops, where an empty one adds only the crop's true foreground (docs/scoring.md, "Missing and empty labels").
The empty array is metadata only (`fill_value` 0, no chunk stored), which zarr reads as zeros.
A submission of which fewer than `min_share` of the (crop, label) pairs come from the predictions is refused
before anything is written (`TooFewPredictions`; `cellseg submit` asks for `MIN_PREDICTED_SHARE` unless
`--allow-empty`): written, it would be a valid zip that scores almost nothing, which is what a manifest of other
crops than the predictions' (the packaged official one for a user's own data) produces.

Output: a zip whose root holds the zarr store (`.zgroup`, `crop<N>/.zgroup`, `crop<N>/<label>/...`) as
the official packer writes it (arrays at the root are read by both evaluators; a store zipped inside a
folder is rejected by the 2025 one). Every array is single-scale, with `voxel_size`, `translation` and
`shape` attributes from the manifest. The zip is built under a temporary name (carrying host and pid, so the
next submission to the same path removes what a killed one left) and renamed when complete.

Arrays are written by a pool of threads (`workers`; zarr's codecs and numpy release the GIL on large
arrays: spawned processes were no faster, 3.6 vs 3.4 s for 2.7 G voxels on a 16-core H200 host), at most
`workers` (crop, label) pairs at a time and within a memory budget, so peak memory is at most `workers`
times that of the largest array (a resampled probability is interpolated in float64: float32 flips voxels
lying within its rounding error of the threshold, so the mask would differ). The zip's members are the same, byte for
byte, for any number of workers (only the file times differ, as between any two runs): it lists the
finished store in sorted order.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import zipfile
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cellseg.data import resample as grid
from cellseg.data.crops import Catalog, Crop, Geometry, manifest_text
from cellseg.data.write import sweep_stale, temp_sibling, with_path
from cellseg.eval.io import Source
from cellseg.eval.rules import is_scored_as_instance
from cellseg.pool import default_budget, map_bounded, usable_cores

log = logging.getLogger(__name__)
# The least share of the manifest's (crop, label) pairs `cellseg submit` takes from the predictions without
# `--allow-empty`. Below it the submission is nearly all empty arrays: the predictions are of other crops than
# the manifest's (0 of 413 pairs for a user's own data against the packaged official manifest). A model of a few
# classes stays above it on a manifest of many: the 6 classes of the demo and smoke models cover 12.5 % (6 of
# 48 per crop) to 18 % of the synthetic test manifests' pairs. A model of one class on the official manifest
# (16 of 413, 3.9 %) is below it and must say so with `--allow-empty`.
MIN_PREDICTED_SHARE = 0.10
TRAIN_HEADER = "crop_name,dataset,class_label,voxel_size,translation,shape\n"


def check_threshold(threshold: float) -> None:
    """Refuse a probability threshold outside [0, 1), which would make every mask empty or full.

    Raises:
        ValueError: naming the value.
    """
    if not 0.0 <= threshold < 1.0:
        raise ValueError(f"threshold must be in [0, 1) (a voxel is foreground when its probability is > threshold), "
                         f"got {threshold}")


def default_workers() -> int:
    """Threads used by `write_submission` and `validate_submission` by default: the CPU cores, at most 8."""
    return min(8, usable_cores())


def load_manifest(path: str | os.PathLike[str]) -> Mapping[int, Crop]:
    """Test crops from a `test_crop_manifest.csv` (crop_name,dataset,class_label,voxel_size,translation,shape)."""
    text = Path(path).read_text(encoding="utf-8")
    return Catalog.from_texts(train_text=TRAIN_HEADER, tests_text={"manifest": text}, source=f"{path}: ").test(
        "manifest")  # type: ignore[arg-type]


@dataclass(frozen=True)
class AllZero:
    """What all-zero arrays say about a submission: `crop<N>/<label>` names, those all zeros among them (`of`).

    Attributes:
        everything: every array is all zeros (nothing was predicted).
        crops: crop → its labels, for each crop whose every array is all zeros.
        classes: the labels all zeros in every crop that has them.
    """

    everything: bool
    crops: dict[str, list[str]]
    classes: list[str]

    @classmethod
    def of(cls, names: Sequence[str], zero: Collection[str]) -> AllZero:
        crops: dict[str, list[str]] = {}
        classes: dict[str, list[str]] = {}
        for where in names:
            crop, label = where.split("/", 1)
            crops.setdefault(crop, []).append(label)
            classes.setdefault(label, []).append(where)
        return cls(everything=bool(names) and all(w in zero for w in names),
                   crops={c: labels for c, labels in sorted(crops.items())
                          if all(f"{c}/{label}" in zero for label in labels)},
                   classes=sorted(label for label, where in classes.items() if all(w in zero for w in where)))


@dataclass(kw_only=True)
class SubmitReport:
    """What `write_submission` did, as `crop<N>/<label>` names in manifest order.

    Attributes:
        written: arrays written from the predictions.
        missing: (crop, label)s of the manifest that the predictions lack.
        empty: those of `missing` written as empty arrays (all of them unless `allow_missing`).
        zero: those of `written` that are all zeros.
    """

    written: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)
    zero: list[str] = field(default_factory=list)  # of `written`: all zeros after thresholding
    notes: list[str] = field(default_factory=list)

    @property
    def all_zero(self) -> AllZero:
        """What the arrays written all zeros (from the predictions, or empty for lacking labels) say."""
        return AllZero.of(self.written + self.empty, set(self.zero) | set(self.empty))

    @property
    def predicted_share(self) -> float:
        """The share of the (crop, label) pairs written from the predictions (1.0 for no pair)."""
        total = len(self.written) + len(self.missing)
        return len(self.written) / total if total else 1.0


class TooFewPredictions(ValueError):
    """Fewer than the asked share of the manifest's (crop, label) pairs are in the prediction store."""


class EmptySubmission(ValueError):
    """Every array of the submission, or of one of its crops, is all zeros."""


def recorded_data_root(predictions: str | os.PathLike[str]) -> Path | None:
    """The data root a cellseg prediction or segmentation store records it was predicted from (its provenance's
    `data_root`, its source's, or its run's `data.root`); None for any other store or when none is recorded."""
    import json

    import yaml

    try:
        provenance = json.loads((Path(predictions) / ".zattrs").read_text())["cellseg"]["provenance"]
        for record in (provenance, provenance.get("source_provenance") or {}):
            if record.get("data_root"):
                return Path(record["data_root"])
            if record.get("run_dir"):
                return Path(yaml.safe_load((Path(record["run_dir"]) / "config.yaml").read_text())["data"]["root"])
    except (OSError, KeyError, TypeError, AttributeError, ValueError, yaml.YAMLError):
        return None
    return None


MANIFEST_ATTR = "cellseg_test_manifest"  # the submission root's attribute: the manifest it was written for
DECIDED_ATTR = "cellseg_decided_for"  # ... and the era its decoding was decided for ({"era", "file"}), if any


def recorded_manifest(source: Source) -> tuple[Mapping[int, Crop], str] | None:
    """The test crops a submission cellseg wrote records it was written for (root `.zattrs`, `MANIFEST_ATTR`:
    where they came from and the manifest's rows), and that description; None for any other submission."""
    attrs = source.read_json(".zattrs") or {}
    recorded = attrs.get(MANIFEST_ATTR) if isinstance(attrs, dict) else None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("csv"), str):
        return None
    crops = Catalog.from_texts(train_text=TRAIN_HEADER, tests_text={"recorded": recorded["csv"]},
                               source=f"{source.path}: {MANIFEST_ATTR}: ").test("recorded")
    return crops, f"the manifest {source.path} records it was written for ({recorded.get('source')})"


def check_share(num_predicted: int, total: int, min_share: float, predictions: Path) -> None:
    """Refuse a submission of which fewer than `min_share` of the `total` (crop, label) pairs are predicted.

    Raises:
        TooFewPredictions: naming both counts and the share needed.
    """
    if total and num_predicted / total < min_share:
        raise TooFewPredictions(
            f"only {num_predicted} of the manifest's {total} (crop, label) pairs ({num_predicted / total:.1%}) are "
            f"in {predictions}, fewer than {min_share:.0%}: the other {total - num_predicted} would be empty arrays")


def instance_dtype(max_id: int) -> np.dtype:
    """The smallest of uint16/uint32/uint64 that holds `max_id`."""
    for dtype in (np.uint16, np.uint32, np.uint64):
        if max_id <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"instance id {max_id} does not fit uint64")


def to_instance_ids(data: np.ndarray, where: str) -> np.ndarray:
    """Instance ids as unsigned integers, refusing values that would be changed by the cast.

    Raises:
        ValueError: negative, fractional or non-finite ids.
    """
    if data.dtype == bool:
        return data.astype(np.uint16)
    if data.dtype.kind == "f":
        if not np.isfinite(data).all() or (data != np.round(data)).any():
            raise ValueError(f"{where}: instance ids must be integers (found fractional or NaN values)")
    if data.size and data.min() < 0:
        raise ValueError(f"{where}: instance ids must be non-negative (found {data.min()})")
    max_id = int(data.max()) if data.size else 0
    return data.astype(instance_dtype(max_id))


def write_empty(path: Path, geometry: Geometry, *, instance: bool) -> None:
    """An all-zero submission array at `geometry`: uint16 ids (instance) or a uint8 mask (semantic), with the
    official attributes; metadata only (no chunk stored: zarr reads the fill value 0)."""
    import zarr

    from cellseg.data.write import DEFAULT_CHUNK

    shape = tuple(int(n) for n in geometry.shape_vox)
    array = zarr.open_array(str(path), mode="w-", shape=shape, chunks=tuple(min(DEFAULT_CHUNK, n) for n in shape),
                            dtype=instance_dtype(0) if instance else np.uint8, fill_value=0,
                            dimension_separator="/")
    array.attrs.update({"voxel_size": list(geometry.voxel_size_nm), "translation": list(geometry.translation_nm),
                        "shape": list(shape)})


def _interpolation(instance: bool, dtype: np.dtype, step: float) -> grid.Interpolation:
    if instance or dtype.kind in "biu":
        return "nearest"
    return "area" if step > 1.0 else "linear"


def read_single_scale(array: object, voxel_size_nm: tuple[float, ...], translation_nm: tuple[float, ...],
                      target: Geometry, interpolation: grid.Interpolation) -> np.ndarray:
    """Read a single-scale array (voxel 0 centred at `translation_nm`) on the target grid (zero padding)."""
    shape = tuple(int(n) for n in array.shape)  # type: ignore[attr-defined]
    u0 = [(t - s) / v for t, s, v in zip(target.translation_nm, translation_nm, voxel_size_nm, strict=True)]
    steps = [tv / v for tv, v in zip(target.voxel_size_nm, voxel_size_nm, strict=True)]
    if all(abs(s - 1) < 1e-6 and abs(u - round(u)) < 1e-3 for s, u in zip(steps, u0, strict=True)):
        u0, steps, interpolation = [float(round(u)) for u in u0], [1.0] * 3, "nearest"
    taps = [grid.axis_taps(u, s, n, ns, interpolation)
            for u, s, n, ns in zip(u0, steps, target.shape_vox, shape, strict=True)]
    inside = grid.inside_mask(taps)
    dtype = array.dtype if interpolation == "nearest" else np.float64  # type: ignore[attr-defined]
    out = np.zeros(target.shape_vox, dtype=dtype)
    if not inside.any():
        return out
    where = tuple(slice(int(np.argmax(t.inside)), int(len(t.inside) - np.argmax(t.inside[::-1]))) for t in taps)
    sub = [grid.AxisTaps(t.index[w], t.weight[w], t.inside[w]) for t, w in zip(taps, where, strict=True)]
    region = tuple(slice(int(t.index.min()), int(t.index.max()) + 1) for t in sub)
    volume = np.asarray(array[region])  # type: ignore[index]
    out[where] = grid.apply_taps(volume, sub, offsets=tuple(r.start for r in region))
    return out


def _read_prediction(path: Path, label: str, target: Geometry) -> np.ndarray:
    import zarr

    from cellseg.data.arrays import MultiscaleImage

    instance = is_scored_as_instance(label)
    node = zarr.open(str(path), mode="r")
    if isinstance(node, zarr.Group):
        image = MultiscaleImage(str(path), backend="zarr")
        level = image.choose_level(target.voxel_size_nm)
        step = target.voxel_size_nm[0] / level.voxel_size_nm[0]
        interpolation = _interpolation(instance, level.dtype, step)
        return np.asarray(image.read(translation_nm=target.translation_nm, shape_vox=target.shape_vox,
                                     voxel_size_nm=target.voxel_size_nm, interpolation=interpolation, pad_value=0,
                                     dtype=level.dtype if interpolation == "nearest" else "float64"))
    try:
        vs = tuple(float(v) for v in node.attrs["voxel_size"])
        tr = tuple(float(v) for v in node.attrs["translation"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{path}: a single-scale prediction needs voxel_size and translation attributes (nm, z, y, x)"
                         ) from None
    interpolation = _interpolation(instance, node.dtype, target.voxel_size_nm[0] / vs[0])
    return read_single_scale(node, vs, tr, target, interpolation)


def prediction_on_grid(path: Path, label: str, target: Geometry, *, threshold: float = 0.5) -> np.ndarray:
    """A prediction store's label on the crop grid, as the submission stores it (ids or a binary mask).

    Raises:
        ValueError: NaN or infinite probabilities, or ids that are not non-negative integers (naming `path`).
    """
    data = _read_prediction(path, label, target)
    if is_scored_as_instance(label):
        return to_instance_ids(data, str(path))
    if data.dtype.kind == "f":
        bad = int(np.count_nonzero(~np.isfinite(data)))
        if bad:
            raise ValueError(f"{path}: {bad} NaN or infinite probabilities on the crop's grid; refusing to threshold "
                             "them into background (check the prediction or ensemble that wrote this store)")
        return (data > threshold).astype(np.uint8)
    return (data > 0).astype(np.uint8)


@contextlib.contextmanager
def _temp_dir(out: Path) -> Iterator[Path]:
    """A hidden working directory beside `out` (named for this host and pid), removed afterwards."""
    sweep_stale(out)
    tmp = temp_sibling(out)
    tmp.mkdir()
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _zip_store(store: Path, destination: Path) -> None:
    with zipfile.ZipFile(destination, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for file in sorted(store.rglob("*")):
            if file.is_file():
                archive.write(file, file.relative_to(store).as_posix())


# Peak bytes per submitted voxel while an array is written: a probability resampled in float64 (8) and its
# uint8 mask (1), or instance ids read, checked and cast (at most 8 + 1); the memory budget's unit.
BYTES_PER_VOXEL = 9


@dataclass(frozen=True)
class _Job:
    """One (crop, label) of the submission: read from `source`, written to `array`."""

    source: Path
    array: Path
    geometry: Geometry
    threshold: float

    @property
    def where(self) -> str:
        return f"{self.array.parent.name}/{self.array.name}"

    def estimate_bytes(self) -> int:
        return math.prod(self.geometry.shape_vox) * BYTES_PER_VOXEL


def _write_job(job: _Job) -> bool | None:
    """Write one array: whether it holds any foreground; None when the prediction store lacks it."""
    from cellseg.data.write import write_array

    if not job.source.exists():
        return None
    try:
        data = prediction_on_grid(job.source, job.array.name, job.geometry, threshold=job.threshold)
        write_array(job.array, data, attrs={"voxel_size": list(job.geometry.voxel_size_nm),
                                            "translation": list(job.geometry.translation_nm),
                                            "shape": list(job.geometry.shape_vox)})
    except Exception as err:
        err.add_note(f"while writing {job.where} of the submission")
        raise
    return bool(np.any(data))


def check_not_empty(report: SubmitReport) -> None:
    """Refuse a submission whose every array, or every array of some crop, is all zeros (written from an
    all-zero prediction or empty for a label the predictions lack).

    Raises:
        EmptySubmission: naming the crops (and their labels) or the whole submission.
    """
    zero = report.all_zero
    if zero.everything:
        raise EmptySubmission(f"every one of the submission's {len(report.written) + len(report.empty)} arrays is "
                              "all zeros: nothing was predicted (a failed model? a threshold above every probability?)")
    dead = zero.crops
    if dead:
        listing = "; ".join(f"{crop} ({', '.join(labels)})" for crop, labels in dead.items())
        raise EmptySubmission(f"every array of {len(dead)} crop(s) is all zeros, nothing predicted there (predicted "
                              f"outside the crop's box? other crops than the manifest's?): {listing}")


def write_submission(predictions: str | os.PathLike[str], crops: Mapping[int, Crop], out: str | os.PathLike[str], *,
                     overwrite: bool = False, threshold: float = 0.5, labels: Iterable[str] | None = None,
                     progress: bool = False, workers: int | None = None, allow_missing: bool = False,
                     min_share: float = 0.0, allow_empty: bool = True, manifest_source: str = "",
                     decided: Mapping[str, str] | None = None) -> SubmitReport:
    """Write the submission zip for every (crop, label) of `crops`: from `predictions` where it has the label,
    else an empty array (`write_empty`), or nothing when `allow_missing` (the label then scores as missing).

    `workers` (default `default_workers()`) threads write the arrays, at most `workers` at a time and within
    a memory budget; the zip's members and the report are the same for any number. Fewer than `min_share` of
    the pairs in `predictions` refuses the submission before anything is written (`check_share`); with
    `allow_empty` False (what `cellseg submit` passes unless --allow-empty), a submission whose every array, or
    every array of a crop, is all zeros is refused (`check_not_empty`), nothing left at `out`. The default
    (True) is for scoring: a stage or model that predicts nothing on a crop is a score, not an error. The store's root attributes record `crops` as a manifest
    (`MANIFEST_ATTR`, with `manifest_source`: where they came from), which `validate-submission` checks against
    by default (`recorded_manifest`), and `decided` (the era the segmentation was decoded for, as decided, and the
    decisions file: `DECIDED_ATTR`), which `cellseg evaluate` names when it scores under another era.

    Raises:
        TooFewPredictions: fewer than `min_share` of the pairs are in `predictions`.
        EmptySubmission: all zeros everywhere, or in every array of some crop (`allow_empty` False).
        FileExistsError: `out` exists and `overwrite` is False, or `out` is a directory.
        FileNotFoundError: `predictions` does not exist.
        ValueError: `workers` < 1; a threshold outside [0, 1); a prediction that cannot be submitted (NaN
            probabilities, bad ids: the error names its crop/label; nothing is written).
    """
    from tqdm import tqdm

    from cellseg.data.write import ensure_groups

    out, predictions = Path(out), Path(predictions)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; pass --overwrite to replace it")
    if out.is_dir():
        raise FileExistsError(f"{out} is a directory; the submission is a zip file: choose a file name")
    if not predictions.is_dir():
        raise FileNotFoundError(f"{predictions}: no prediction store here")
    check_threshold(threshold)
    workers = default_workers() if workers is None else workers
    wanted = set(labels) if labels else None
    rows = [(c, label, g) for c in crops.values() for label, g in sorted(c.labels.items())
            if wanted is None or label in wanted]
    check_share(sum((predictions / c.name / label).exists() for c, label, _ in rows), len(rows), min_share,
                predictions)
    try:  # a full disk, a read-only folder: the error names the submission (its arrays are written beside it)
        out.parent.mkdir(parents=True, exist_ok=True)
        with _temp_dir(out) as tmp:
            store = tmp / "submission.zarr"
            ensure_groups(store)
            root_attrs: dict[str, object] = {MANIFEST_ATTR: {"source": manifest_source, "csv": manifest_text(crops)}}
            if decided:
                root_attrs[DECIDED_ATTR] = dict(decided)
            (store / ".zattrs").write_text(json.dumps(root_attrs, indent=1))
            for name in sorted({c.name for c, _, _ in rows}):  # before the workers, which write side by side
                ensure_groups(store / name)
            jobs = [_Job(predictions / c.name / label, store / c.name / label, g, threshold) for c, label, g in rows]
            has = [job.source.exists() for job in jobs]
            lacking = [job for job, ok in zip(jobs, has, strict=True) if not ok]
            present = [job for job, ok in zip(jobs, has, strict=True) if ok]
            with tqdm(total=len(rows), desc="submission", unit="label", disable=not progress) as bar:
                for job in lacking:  # an empty array is metadata only: no worker needed
                    if not allow_missing:
                        write_empty(job.array, job.geometry, instance=is_scored_as_instance(job.array.name))
                    bar.update()
                found = map_bounded(_write_job, present, workers, done=bar.update, cost=_Job.estimate_bytes,
                                    budget=default_budget())
            written = [job.where for job, ok in zip(present, found, strict=True) if ok is not None]
            done = set(written)  # a store that vanished since `has` counts as missing, not empty
            report = SubmitReport(written=written, missing=[job.where for job in jobs if job.where not in done],
                                  empty=[] if allow_missing else [job.where for job in lacking],
                                  zero=[job.where for job, ok in zip(present, found, strict=True) if ok is False])
            if not allow_empty:
                check_not_empty(report)  # before the zip exists: nothing is left at `out`
            partial = tmp / out.name
            _zip_store(store, partial)
            os.replace(partial, out)
    except (FileExistsError, FileNotFoundError):
        raise
    except OSError as err:
        raise with_path(err, out) from err
    return report
