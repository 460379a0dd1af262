"""Face records and the merge of instance ids over block faces (steps 1 and 2 of `cellseg.volume.instances`,
whose docstring states the rule and why it matches decoding in one piece).

A block's record (`OUT.zarr/.stitch/<class>/<iz>_<iy>_<ix>.npz`): `ids`, `counts`, `first` (its provisional ids,
their voxel counts in the block and the volume raster index of their first voxel); `faces` (its own local ids on
its six face planes: axis z first plane, last plane, then y, then x, flattened one after the other); `shells`
(the local ids its halo decoding gave the voxels of each existing neighbour that touch the block, a plane, a
line or one voxel, neighbours in `DIRECTIONS` order, flattened). The plane and shell shapes follow from the grid.
The lookup (`lookup.npz`): sorted provisional `keys`, their final `values`, `objects`, `links`.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Vec3i = tuple[int, int, int]
Box = tuple[slice, slice, slice]
PROVISIONAL = np.uint64(1 << 63)  # marks an id not yet relabelled; final ids are < 2**32
LOCAL_BITS = 32  # a block's local ids are the uint32 ids of `segment_instances`
MAX_BLOCKS = 2**31  # block indices fit the bits between LOCAL_BITS and the PROVISIONAL bit
MIN_OVERLAP = 0.5  # link two ids when they share at least this fraction of the smaller one's compared area
LOOKUP = "lookup.npz"
STITCH_DIR = ".stitch"


@dataclass(frozen=True)
class BlockGrid:
    """The regular grid of write blocks over a volume of `shape_vox` voxels (z, y, x; level `s0`).

    Example:
        >>> g = BlockGrid((100, 64, 64), (32, 32, 32))
        >>> g.grid_shape, g.index((1, 0, 1)), g.box((3, 1, 1))
        ((4, 2, 2), 5, (slice(96, 100, None), slice(32, 64, None), slice(32, 64, None)))
    """

    shape_vox: Vec3i
    block_vox: Vec3i

    def __post_init__(self) -> None:
        if len(self.shape_vox) != 3 or len(self.block_vox) != 3 or min(*self.shape_vox, *self.block_vox) < 1:
            raise ValueError(f"volume {self.shape_vox} and block {self.block_vox} must be 3 positive sizes (z, y, x)")
        if math.prod(self.grid_shape) > MAX_BLOCKS:
            raise ValueError(f"{math.prod(self.grid_shape)} blocks: at most {MAX_BLOCKS} (use larger blocks)")

    @property
    def grid_shape(self) -> Vec3i:
        """Blocks per axis."""
        return tuple(-(-n // b) for n, b in zip(self.shape_vox, self.block_vox, strict=True))  # type: ignore[return-value]

    def positions(self) -> Iterator[Vec3i]:
        """Every block position (iz, iy, ix), in raster order."""
        yield from np.ndindex(*self.grid_shape)  # type: ignore[misc]

    def position_of(self, offset_vox: Sequence[int]) -> Vec3i:
        """The position of the block starting at `offset_vox` (a daisy block's write ROI offset, in voxels).

        Raises:
            ValueError: the offset is not a block corner inside the volume.
        """
        pos = tuple(int(o) // b for o, b in zip(offset_vox, self.block_vox, strict=True))
        if any(int(o) % b for o, b in zip(offset_vox, self.block_vox, strict=True)) or not self.contains(pos):
            raise ValueError(f"offset {list(offset_vox)} vox is not the corner of a block of {list(self.block_vox)} "
                             f"vox inside the volume {list(self.shape_vox)}")
        return pos  # type: ignore[return-value]

    def contains(self, position: Sequence[int]) -> bool:
        return all(0 <= p < n for p, n in zip(position, self.grid_shape, strict=True))

    def index(self, position: Sequence[int]) -> int:
        """Raster index of a block (the high bits of its provisional ids)."""
        return int(np.ravel_multi_index(tuple(position), self.grid_shape))

    def box(self, position: Sequence[int], halo_vox: Sequence[int] = (0, 0, 0)) -> Box:
        """The block's voxels grown by `halo_vox` per side, clipped to the volume."""
        return tuple(slice(max(0, p * b - h), min(n, (p + 1) * b + h)) for p, b, h, n in  # type: ignore[return-value]
                     zip(position, self.block_vox, halo_vox, self.shape_vox, strict=True))


def provisional(local: np.ndarray, index: int) -> np.ndarray:
    """uint64 ids unique per block: `PROVISIONAL | index << 32 | local` (0 stays 0)."""
    ids = local.astype(np.uint64)
    nonzero = ids > 0
    ids[nonzero] |= PROVISIONAL | (np.uint64(index) << np.uint64(LOCAL_BITS))
    return ids


# --- records ----------------------------------------------------------------------------------------------

def record_path(records: Path, position: Sequence[int]) -> Path:
    return records / ("_".join(str(int(p)) for p in position) + ".npz")


DIRECTIONS: tuple[Vec3i, ...] = tuple(d for d in np.ndindex(3, 3, 3) if d != (1, 1, 1))  # offset + 1 per axis


def _shell_box(grid: BlockGrid, position: Sequence[int], d: Sequence[int]) -> Box | None:
    """The voxels of neighbour `position + d - 1` adjacent to block `position` (one plane, line or voxel)."""
    if not grid.contains([p + k - 1 for p, k in zip(position, d, strict=True)]):
        return None
    own = grid.box(position)
    return tuple(s if k == 1 else slice(s.start - 1, s.start) if k == 0 else slice(s.stop, s.stop + 1)
                 for s, k in zip(own, d, strict=True))  # type: ignore[return-value]


def _face_shapes(grid: BlockGrid, position: Sequence[int]) -> list[tuple[int, ...]]:
    """Shapes of the six face planes (axis 0 lo, hi, axis 1 lo, hi, axis 2 lo, hi) of a block."""
    shape = [s.stop - s.start for s in grid.box(position)]
    return [tuple(n for i, n in enumerate(shape) if i != axis) for axis in range(3) for _ in range(2)]


def _shell_boxes(grid: BlockGrid, position: Sequence[int]) -> dict[Vec3i, Box]:
    """The block's shell boxes (`_shell_box`) of the neighbours that exist, in `DIRECTIONS` order."""
    return {d: box for d in DIRECTIONS if (box := _shell_box(grid, position, d)) is not None}


def write_record(records: Path, grid: BlockGrid, position: Sequence[int], ids: np.ndarray, outer: Box) -> None:
    """Step 1's face record (module docstring), written to a temporary file and renamed into place. The planes
    and shells are stored as the blocks' local uint32 ids, flattened one after the other (`_load` splits them:
    their shapes follow from the grid)."""
    inner = grid.box(position)

    def local(box: Box) -> Box:
        return tuple(slice(b.start - o.start, b.stop - o.start) for b, o in zip(box, outer, strict=True))  # type: ignore[return-value]

    low = (ids & np.uint64(2**LOCAL_BITS - 1)).astype(np.uint32)
    own = low[local(inner)]
    values, first, counts = np.unique(own.ravel(), return_index=True, return_counts=True)
    zyx = np.unravel_index(first, own.shape)
    global_first = np.ravel_multi_index(tuple(z + s.start for z, s in zip(zyx, inner, strict=True)), grid.shape_vox)
    nz = values > 0
    planes = [np.take(own, index, axis=axis).ravel() for axis in range(3) for index in (0, -1)]
    shells = [low[local(box)].ravel() for box in _shell_boxes(grid, position).values()]
    records.mkdir(parents=True, exist_ok=True)
    path = record_path(records, position)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:8]}.tmp.npz")
    np.savez_compressed(tmp, ids=provisional(values[nz], grid.index(position)), counts=counts[nz].astype(np.int64),
                        first=np.asarray(global_first, np.int64)[nz], faces=np.concatenate(planes),
                        shells=np.concatenate(shells) if shells else np.zeros(0, np.uint32))
    tmp.replace(path)


def _load(records: Path, grid: BlockGrid, position: Sequence[int], *, heads: bool = False) -> dict[str, Any]:
    """A block's record: `ids`, `counts`, `first`; unless `heads`, also `faces` ((axis, 0 | -1) → plane) and
    `shells` (direction → box), as provisional uint64 ids."""
    path = record_path(records, position)
    try:
        with np.load(path) as npz:
            record: dict[str, Any] = {k: npz[k] for k in (("ids", "counts", "first") if heads else npz.files)}
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{path}: no face record for block {list(position)} (its decode step did not "
                                "finish; run it again)") from err
    if heads:
        return record
    index = grid.index(position)
    shapes = _face_shapes(grid, position)
    parts = np.split(provisional(record["faces"], index), np.cumsum([math.prod(s) for s in shapes])[:-1])
    record["faces"] = {(axis, side): parts[2 * axis + i].reshape(shapes[2 * axis + i])
                       for axis in range(3) for i, side in enumerate((0, -1))}
    boxes = _shell_boxes(grid, position)
    sizes = [math.prod(s.stop - s.start for s in box) for box in boxes.values()]
    shells = np.split(provisional(record["shells"], index), np.cumsum(sizes)[:-1]) if boxes else []
    record["shells"] = {d: part.reshape([s.stop - s.start for s in box])
                        for (d, box), part in zip(boxes.items(), shells, strict=True)}
    return record


def _neighbour_face(record: dict[str, Any], d: Sequence[int]) -> np.ndarray:
    """The labels of neighbour B (at `d - 1` from A) on its voxels adjacent to A, shaped as A's shell box."""
    first = next(a for a in range(3) if d[a] != 1)
    plane = record["faces"][(first, 0 if d[first] == 2 else -1)]
    index = tuple(slice(None) if d[a] == 1 else slice(0, 1) if d[a] == 2 else slice(-1, None)
                  for a in range(3) if a != first)
    return np.expand_dims(plane[index], first)


def face_links(shell: np.ndarray, face: np.ndarray, min_overlap: float = MIN_OVERLAP
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidate links over one face: every pair (a, b) of ids that overlap, counted over the voxels both arrays
    label (`shell`: A's decoding, `face`: B's own labels), whose overlap reaches `min_overlap` of the smaller
    of their two areas there. Returns the pairs (2, n) uint64, their overlaps (n,) and whether each is strong:
    the overlap also reaches `min_overlap` of the larger area (each is the other's majority)."""
    a, b = shell.ravel(), face.ravel()
    both = (a > 0) & (b > 0)
    ua, ia, area_a = np.unique(a[both], return_inverse=True, return_counts=True)
    ub, ib, area_b = np.unique(b[both], return_inverse=True, return_counts=True)
    width = max(len(ub), 1)
    codes, overlap = np.unique(ia.astype(np.int64) * width + ib, return_counts=True)
    pa, pb = codes // width, codes % width
    keep = overlap >= min_overlap * np.minimum(area_a[pa], area_b[pb])
    strong = overlap >= min_overlap * np.maximum(area_a[pa], area_b[pb])
    return np.stack([ua[pa[keep]], ub[pb[keep]]]), overlap[keep], strong[keep]


def chosen_links(pairs: np.ndarray, overlap: np.ndarray, strong: np.ndarray) -> np.ndarray:
    """The links the merge makes (module docstring of `cellseg.volume.instances`): every strong link, and for each
    id without any strong link, its candidate link of largest overlap."""
    linked = np.unique(pairs[:, strong])
    ends = np.concatenate([pairs[0], pairs[1]])
    order = np.concatenate([overlap, overlap])
    index = np.concatenate([np.arange(pairs.shape[1])] * 2)
    weak = ~strong[index] & ~np.isin(ends, linked)
    ends, order, index = ends[weak], order[weak], index[weak]
    best = np.lexsort((-order, ends))  # by id, largest overlap first
    first = best[np.r_[True, ends[best][1:] != ends[best][:-1]]] if best.size else best
    return np.concatenate([pairs[:, strong], pairs[:, index[first]]], axis=1)


@dataclass(frozen=True)
class Lookup:
    """Provisional id → final id (0: an object below the class's minimum size), from `merge_faces`."""

    keys: np.ndarray  # sorted provisional ids, uint64
    values: np.ndarray  # their final ids, uint64 (1..objects, or 0)
    objects: int
    source: str = ""

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        """`ids` with every provisional id replaced (final ids and 0 unchanged).

        Raises:
            ValueError: a provisional id the lookup does not hold (a block decoded again after the merge).
        """
        out = ids.copy()
        todo = (ids & PROVISIONAL) != 0
        values = ids[todo]
        at = np.minimum(np.searchsorted(self.keys, values), max(len(self.keys) - 1, 0))
        if values.size and (not len(self.keys) or not np.array_equal(self.keys[at], values)):
            raise ValueError(f"{self.source or 'lookup'}: provisional ids missing from the lookup; a block was "
                             "decoded after the merge (run the merge again)")
        out[todo] = self.values[at]
        return out


def merge_faces(records: str | os.PathLike[str], grid: BlockGrid, *, min_size_voxels: int = 0,
                min_overlap: float = MIN_OVERLAP) -> Lookup:
    """Step 2: link the ids of every block with those of its 26 neighbours over their shared faces, join linked
    ids with a union-find, drop objects below `min_size_voxels`, number the rest 1..N in raster order of their
    first voxel, and write the lookup (`records/lookup.npz`, atomically). One process; memory: the ids of all
    blocks plus the records of about two z-layers of blocks.

    Raises:
        FileNotFoundError: a block without a face record (its decode step did not finish).
        ValueError: more than 2³² - 1 objects.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    records = Path(records)
    _, gy, gx = grid.grid_shape
    heads = [_load(records, grid, p, heads=True) for p in grid.positions()]
    ids = np.concatenate([h["ids"] for h in heads]) if heads else np.zeros(0, np.uint64)
    counts = np.concatenate([h["counts"] for h in heads]).astype(np.int64)
    first = np.concatenate([h["first"] for h in heads]).astype(np.int64)
    del heads
    order = np.argsort(ids, kind="stable")
    ids, counts, first = ids[order], counts[order], first[order]
    window = gy * gx + gx + 1  # a block's neighbours lie within this many raster indices of it
    loaded: dict[int, dict[str, Any]] = {}

    def load(position: Sequence[int]) -> dict[str, Any]:
        index = grid.index(position)
        if index not in loaded:
            loaded[index] = _load(records, grid, position)
        return loaded[index]

    edges = []
    for pos in grid.positions():
        for old in [i for i in loaded if i < grid.index(pos) - window]:
            del loaded[old]
        for d, shell in load(pos)["shells"].items():
            if shell.any():
                neighbour = load(tuple(p + k - 1 for p, k in zip(pos, d, strict=True)))
                pairs, overlap, strong = face_links(shell, _neighbour_face(neighbour, d), min_overlap)
                plane = sum(k != 1 for k in d) == 1  # an edge's line or a corner's voxel: too few voxels to be sure
                edges.append((pairs, overlap, strong & plane))
    pairs = chosen_links(*(np.concatenate(e, axis=-1) for e in zip(*edges, strict=True))) if edges else np.zeros((2, 0), np.uint64)
    extra = np.setdiff1d(pairs, ids)  # ids a halo decoded that the block itself does not hold: no voxels
    if extra.size:
        ids = np.concatenate([ids, extra])
        counts = np.concatenate([counts, np.zeros(extra.size, np.int64)])
        first = np.concatenate([first, np.full(extra.size, np.iinfo(np.int64).max, np.int64)])
        order = np.argsort(ids, kind="stable")
        ids, counts, first = ids[order], counts[order], first[order]
    at = np.searchsorted(ids, pairs)
    n = len(ids)
    graph = coo_matrix((np.ones(at.shape[1], np.int8), (at[0], at[1])), shape=(n, n))
    num, comp = connected_components(graph, directed=False)
    size = np.zeros(num, np.int64)
    np.add.at(size, comp, counts)
    start = np.full(num, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(start, comp, first)
    kept = np.flatnonzero(size >= max(1, int(min_size_voxels)))
    if len(kept) >= 2**32:
        raise ValueError(f"{records}: {len(kept)} objects do not fit 32-bit ids")
    final = np.zeros(num, np.uint64)
    final[kept[np.argsort(start[kept], kind="stable")]] = np.arange(1, len(kept) + 1, dtype=np.uint64)
    lookup = Lookup(keys=ids, values=final[comp], objects=len(kept), source=str(records / LOOKUP))
    tmp = records / f".lookup.{uuid.uuid4().hex[:8]}.tmp.npz"
    np.savez(tmp, keys=lookup.keys, values=lookup.values, objects=np.int64(lookup.objects),
             links=np.int64(pairs.shape[1]))
    tmp.replace(records / LOOKUP)
    return lookup


def load_lookup(records: str | os.PathLike[str]) -> Lookup:
    """The lookup `merge_faces` wrote.

    Raises:
        FileNotFoundError: no lookup (the merge has not run).
    """
    path = Path(records) / LOOKUP
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no lookup; the merge step has not run")
    with np.load(path) as npz:
        return Lookup(keys=npz["keys"], values=npz["values"], objects=int(npz["objects"]), source=str(path))


