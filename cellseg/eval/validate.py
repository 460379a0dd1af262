"""`validate-submission`: read a submission as the evaluators will and list every problem, without scoring.

Each issue has a severity (`error`: the label or crop will score 0 or the evaluator rejects the
submission; `warning`: it will be scored, but probably not as intended) and the eras it concerns.
Checks, in order: zip safety; folder layout (nested store, bare numbers, missing `.zgroup`); missing
crops and labels, each with its cost in both eras (`missing.MissingCost`), including labels written as
multiscale groups, which are never read; unknown or unexpected labels; array metadata (dtype, codecs,
attributes); where each array lands after the evaluator's resampling, snapping and cropping (coverage,
the 2025 copy-length bug, the 16³ size limit); and, reading the data, NaNs, float or wrapped instance
ids and the number of 26-connected objects against the instance-count cutoffs (integer semantic masks
are only decoded: every chunk must decode to its size), and the share of arrays that are all zeros
(`empty_summary`: a warning when almost nothing is predicted; `all_zero_issues`: an error for a crop, or
a submission, whose every array is all zeros, and a warning naming classes all zeros in every crop).

The data checks run on `workers` threads (decompression and numpy release the GIL on large arrays), or,
from `PROCESS_MIN_INSTANCE_VOXELS` instance voxels on, on `workers` spawned processes (cc3d's connected
components hold the GIL), largest array first within a memory budget (`pool.map_bounded`); at most
`workers` arrays are in memory at a time, and a process that dies (out of memory) is reported as an error
of its array. The issues come back in the same order for any number of workers and either pool.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cellseg.data.crops import Crop, Geometry, crop_id, is_crop_name
from cellseg.eval.eras import ERAS, get_era
from cellseg.eval.io import ArrayInfo, CropListing, Source, check_decodes, open_source, read_array
from cellseg.eval.missing import MissingCost, missing_costs
from cellseg.eval.resample import (
    BadAttributes,
    Target,
    read_geometry,
    size_ratio,
    uses_chunked_2026,
    voxel_offset,
)
from cellseg.eval.rules import (
    MAX_VOLUME_SIZE_RATIO_2026,
    RATIO_CUTOFF_2025,
    is_scored_as_instance,
    ratio_cutoff_2026,
)
from cellseg.eval.submission_layout import discover
from cellseg.eval.submit import default_workers
from cellseg.pool import default_budget, map_bounded

BOTH: tuple[str, ...] = ERAS


@dataclass(frozen=True)
class Issue:
    """One problem: severity, location (`crop557/mito` or `submission`), message, eras concerned."""

    severity: str
    where: str
    message: str
    eras: tuple[str, ...] = BOTH

    def __str__(self) -> str:
        every = "both eras" if len(ERAS) == 2 else "all eras"
        eras = every if set(self.eras) == set(ERAS) else f"{'/'.join(self.eras)} metric"
        return f"{self.severity:<7} {self.where}: {self.message} [{eras}]"


def _target(geometry: Geometry) -> Target:
    return Target(voxel_size_nm=tuple(geometry.voxel_size_nm), translation_nm=tuple(geometry.translation_nm),
                  shape_vox=tuple(geometry.shape_vox))


def _covered(n_in: int, offset: int, size: int, *, copy_length_bug: bool) -> tuple[int, int]:
    """(target voxels covered along one axis, prediction voxels dropped by the 2025 copy-length bug)."""
    if offset < 0:
        return max(0, min(size, n_in + offset)), 0
    correct = max(0, min(size, n_in + offset) - offset)
    if copy_length_bug:
        buggy = max(0, min(size, n_in) - offset)
        return buggy, correct - buggy
    return correct, 0


def placement_issues(where: str, info: ArrayInfo, target: Target, instance: bool) -> list[Issue]:
    """Where the array lands in the crop after each era's resampling, snapping and crop/pad."""
    try:
        vs, tr, strict = read_geometry(info.attrs, len(info.shape))
    except BadAttributes as err:
        return [Issue("error", where, f"{err}; the evaluators fail on it (scored as missing)")]
    issues = []
    if not strict:
        issues.append(Issue("error", where, "voxel_size/translation are not plain lists of 3 numbers", ("2025",)))
    if vs is None and tr is None:
        issues.append(Issue("warning", where, "no voxel_size/translation attributes: assumed on the crop grid and "
                             "centre-cropped/padded" + ("" if tuple(info.shape) == target.shape_vox else
                                                        f" from {info.shape} to {target.shape_vox}")))
        return issues
    scale = np.asarray(vs[-3:] if vs else target.voxel_size_nm) / np.asarray(target.voxel_size_nm)
    resampled = [max(1, int(np.round(n * s))) for n, s in zip(info.shape, scale, strict=True)]
    if vs is not None and not np.allclose(scale, 1):
        kind = "nearest" if instance else "linear, then > 0.5"
        issues.append(Issue("warning", where, f"voxel size {vs[-3:]} ≠ crop {target.voxel_size_nm}: the evaluator "
                            f"resamples ({kind}) to {tuple(resampled)} voxels; submit at the crop's grid"))
        if instance and info.dtype.kind == "f" and (scale < 1).any():
            issues.append(Issue("warning", where, "float instance ids are Gaussian-smoothed by skimage's "
                                "anti-aliasing when down-sampled: write integer ids"))
        if not instance and info.dtype == bool:
            issues.append(Issue("error", where, "bool array needs resampling: skimage refuses it (the 2025 "
                                "evaluator fails)", ("2025",)))
    if size_ratio(info.shape, target) > MAX_VOLUME_SIZE_RATIO_2026:
        issues.append(Issue("error", where, f"{size_ratio(info.shape, target):.0f}× the crop's voxels: the 2026 "
                            "evaluator refuses more than 4096×", ("2026",)))
    elif uses_chunked_2026(info.shape, vs, target):
        issues.append(Issue("warning", where, "over 500 MB: the 2026 evaluator resamples it in 297³ blocks, each "
                            "anti-aliased on its own (seams)", ("2026",)))
    issues += _offset_issues(where, tr, target, resampled)
    return issues


def _offset_issues(where: str, tr: tuple[float, ...] | None, target: Target, resampled: list[int]) -> list[Issue]:
    issues = []
    offset = voxel_offset(tr[-3:], target) if tr is not None else np.zeros(3, dtype=int)
    if tr is not None:
        intended = (np.asarray(tr[-3:]) - np.asarray(target.translation_nm)) / np.asarray(target.voxel_size_nm)
        if (np.abs(intended - offset) > 0.5 + 1e-9).any():
            issues.append(Issue("warning", where, f"translation {tr[-3:]} snaps to a shift of {tuple(offset.tolist())} "
                                f"crop voxels, not the intended {tuple(np.round(intended, 2).tolist())} (the evaluators "
                                "floor the translation onto the crop grid)"))
    for bug in (True, False):  # eras whose loaders place an array alike share their issues (2025 first)
        eras = tuple(e for e in ERAS if get_era(e).copy_length_bug == bug)
        if not eras:
            continue
        cover = [_covered(n, int(o), s, copy_length_bug=bug)
                 for n, o, s in zip(resampled, offset, target.shape_vox, strict=True)]
        fraction = math.prod(c / s for (c, _), s in zip(cover, target.shape_vox, strict=True))
        dropped = max(d for _, d in cover)
        if dropped:
            issues.append(Issue("warning", where, f"copy-length bug: the last {dropped} voxels of the prediction are "
                                "dropped (smaller than the crop and starting inside it)", eras))
        if fraction < 1:
            issues.append(Issue("warning" if fraction > 0 else "error", where,
                                f"covers {fraction:.1%} of the crop after placement; the rest is background", eras))
    return issues


def metadata_issues(where: str, info: ArrayInfo, instance: bool) -> list[Issue]:
    """dtype and codec problems visible without reading data."""
    if info.problem:
        return [Issue("error", where, f"{info.problem} (scored as missing)")]
    if len(info.shape) != 3:
        return [Issue("error", where, f"shape {info.shape} is not 3-D (z, y, x)")]
    issues = []
    if instance and info.dtype == np.uint8:
        issues.append(Issue("warning", where, "uint8 instance ids: `csc pack-results` wraps ids modulo 256 (id 256 "
                            "becomes background); write uint16/uint32"))
    if instance and info.dtype.kind == "f":
        issues.append(Issue("warning", where, "float instance ids: write unsigned integers"))
    if not instance and info.dtype.kind == "f":
        issues.append(Issue("warning", where, "float values are thresholded at > 0 when no resampling happens (a "
                            "probability of 0.01 is foreground): write a binary mask"))
    return issues


def data_issues(where: str, data: np.ndarray, instance: bool, truth: np.ndarray | None = None) -> list[Issue]:
    """Issues that need the values: NaNs, negative ids, the number of objects (against `truth` if given)."""
    issues = []
    if data.dtype.kind == "f" and np.isnan(data).any():
        issues.append(Issue("warning", where, f"{int(np.isnan(data).sum())} NaN voxels (counted as background)"))
    if not instance:
        return issues
    if data.dtype.kind in "if" and data.size and np.nanmin(data) < 0:
        issues.append(Issue("warning", where, "negative ids are objects too (only 0 is background)"))
    import cc3d

    _, count = cc3d.connected_components(data, connectivity=26, return_N=True)
    if truth is None:
        if count > RATIO_CUTOFF_2025:
            issues.append(Issue("info", where, f"{count} objects after 26-connected relabelling: the crop scores 0 "
                                f"(2025) if the truth has fewer than {math.ceil(count / RATIO_CUTOFF_2025)} objects, "
                                "and is skipped (2026) if nP/nG > 10 + 50·exp(−nG/5); check with --truth"))
        return issues
    import fastremap

    ids = fastremap.unique(truth)
    n_ids, max_id = int(np.count_nonzero(ids)), int(ids.max()) if ids.size else 0
    if n_ids and count / n_ids > RATIO_CUTOFF_2025:
        issues.append(Issue("error", where, f"too many instances: {count} predicted for {n_ids} true objects "
                            f"(> {RATIO_CUTOFF_2025:g}×): every score of the crop is 0", ("2025",)))
    if max_id > 0 and count / max_id > ratio_cutoff_2026(max_id):
        issues.append(Issue("error", where, f"too many instances: {count} predicted for nG = {max_id} (> "
                            f"{ratio_cutoff_2026(max_id):.1f}×): the crop is skipped", ("2026",)))
    if 0 < count < n_ids:  # none at all: the 2025 Hausdorff distance is 0 (sqrt(background fraction) scored)
        issues.append(Issue("warning", where, f"{count} objects for {n_ids} true ones: an unmatched true object "
                            "makes the 2025 Hausdorff distance infinite (crop score 0)", ("2025",)))
    return issues


@dataclass(frozen=True)
class DataCheck:
    """One array whose values are to be read (picklable: it may run in another process)."""

    source: Source
    info: ArrayInfo
    where: str
    instance: bool
    max_bytes: int
    truth: Source | None = None
    truth_info: ArrayInfo | None = None  # the true array of an instance label, checked against

    @property
    def values_needed(self) -> bool:
        """False for an integer semantic mask: no value can be wrong, only a chunk that does not decode."""
        return self.instance or self.info.dtype.kind == "f"

    def estimate_bytes(self) -> int:
        """Peak memory of `_data_check`: the array, cc3d's labels and union-find table, the truth and its ids;
        a chunk for an array whose values are not needed."""
        if not self.values_needed:
            return math.prod(self.info.chunks) * self.info.dtype.itemsize
        voxels = self.info.num_voxels
        peak = self.info.nbytes + (voxels if self.info.dtype.kind == "f" else 0) + (8 * voxels if self.instance else 0)
        return peak + (2 * self.truth_info.nbytes if self.truth_info is not None else 0)


def _data_check(check: DataCheck) -> list[Issue]:
    """Read one array (and its truth) and return `data_issues`, or the error that makes it unreadable; an
    integer semantic mask is only decoded, chunk by chunk (`check_decodes`)."""
    try:
        if not check.values_needed:
            return [] if check_decodes(check.source, check.info) else [Issue("info", check.where, EMPTY_ARRAY)]
        data = read_array(check.source, check.info, max_bytes=check.max_bytes)
        truth = None if check.truth is None or check.truth_info is None else read_array(
            check.truth, check.truth_info, max_bytes=check.max_bytes)
        empty = [] if np.any(data) else [Issue("info", check.where, EMPTY_ARRAY)]
        return empty + data_issues(check.where, data, check.instance, truth)
    except ValueError as err:
        return [Issue("error", check.where, f"{err} (scored as missing)")]
    except MemoryError:
        return [Issue("error", check.where, f"values not checked: out of memory reading {check.info.nbytes / 2**30:.1f} "
                      "GiB")]


def _died(check: DataCheck) -> list[Issue]:
    return [Issue("error", check.where, "values not checked: the process reading them died (out of memory?)")]


EMPTY_ARRAY = "all zeros: nothing predicted (an empty array)"
EMPTY_SHARE = "arrays all zeros:"  # the summary's start (`empty_summary`), printed by validate-submission


def empty_summary(issues: list[Issue], num_arrays: int) -> Issue:
    """The share of the `num_arrays` arrays whose values were read that are all zeros: a warning when fewer
    than `MIN_PREDICTED_SHARE` of them hold anything (the submission scores almost nothing), else info."""
    from cellseg.eval.submit import MIN_PREDICTED_SHARE

    empty = sum(i.message == EMPTY_ARRAY for i in issues)
    share = empty / num_arrays if num_arrays else 0.0
    low = num_arrays > 0 and (num_arrays - empty) / num_arrays < MIN_PREDICTED_SHARE
    return Issue("warning" if low else "info", "submission",
                 f"{EMPTY_SHARE} {empty} of {num_arrays} ({share:.1%})" + (
                     f": fewer than {MIN_PREDICTED_SHARE:.0%} hold a prediction (written for other crops than "
                     "these? check the manifest)" if low else ""))


def all_zero_issues(issues: list[Issue], read: Sequence[str], *, allow_empty: bool = False) -> list[Issue]:
    """What the all-zero arrays among the `read` ones (`crop<N>/<label>` names whose values were read) mean
    together: an error for a submission whose every array is all zeros and for each crop whose every array is
    (a failed model, a wrong threshold, a crop predicted outside its box), warnings with `allow_empty`; a warning
    naming the classes that are all zeros in every crop that has them."""
    from cellseg.eval.submit import AllZero

    zero = AllZero.of(read, {i.where for i in issues if i.message == EMPTY_ARRAY})
    severity = "warning" if allow_empty else "error"
    allowed = " (allowed by --allow-empty)" if allow_empty else "; --allow-empty if this is meant"
    if zero.everything:
        return [Issue(severity, "submission", f"every one of its {len(read)} arrays is all zeros: nothing was "
                      f"predicted{allowed}")]
    out = [Issue(severity, crop, f"every one of its {len(labels)} arrays is all zeros ({', '.join(labels)}): nothing "
                 f"predicted in this crop (predicted outside its box? a wrong threshold?){allowed}")
           for crop, labels in zero.crops.items()]
    absent = zero.classes
    if absent:
        out.append(Issue("warning", "submission", f"{len(absent)} classes are all zeros in every crop that has them: "
                         f"{', '.join(absent)}"))
    return out


GROUP_LABEL = "written as a group (OME-NGFF multiscale?): the evaluators list arrays only"


def missing_issue(where: str, cost: MissingCost, *, why: str = "absent", allowed: bool = False) -> Issue:
    """A label the submission lacks, with its cost in both eras: an error, or a warning when `allowed`
    (`--allow-missing`)."""
    allow = " (allowed by --allow-missing)" if allowed else ""
    fix = "write a single-scale array" if why == GROUP_LABEL else "write an empty array instead"
    return Issue("warning" if allowed else "error", where,
                 f"label {why}; scored as missing{allow}. {cost.describe()}. Fix: {fix} (`cellseg submit` does)")


def _crop_issues(source: Source, crop: Crop, listing: CropListing | None, *, read_data: bool,
                 max_bytes: int, truth: Source | None, costs: Mapping[str, MissingCost],
                 allow_missing: bool) -> list[Issue | DataCheck]:
    """The crop's issues in order, with a deferred `DataCheck` where an array's values are to be read."""
    from cellseg.classes import get_class
    from cellseg.eval.io import list_crop

    if listing is None:
        whole = Issue("warning" if allow_missing else "error", crop.name,
                      f"crop missing: all {len(crop.labels)} labels scored as missing (each below)")
        return [whole] + [missing_issue(f"{crop.name}/{label}", costs[f"{crop.name}/{label}"], why="absent (crop "
                                        "missing)", allowed=allow_missing) for label in sorted(crop.labels)]
    true_arrays = list_crop(truth, crop.name).arrays if truth is not None and read_data else {}
    issues: list[Issue | DataCheck] = []
    for label, geometry in sorted(crop.labels.items()):
        where = f"{crop.name}/{label}"
        info = listing.arrays.get(label)
        if info is None:
            group = label in listing.groups  # a mistake, not a choice: never allowed
            issues.append(missing_issue(where, costs[where], why=GROUP_LABEL if group else "absent",
                                        allowed=allow_missing and not group))
            continue
        instance = is_scored_as_instance(label)
        issues += metadata_issues(where, info, instance)
        if info.problem or len(info.shape) != 3:
            continue
        issues += placement_issues(where, info, _target(geometry), instance)
        if read_data:
            true = true_arrays.get(label) if instance else None
            issues.append(DataCheck(source, info, where, instance, max_bytes, truth if true is not None else None, true))
    for label in sorted(set(listing.arrays) - set(crop.labels)):
        try:
            get_class(label.removesuffix("_mask"))
            issues.append(Issue("warning", f"{crop.name}/{label}", "not scored for this crop (ignored)"))
        except ValueError as err:
            issues.append(Issue("warning", f"{crop.name}/{label}", f"{err} (ignored)"))
    return issues


def crops_from_truth(truth: Source) -> dict[int, Crop]:
    """Test crops (label geometry from the attributes) of a ground-truth store in the evaluator's layout; the masks
    a `cellseg truth` store lists as masks only (`cellseg.eval.score.truth_masks`) are not labels to submit."""
    from cellseg.eval.io import list_crop
    from cellseg.eval.score import truth_masks
    from cellseg.eval.tasks import truth_target

    crops, masks = {}, truth_masks(truth)
    for name in truth.subdirs(""):
        if not is_crop_name(name):
            continue
        labels = {}
        for label, info in list_crop(truth, name).arrays.items():
            if f"{name}/{label}" in masks:
                continue
            try:
                t = truth_target(info)
            except ValueError:
                continue
            labels[label] = Geometry(voxel_size_nm=t.voxel_size_nm, translation_nm=t.translation_nm,  # type: ignore[arg-type]
                                     shape_vox=t.shape_vox)  # type: ignore[arg-type]
        if labels:
            crops[crop_id(name)] = Crop(id=crop_id(name), dataset="", labels=labels)
    if not crops:
        raise ValueError(f"{truth.path}: no crop<N>/<label> arrays with voxel_size attributes")
    return crops


# Instance voxels from which the data checks run in spawned processes rather than threads: cc3d's connected
# components hold the GIL, so threads count objects one array at a time, while a process costs ~0.4 s to
# start and import zarr/cc3d (measured on 2 cores). 2**27 voxels (128 Mi: 512 MiB of uint32 ids) take
# ~0.5 s of cc3d (~280 Mvox/s on one core), about what the second process saves from there on; smaller
# submissions (a few crops, the tests) keep the threads.
PROCESS_MIN_INSTANCE_VOXELS = 2**27


def uses_processes(instance_voxels: int, workers: int) -> bool:
    """True when `validate_submission` checks the data in processes: several workers, enough instance voxels."""
    return workers > 1 and instance_voxels >= PROCESS_MIN_INSTANCE_VOXELS


def validate_submission(path: str | os.PathLike[str], crops: Mapping[int, Crop], *, read_data: bool = True,
                        max_bytes: int = 8 * 1024**3, truth: Source | None = None,
                        workers: int | None = None, processes: bool | None = None,
                        allow_missing: bool = False, allow_empty: bool = False) -> list[Issue]:
    """Every problem the evaluators would meet in the submission at `path`, for the given test crops.

    A missing crop or label is an error naming its cost in both eras (a warning with `allow_missing`; a label
    written as a multiscale group stays an error). A crop, or the whole submission, whose every array is all
    zeros is an error (a warning with `allow_empty`; `all_zero_issues`). With `truth` (a ground-truth source), instance counts are
    checked against the true objects. `workers` (default `default_workers()`) threads, or processes
    (`processes`; None: when `uses_processes`), read the arrays, at most `workers` at a time; the issues are
    the same either way.

    Raises:
        ValueError: `workers` < 1.
    """
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    try:
        source = open_source(path)
    except ValueError as err:
        return [Issue("error", "submission", str(err))]
    names = {c.name for c in crops.values()}
    issues: list[Issue | DataCheck] = []
    layouts = {era: discover(source, names, repairs=get_era(era).repairs_layout) for era in ERAS}
    for era, layout in layouts.items():
        issues += [Issue("error", "submission", f"the {era} evaluator rejects the submission: {r}", (era,))
                   for r in layout.official_failure]
    # crops are checked where an evaluator that repairs the layout finds them (the most it reads)
    layout = next((layouts[e] for e in ERAS if get_era(e).repairs_layout), layouts[ERAS[-1]])
    issues += [Issue("warning", "submission", f"folder {f!r} matches no test crop (ignored)") for f in layout.unmatched
               if not f.startswith(".")]
    costs = missing_costs(crops)
    for crop in sorted(crops.values(), key=lambda c: c.id):
        issues += _crop_issues(source, crop, layout.crops.get(crop.name), read_data=read_data, max_bytes=max_bytes,
                               truth=truth, costs=costs, allow_missing=allow_missing)
    checks = [i for i in issues if not isinstance(i, Issue)]
    if processes is None:
        processes = uses_processes(sum(c.info.num_voxels for c in checks if c.instance), workers)
    if processes:
        found = map_bounded(_data_check, checks, workers, processes=True, cost=DataCheck.estimate_bytes,
                            budget=default_budget(), died=_died)
    else:
        found = map_bounded(_data_check, checks, workers)
    results = iter(found)  # in order, spliced back in place
    final = [j for i in issues for j in ([i] if isinstance(i, Issue) else next(results))]
    if not read_data:
        return final
    zero = all_zero_issues(final, [c.where for c in checks], allow_empty=allow_empty)
    return [empty_summary(final, len(checks)), *zero, *final]  # the summaries first: headlines
