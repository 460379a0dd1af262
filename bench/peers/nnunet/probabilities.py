"""nnU-Net's predicted probabilities as a cellseg prediction store, at the crops' geometry.

`nnUNetv2_predict --save_probabilities` writes `<case>.npz` with `probabilities`: `(R, z, y, x)`, one sigmoid per
region in `dataset.json`'s label order (here: the scored classes, `labels.LabelScheme.classes`), on the case's
grid (nnU-Net resamples its prediction back to the input's geometry). Each case's crop box is cut out of it and
written as one crop of a probability store (float16, as `cellseg predict` writes), so everything downstream —
thresholding, cellseg's post-processing and its tuning, submissions, scoring in every era, ensembling — reads nnU-Net's
prediction exactly as it reads a cellseg model's.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.peers.nnunet.cases import Case
from cellseg.classes import is_instance
from cellseg.data.prediction_store import PredictionStore

PROBABILITIES_KEY = "probabilities"  # the array nnU-Net's npz holds
CASES_AT_ONCE = 4  # cases converted at a time: each holds its whole (regions, z, y, x) array in memory


def crop_probabilities(probabilities: np.ndarray, case: Case, *, where: str) -> np.ndarray:
    """The crop box of a case's `(R, z, y, x)` probabilities, checked: the case's shape, finite, within [0, 1].

    Raises:
        ValueError: naming `where` (the file), when the shape is not the case grid's or values are out of range.
    """
    expected = tuple(case.grid.shape_vox)
    if probabilities.ndim != 4 or tuple(probabilities.shape[1:]) != expected:
        raise ValueError(f"{where}: probabilities of shape {probabilities.shape}, expected (regions, *{expected}) "
                         f"(the case grid of {case.name})")
    z, y, x = case.offset_vox
    dz, dy, dx = case.crop_grid.shape_vox
    box = probabilities[:, z:z + dz, y:y + dy, x:x + dx]  # checked and converted: the context is never stored
    if not np.isfinite(box).all():
        raise ValueError(f"{where}: {int((~np.isfinite(box)).sum())} non-finite probabilities in the crop box")
    low, high = float(box.min()), float(box.max())
    if low < 0 or high > 1:
        raise ValueError(f"{where}: probabilities in [{low:g}, {high:g}], outside [0, 1]")
    return box


def read_npz(path: Path, classes: Sequence[str]) -> np.ndarray:
    """`(R, z, y, x)` probabilities of one nnU-Net output file, in the dtype it holds (float16 or float32).

    Raises:
        FileNotFoundError, ValueError: a missing file, no `probabilities` array, or another number of regions.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no nnU-Net probabilities (predict with --save_probabilities)")
    with np.load(path) as npz:
        if PROBABILITIES_KEY not in npz:
            raise ValueError(f"{path}: no {PROBABILITIES_KEY!r} array (holds {sorted(npz.files)})")
        probabilities = npz[PROBABILITIES_KEY]
    if probabilities.dtype not in (np.float16, np.float32, np.float64):
        raise ValueError(f"{path}: probabilities of dtype {probabilities.dtype}, expected floating point")
    if probabilities.shape[0] != len(classes):
        raise ValueError(f"{path}: {probabilities.shape[0]} regions, the dataset has {len(classes)} classes")
    return probabilities


def write_store(predictions: Path, cases: Sequence[Case], classes: Sequence[str], out: Path, *,
                provenance: Mapping[str, Any], overwrite: bool = False) -> PredictionStore:
    """A probability store of `cases` from nnU-Net's output folder `predictions` (one `<case>.npz` each).

    A test case holds only the classes it is scored on (as `cellseg predict` writes test crops); crops already in
    the store are kept (a re-run completes it).
    """
    store = PredictionStore.create(out, kind="probabilities", channels=list(classes),
                                   instance_channels=[c for c in classes if is_instance(c)],
                                   provenance={**provenance, "date": datetime.datetime.now(datetime.UTC).isoformat(
                                       timespec="seconds")}, overwrite=overwrite, resume=not overwrite and out.exists())
    def convert(case: Case) -> None:
        where = predictions / f"{case.name}.npz"
        probabilities = crop_probabilities(read_npz(where, classes), case, where=str(where))
        channels = [c for c in classes if not case.labels or c in case.labels]
        writer = store.crop_writer(case.name, case.crop_grid, channels=channels)
        for name in channels:
            writer.write(name, probabilities[list(classes).index(name)].astype(np.float16))
        writer.commit({"dataset": case.dataset, "split": "test" if case.role == "test" else "validate",
                       "source": "nnunet", "case": case.name})

    todo = [c for c in cases if c.name not in store]
    with ThreadPoolExecutor(max(1, min(CASES_AT_ONCE, len(todo)))) as pool:  # decompression releases the GIL
        for future in [pool.submit(convert, c) for c in todo]:
            future.result()
    return store
