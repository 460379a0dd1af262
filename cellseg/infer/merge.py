"""Per-class merge of prediction stores: class c (with its boundary channel) copied from the store chosen for it.

The stores must be of one kind (e.g. an ensemble with and without test-time augmentation, a uniform ensemble
and one of its members, or a post-processed segmentation and the plain decoding of its probabilities), and each
must hold the channels taken from it (in any order; the merged store has the first store's channels). Each channel is
copied as stored, file by file (`s0`: same dtype, chunks and grid; a channel on its own grid keeps it), so a class
of the merged store is bit for bit its source's. The merged store's provenance is the first store's, plus "merged": the
source of every channel; a re-run with the same sources resumes the crops not yet written.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cellseg.data.prediction_store import BOUNDARY_SUFFIX, WRITE_THREADS, PredictionStore
from cellseg.pool import usable_cores

log = logging.getLogger(__name__)


def _check(stores: Sequence[PredictionStore], pick: Mapping[str, int]) -> None:
    if not stores:
        raise ValueError("merge_classes: no stores given")
    first = stores[0]
    for store in stores[1:]:
        if store.kind != first.kind:
            raise ValueError(f"cannot merge {store.path} ({store.kind}) with {first.path} ({first.kind}): they must "
                             "hold the same kind")
    unknown = sorted(set(pick) - set(first.classes))
    if unknown:
        raise ValueError(f"merge_classes: classes {unknown} are not classes of {first.path} ({list(first.classes)})")
    bad = {c: i for c, i in pick.items() if not 0 <= i < len(stores)}
    if bad:
        raise ValueError(f"merge_classes: store indices {bad} are not among the {len(stores)} stores")
    for i, store in enumerate(stores[1:], start=1):
        taken = [ch for ch in first.channels if pick.get(ch.removesuffix(BOUNDARY_SUFFIX), 0) == i]
        missing = [ch for ch in taken if ch not in store.channels]
        if missing:
            raise ValueError(f"cannot merge {store.path} into {first.path}'s channels: it lacks {missing} (it holds "
                             f"{list(store.channels)})")


def merge_classes(stores: Sequence[PredictionStore], pick: Mapping[str, int], out: str | os.PathLike[str], *,
                  crops: Sequence[str] | None = None) -> PredictionStore:
    """A store whose class c comes from `stores[pick[c]]` (from `stores[0]` for classes `pick` leaves out).

    Args:
        stores: stores of one kind, each holding the channels taken from it.
        pick: class → index into `stores`; a boundary channel follows its class.
        out: the merged store (resumed when it exists and records the same sources).
        crops: crops to write (default: those in every store).

    Raises:
        ValueError: stores of other kinds, a store lacking a channel taken from it, an unknown class or index,
            a crop missing from a store, or `out` holding a merge of other sources.
    """
    _check(stores, pick)
    first = stores[0]
    source = {ch: stores[pick.get(ch.removesuffix(BOUNDARY_SUFFIX), 0)] for ch in first.channels}
    merged = {ch: str(s.path) for ch, s in source.items()}
    names = list(crops) if crops is not None else [c for c in first.completed() if all(c in s for s in stores)]
    lacking = {str(s.path): [c for c in names if c not in s] for s in source.values()}
    lacking = {path: missing for path, missing in lacking.items() if missing}
    if lacking:
        raise ValueError(f"merge_classes: crops missing from the stores: {lacking}")
    out = Path(out)
    if out.exists():
        recorded = PredictionStore.open(out).provenance.get("merged")
        if recorded != merged:
            raise ValueError(f"{out}: a merge of {recorded}, not of {merged}; remove it or choose another path")
    store = PredictionStore.create(out, kind=first.kind, channels=first.channels,
                                   instance_channels=first.instance_channels,
                                   provenance={**first.provenance, "merged": merged}, resume=out.exists())
    for crop in [c for c in names if c not in store]:
        _copy_crop(crop, source, store)
    log.info("%s: %d crops, classes from %s", out, len(names),
             {c: str(source[c].path) for c in first.classes if source[c] is not first} or "the first store only")
    return store


def _copy_crop(crop: str, source: Mapping[str, PredictionStore], out: PredictionStore) -> None:
    channels = [ch for ch in out.channels if ch in source[ch].crop_channels(crop)]
    base = source[channels[0]].grid(crop)
    grids = {ch: source[ch].grid(crop, ch) for ch in channels}
    attrs: dict[str, Any] = {k: v for k, v in source[channels[0]].crop_attrs(crop).items()
                             if k not in ("grid", "channels", "channel_grids")}
    writer = out.crop_writer(crop, base, channels=channels, grids=grids)
    with ThreadPoolExecutor(min(len(channels), usable_cores(), WRITE_THREADS)) as pool:  # file copies: I/O bound
        list(pool.map(lambda ch: writer.copy(ch, source[ch], crop), channels))
    writer.commit({**attrs, "merged": {ch: str(source[ch].path) for ch in channels}})
