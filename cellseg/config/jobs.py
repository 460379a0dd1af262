"""Root configs of the inference commands: one per command, composing the sections of
`cellseg.config.inference` with the job's own keys (what to read, where to write).

| command | root | sections it reads |
|---|---|---|
| `cellseg predict` | `PredictJob` | `infer` |
| `cellseg predict-ensemble` | `PredictEnsembleJob` | `infer`, `ensemble` |
| `cellseg ensemble` | `EnsembleJob` | `ensemble` |
| `cellseg postprocess` | `PostprocessJob` | `postprocess` |
| `cellseg predict-volume` | `PredictVolumeJob` | `infer`, `ensemble`, `volume` |
| `cellseg decide` | `DecideJob` | `decide` |

A recipe file may carry the sections of several steps (an ensemble recipe with its `postprocess` settings),
so that one file describes a pipeline: `load_job` checks a section another command reads against its
schema and leaves it out. Everything else follows the training configs (`cellseg.config.load`): `include:`
merging, strict keys and types, dotted `key=value` overrides.

Example:
    >>> job = load_job(PredictJob, "configs/infer/tta8.yaml", ["run_dir=runs/unet_3d", "crops=val", "out=v.zarr"])
    >>> job.infer.tta
    8
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cellseg.config.decide import DecideConfig
from cellseg.config.fields import _check
from cellseg.config.inference import EnsembleConfig, InferConfig, PostprocessConfig
from cellseg.config.load import apply_overrides, deep_merge, from_dict, read_yaml
from cellseg.config.volume import VolumeConfig

log = logging.getLogger(__name__)
J = TypeVar("J")
SECTIONS: dict[str, type] = {"infer": InferConfig, "ensemble": EnsembleConfig, "postprocess": PostprocessConfig,
                             "volume": VolumeConfig, "decide": DecideConfig}


@dataclass(frozen=True, kw_only=True)
class PredictJob:
    """`cellseg predict`: one trained run's per-class probabilities over crops.

    Attributes:
        run_dir: a `cellseg train` run directory (the RUN_DIR argument).
        crops: "val" (the run's validation crops), "test" (the data root's test crops) or comma-separated crop
            ids, e.g. "12,34" (--crops).
        out: the prediction store to write (--out).
        decisions: a decisions.json of one run (`cellseg decide RUN_DIR`): each class with TTA or without as
            decided (--decisions; RUN_DIR may then be left out).
    """

    run_dir: str = ""
    crops: str | int
    out: str
    decisions: str | None = None
    infer: InferConfig = field(default_factory=InferConfig)

    def __post_init__(self) -> None:
        _check(bool(self.run_dir) or bool(self.decisions), "no run_dir given: pass RUN_DIR (the `cellseg train` run "
               "directory), or a decisions file of one run with --decisions")


@dataclass(frozen=True, kw_only=True)
class PredictEnsembleJob:
    """`cellseg predict-ensemble`: several runs predicted in one pass into their weighted mean; with
    `ensemble.routes`, each crop by the members of its voxel-size band.

    Attributes:
        crops: "val", "test" or comma-separated crop ids, selected as for `cellseg predict` (--crops).
        out: the ensemble probability store to write (--out).
    """

    crops: str | int
    out: str
    ensemble: EnsembleConfig = field(default_factory=EnsembleConfig)
    infer: InferConfig = field(default_factory=InferConfig)

    def __post_init__(self) -> None:
        routes, members = self.ensemble.routes, self.ensemble.members
        if routes:  # a routed ensemble's bands may hold one member each
            _check(not members, f"ensemble.members {list(members)} and ensemble.routes both given: a routed "
                   "ensemble lists its members per band (ensemble.routes[].members); drop the RUN_DIR arguments "
                   "or the routes")
            _check(self.ensemble.weights == "uniform", f"ensemble.weights={self.ensemble.weights!r} with "
                   "ensemble.routes: give the weights per band (ensemble.routes[].weights)")
        elif not self.ensemble.decisions:  # a decisions file names its members
            _check_members(self.ensemble, "run directories: the RUN_DIR arguments")
        _check(self.ensemble.weights != "auto",
               "ensemble.weights=auto (--weights auto) fits on member predictions of validation crops: run "
               "`cellseg predict --crops val` per member and `cellseg ensemble ... --weights auto`, then give the "
               "weights.json it writes (ENS.zarr/weights.json) here")


@dataclass(frozen=True, kw_only=True)
class EnsembleJob:
    """`cellseg ensemble`: the weighted mean of probability stores, on a common grid per crop.

    Attributes:
        out: the ensemble probability store to write (--out).
        uint8: store round(255 p) as uint8 instead of float16 (--uint8).
        overwrite: replace `out` if it exists (--overwrite).
    """

    out: str
    uint8: bool = False
    overwrite: bool = False
    ensemble: EnsembleConfig = field(default_factory=EnsembleConfig)

    def __post_init__(self) -> None:
        _check_members(self.ensemble, "probability stores: the PRED.zarr arguments")
        _check(not self.ensemble.decisions, "ensemble.decisions: decisions are applied while predicting: use "
               "`cellseg predict-ensemble --decisions` (it predicts each class with or without TTA as decided)")
        if self.ensemble.routes:  # a routed recipe also serves to fit one band's weights on its member stores
            log.debug("ensemble.routes: for `cellseg predict-ensemble`; not used by `cellseg ensemble`")


@dataclass(frozen=True, kw_only=True)
class PostprocessJob:
    """`cellseg postprocess`: a probability store into a segmentation store (optionally tuned first).

    Attributes:
        predictions: the probability store to read (the PRED.zarr argument).
        out: the segmentation store to write (--out).
        overwrite: replace an existing `out` and parameter file (--overwrite); default: resume an `out` written
            from the same source with the same settings.
    """

    predictions: str
    out: str
    overwrite: bool = False
    postprocess: PostprocessConfig = field(default_factory=PostprocessConfig)


@dataclass(frozen=True, kw_only=True)
class PredictVolumeJob:
    """`cellseg predict-volume`: one run or an ensemble over a whole dataset (or a world ROI of it), block by block
    on the daisy scheduler, into one multiscale store.

    Attributes:
        dataset: the dataset to predict, e.g. "jrc_hela-2" (--dataset).
        out: the volume store to write (--out), e.g. "hela2.zarr".
    """

    dataset: str
    out: str
    ensemble: EnsembleConfig = field(default_factory=EnsembleConfig)
    infer: InferConfig = field(default_factory=InferConfig)
    volume: VolumeConfig = field(default_factory=VolumeConfig)

    def __post_init__(self) -> None:
        routes, members = self.ensemble.routes, self.ensemble.members
        _check(bool(routes) != bool(members) or (self.ensemble.decisions and not routes),
               "ensemble.members and ensemble.routes: give one of them (run directories as the RUN_DIR arguments, "
               "or a routed recipe)")
        _check(not routes or self.volume.scale_nm is not None, "ensemble.routes: a routed recipe predicts a volume "
               "with one band's members: set volume.scale_nm to the voxel-size scale (nm) of the band to use")
        _check(self.ensemble.weights != "auto", "ensemble.weights=auto: fit the weights on validation predictions "
               "with `cellseg ensemble ... --weights auto` and give the weights.json it writes")


@dataclass(frozen=True, kw_only=True)
class DecideJob:
    """`cellseg decide`: every decision of the measured pipeline, made on tuning crops, into decisions.json.

    Attributes:
        runs: `cellseg train` run directories (the RUN_DIR arguments, predicting the same classes; one run: its
            decisions are TTA and the decoding per class).
        out: the working directory (--out): DECIDE_DIR/decisions.json, and the stores and scores a resumed run
            reuses.
        data_root: the data root of the tuning crops (--data-root; null: the one the runs were trained on).
        overwrite: start over in `out` (--overwrite; default: resume a run with the same settings).
    """

    runs: tuple[str, ...]
    out: str
    data_root: str | None = None
    overwrite: bool = False
    decide: DecideConfig = field(default_factory=DecideConfig)

    def __post_init__(self) -> None:
        _check(len(self.runs) >= 1, "runs: give the run directories to decide for (the RUN_DIR arguments)")


JOBS: dict[str, type] = {"predict": PredictJob, "predict-ensemble": PredictEnsembleJob, "ensemble": EnsembleJob,
                         "postprocess": PostprocessJob, "predict-volume": PredictVolumeJob, "decide": DecideJob}


def _check_members(ensemble: EnsembleConfig, what: str) -> None:
    _check(len(ensemble.members) >= 2, f"ensemble.members: an ensemble needs at least 2 members ({what}), got "
           f"{len(ensemble.members)}: {list(ensemble.members)}")


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{"infer.tta": 1, "out": "p.zarr"} → {"infer": {"tta": 1}, "out": "p.zarr"}."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        patch: Any = value
        for part in reversed(key.split(".")):
            patch = {part: patch}
        out = deep_merge(out, patch)
    return out


def merge_job(cls: type, path: str | Path | None, overrides: Sequence[str] = (), *,
              flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The plain mapping `load_job` builds `cls` from: defaults < the file `path` (with includes; None: no
    file) < `flags` (dotted key → value, from command-line options) < `overrides` (`key=value` strings).

    Sections of `SECTIONS` that `cls` has no field for are checked against their schema and left out.
    """
    data = read_yaml(path) if path is not None else {}
    own = {f.name for f in dataclasses.fields(cls)}
    for name in [n for n in data if n in SECTIONS and n not in own]:
        from_dict(SECTIONS[name], data.pop(name), prefix=name)  # a typo in another step's section still fails
        log.debug("%s: section %s is for another command; not used here", path, name)
    return apply_overrides(deep_merge(data, nest(flags or {})), overrides)


def load_job(cls: type[J], path: str | Path | None, overrides: Sequence[str] = (), *,
             flags: Mapping[str, Any] | None = None) -> J:
    """A command's root config from a recipe file, command-line options and `key=value` overrides (in that
    order of precedence, the last wins), built strictly (unknown keys and wrong types raise `ValueError`)."""
    return from_dict(cls, merge_job(cls, path, overrides, flags=flags))


__all__ = ["JOBS", "SECTIONS", "DecideJob", "EnsembleJob", "PostprocessJob", "PredictEnsembleJob", "PredictJob", "PredictVolumeJob",
           "load_job",
           "merge_job", "nest"]
