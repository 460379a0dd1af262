"""One crop written column by column into a prediction store, resumably: the loop shared by `cellseg predict`
(one model, `cellseg.infer.predict`) and `cellseg predict-ensemble` (the members' mean, `cellseg.infer.fused`).

Each column (or block, `cellseg.infer.crop_plan.CropPlan`) is a stream of slabs along z from its caller. The slabs
are regrouped into pieces that end on whole store chunks (`chunked_slabs`), and each piece is written and then
marked done as "<block id>:<planes written>". A writer reopened with the same key after a killed run reads the
marks back (`resume_planes`): finished columns are skipped and a partly written one restarts after its last
written plane. A non-streamed block (a 2D model sliced across z, y and x) is one slab, written whole.

Shapes: `K` channels, `dz` planes, `Y, X` a column's grid.
"""

from __future__ import annotations

import datetime
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from cellseg.data.grid import Grid
from cellseg.data.prediction_store import CropWriter
from cellseg.infer.crop_plan import CropPlan
from cellseg.infer.selection import CropTarget
from cellseg.infer.tiling import sub_grid

log = logging.getLogger(__name__)

# (the column's grid, first plane to yield, progress callback taking a number of tiles) → (z0, (K, dz, Y, X))
SlabsOf = Callable[[Grid, int, Callable[[int], None]], Iterator[tuple[int, np.ndarray]]]
# (a column's shape (z, y, x), first plane) → tiles the column runs from that plane (the progress bar's total)
TilesOf = Callable[[Sequence[int], int], int]


def block_id(offset: Sequence[int]) -> str:
    """A column's (or block's) name in the resume marks: its voxel offset (z, y, x) joined by "_"."""
    return "_".join(str(o) for o in offset)


def resume_planes(done: Iterable[str]) -> dict[str, int]:
    """Block id → planes already written (the marks `write_columns` leaves: "<block id>:<planes>")."""
    planes: dict[str, int] = {}
    for unit in done:
        block, _, z = unit.rpartition(":")
        if block and z.isdigit():
            planes[block] = max(planes.get(block, 0), int(z))
    return planes


def chunked_slabs(slabs: Iterator[tuple[int, np.ndarray]], depth: int, flush: int, start: int
                  ) -> Iterator[tuple[int, np.ndarray]]:
    """Regroup slabs (offset, (K, dz, Y, X)) along z into pieces ending on multiples of `flush` (or at `depth`),
    so that every write but the last covers whole store chunks and marks a point to resume from."""
    pending: list[np.ndarray] = []
    begin = end = start
    for z0, slab in slabs:
        if z0 != end:
            raise AssertionError(f"slab at plane {z0}, expected {end}")  # predict_slabs yields planes in order
        pending.append(slab)
        end += slab.shape[1]
        cut = end if end == depth else end - end % flush
        if cut > begin:
            joined = np.concatenate(pending, axis=1) if len(pending) > 1 else pending[0]
            yield begin, joined[:, :cut - begin]
            pending, begin = ([joined[:, cut - begin:]] if end > cut else []), cut


def write_columns(writer: CropWriter, plan: CropPlan, slabs_of: SlabsOf, *, tiles_of: TilesOf, progress: bool,
                  encode: Callable[[np.ndarray], np.ndarray] | None = None) -> int:
    """Write every column of `plan` not yet done into `writer`'s channels (in order: row k of a slab is
    `writer.channels[k]`), each from where an earlier writer of the crop stopped; returns the tiles run.

    Args:
        slabs_of: the slabs of one column from a plane on (its callback counts tiles for the progress bar).
        tiles_of: the tiles a column runs from a plane on (the progress bar's total).
        progress: show a tile progress bar.
        encode: applied to each channel's planes before writing (e.g. `cellseg.data.prediction_store.quantise`).
    """
    from tqdm import tqdm

    resume = resume_planes(writer.done)
    todo = [(o, n, resume.get(block_id(o), 0)) for o, n in plan.blocks if resume.get(block_id(o), 0) < n[0]]
    if len(todo) < len(plan.blocks) or any(z for *_, z in todo):
        log.info("%s: resuming, %d of %d %s already written, %d partly", writer.crop, len(plan.blocks) - len(todo),
                 len(plan.blocks), "columns" if plan.streamed else "blocks", sum(1 for *_, z in todo if z))
    num_tiles = sum(tiles_of(shape, z) for _, shape, z in todo)
    with tqdm(total=num_tiles, desc=writer.crop, unit="tile", leave=False, disable=not progress) as bar:
        for offset, shape, z_done in todo:
            slabs = slabs_of(sub_grid(writer.grid, offset, shape), z_done, bar.update)
            for z0, planes in chunked_slabs(slabs, shape[0], plan.flush, z_done):
                arrays = {c: encode(planes[k]) if encode else planes[k] for k, c in enumerate(writer.channels)}
                writer.write_all(arrays, (offset[0] + z0, offset[1], offset[2]))
                writer.mark_done(f"{block_id(offset)}:{z0 + planes.shape[1]}")
    return num_tiles


def commit_crop(target: CropTarget, writer: CropWriter, plan: CropPlan, *, tiles: int, tta: int, started: float,
                rank: int, attrs: Mapping[str, Any], summary: Mapping[str, Any], detail: str = ""
                ) -> dict[str, Any]:
    """Rename the written crop into place with its attributes; returns its summary, whose "line" is printed.

    Args:
        tiles: the tiles `write_columns` ran; `tta`: the transforms each ran under.
        started: `time.perf_counter()` when the crop began.
        attrs: the caller's own crop attributes, besides the common ones (where it came from, how it was cut,
            time, rank).
        summary: the caller's own summary entries.
        detail: text before the tile count in the line (e.g. "3 members, ").
    """
    grid = writer.grid
    seconds = time.perf_counter() - started
    mvox = math.prod(grid.shape_vox) / 1e6
    writer.commit({"dataset": target.dataset, "split": target.split, "em_url": target.em_url,
                   "block_vox": plan.edge, "streamed": plan.streamed, "num_channels": len(writer.channels),
                   "blocks": len(plan.blocks), "tiles": tiles, **attrs, "seconds": round(seconds, 3),
                   "mvox_per_s": round(mvox / seconds, 4), "rank": rank,
                   "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")})
    kind = f"column(s) of ≤ {plan.edge}² in y, x" if plan.streamed else f"block(s) of ≤ {plan.edge}³"
    line = (f"{target.name} ({target.dataset}, {target.split}): {'×'.join(map(str, grid.shape_vox))} vox at "
            f"{'×'.join(f'{v:g}' for v in grid.voxel_size_nm)} nm, {len(plan.blocks)} {kind}, "
            f"{detail}{tiles} tiles × {tta} TTA, {seconds:.1f} s, {mvox / seconds:.3g} Mvox/s")
    return {"crop": target.name, "shape_vox": list(grid.shape_vox), "seconds": seconds, "tiles": tiles, **summary,
            "mvox_per_s": mvox / seconds, "blocks": len(plan.blocks), "block_vox": plan.edge, "line": line}
