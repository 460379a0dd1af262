"""Prediction stores a report may use instead of predicting: its own from an earlier run, or `cellseg predict`'s.

A store stands for the report's own prediction of a member (`store_differences` is empty) when it holds every crop
the report needs, was written from the checkpoint the report would load (the same file, not modified since the
store's first crop) by the same run, with the settings the report predicts with (its `InferConfig`: transforms,
overlap, blending, channels, stored dtype, data root, a 2D model's slicing). How it was computed is not compared:
a store predicted in bf16 on a GPU stands for one the report would predict in fp32 on the CPU (the values differ by
rounding, as between two GPUs).

`cellseg report --reuse STORE ...` names stores written by `cellseg predict` (e.g. the 8× TTA stores of a
submission): each member and stage (no TTA, 8× TTA) takes the first named store that stands for its prediction,
and the report predicts only the others. A named store that does not qualify is left untouched (never completed or
rewritten: it is the user's) and the log says why; a path that is not a probability store of one of the runs is an
error before any prediction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cellseg.decide.inputs import RunInfo, checkpoint_file

if TYPE_CHECKING:
    from cellseg.config.inference import InferConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """A store named for reuse: its path (resolved), the run that wrote it and its number of transforms."""

    path: Path
    run_dir: Path
    tta: int


def open_candidates(paths: Sequence[str], runs: Sequence[RunInfo]) -> list[Candidate]:
    """The stores named by `--reuse`, checked to be probability stores written by `cellseg predict` for one of
    `runs`.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: a path is not a probability store, records no run or TTA, or belongs to none of the runs.
    """
    from cellseg.data.prediction_store import PredictionStore

    known = {run.run_dir.resolve(): run.name for run in runs}
    out = []
    for text in paths:
        path = Path(text)
        if not path.exists():
            raise FileNotFoundError(f"--reuse {path}: no such store")
        store = PredictionStore.open(path)  # names the path when it is not a store cellseg wrote
        if store.kind != "probabilities":
            raise ValueError(f"--reuse {path}: holds {store.kind}, expected the probabilities of `cellseg predict`")
        run_dir, tta = store.provenance.get("run_dir"), store.provenance.get("tta")
        if run_dir is None or not isinstance(tta, int):
            raise ValueError(f"--reuse {path}: records no run_dir or tta in its provenance (not written by "
                             "`cellseg predict`)")
        if Path(run_dir).resolve() not in known:
            raise ValueError(f"--reuse {path}: predicted by {run_dir}, which is not one of the report's runs "
                             f"({', '.join(str(r) for r in known)})")
        out.append(Candidate(path=path.resolve(), run_dir=Path(run_dir).resolve(), tta=tta))
    return out


def store_differences(run: RunInfo, path: Path, crops: Sequence[str], infer: InferConfig) -> list[str]:
    """Why the store at `path` does not stand for the prediction of `run` the report makes with `infer`
    (`cellseg.decide.predictions.infer_config`; module docstring); empty when it does."""
    from cellseg.data.prediction_store import PredictionStore

    try:
        store = PredictionStore.open(path)
        ckpt = checkpoint_file(run.run_dir, infer.checkpoint).resolve()
    except (OSError, ValueError) as err:
        return [str(err)]
    missing = [c for c in crops if c not in store]
    if missing:
        return [f"lacks {', '.join(missing)}"]
    root = Path(infer.data_root or run.cfg.data.root).resolve()
    expected: dict[str, Any] = {"run_dir": str(run.run_dir.resolve()), "checkpoint": str(ckpt), "tta": infer.tta,
                                "overlap": infer.overlap, "blend": infer.blend, "channels": infer.channels,
                                "dtype": "uint8" if infer.uint8 else "float16"}
    given = store.provenance
    reasons = [f"{key} {given.get(key)!r}, the report's {value!r}" for key, value in expected.items()
               if given.get(key) != value]
    if given.get("axes_2d") not in (None, infer.axes_2d):  # 3D stores record None
        reasons.append(f"axes_2d {given.get('axes_2d')!r}, the report's {infer.axes_2d!r}")
    if given.get("data_root") is None or Path(given["data_root"]).resolve() != root:
        reasons.append(f"data_root {given.get('data_root')!r}, the report's {str(root)!r}")
    try:
        written = min((path / c / ".zattrs").stat().st_mtime for c in crops)
        if ckpt.stat().st_mtime > written:
            reasons.append(f"{ckpt.name} was written after the store's crops")
    except OSError as err:
        reasons.append(str(err))
    return reasons


def reused_store(run: RunInfo, candidates: Sequence[Candidate], crops: Sequence[str], infer: InferConfig
                 ) -> Path | None:
    """The first of `candidates` that stands for the report's prediction of `run` with `infer`, or None; each
    candidate of the run and TTA passed over is logged with its reasons."""
    for candidate in candidates:
        if candidate.run_dir != run.run_dir.resolve() or candidate.tta != infer.tta:
            continue
        reasons = store_differences(run, candidate.path, crops, infer)
        if not reasons:
            log.info("%s (tta=%d): using %s (every crop, from the same checkpoint and settings)", run.name,
                     infer.tta, candidate.path)
            return candidate.path
        log.info("%s (tta=%d): not using %s: %s", run.name, infer.tta, candidate.path, "; ".join(reasons))
    return None
