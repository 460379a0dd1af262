"""Planning `cellseg fetch`: which zarr arrays and levels, and which chunk keys, the selected crops need.

The crops come from `select.select_targets`; test crops get EM only (their ground truth is hidden).

EM levels (the default of the challenge's `csc fetch-data`)
    `matched`: every EM level whose voxel size is > 0.8 × the crop's ground-truth voxel size on every axis
    (the finest over the selected classes), i.e. the annotation resolution and everything coarser, or the
    coarsest level when none qualifies. `all`: every level. A voxel size in nm (e.g. `8`): the levels matched
    to that size or to the crop's, whichever is finer on each axis: what a model trained at that size needs
    to predict a coarser crop (a routed ensemble's 8 nm members on a 16 nm test crop: `--em-levels 8`).

Chunks
    Only chunks overlapping the crop box plus `padding_vox` voxels *of that level* on each side are
    planned. Keys come from `.zarray` (`shape`, `chunks`, `dimension_separator`) and the level's OME-NGFF
    scale and translation, never from listing the bucket (anonymous S3 cannot list). World convention
    (z, y, x; nm): voxel i of a level covers `translation + (i ± 0.5) · voxel_size`. Label arrays are
    small (a crop, not a cell), so every chunk of every level of each selected class is planned and the
    fetched label pyramid is complete.

Layout
    Destinations mirror the source from `<dataset>/<name>.zarr` on: the EM of
    `s3://bucket/jrc_hela-2/jrc_hela-2.zarr/recon-1/em/fibsem-uint8` lands in
    `DEST/jrc_hela-2/jrc_hela-2.zarr/recon-1/em/fibsem-uint8`. The metadata of every node on the path
    (`.zgroup`/`.zattrs` of groups, `.zarray`/`.zattrs` of arrays) is part of the plan, so the result
    opens with zarr and `MultiscaleImage`. A group without `.zgroup` at the source gets a synthesised one.

Metadata is read from DEST when an earlier run mirrored it (a node is complete once its marker,
`.zgroup` or `.zarray`, exists locally: markers are written last), so a resumed fetch does not re-read
thousands of small files; `refresh_metadata=True` reads everything from the source again.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cellseg.data.chunks import chunk_keys, read_ledger
from cellseg.data.crops import Catalog
from cellseg.data.ngff import LevelMeta, parse_multiscales
from cellseg.data.stores import Location
from cellseg.fetch.select import Target

log = logging.getLogger(__name__)

EM_LEVEL_FACTOR = 0.8  # an EM level is "matched" when coarser than this fraction of the GT voxel size
GRID_EPS_VOX = 1e-3  # overlaps thinner than this fraction of a voxel are float noise, not overlap
GROUP_MARKER, ARRAY_MARKER, ATTRS = ".zgroup", ".zarray", ".zattrs"
EM_LEVEL_CHOICES = ("matched", "all")


@dataclass(frozen=True, kw_only=True)
class ArrayFetch:
    """The chunks of one zarr array (one level of an EM or label group) needed for one crop.

    Attributes:
        dataset, crop_id: the crop this is for (EM chunks may be shared with other crops).
        group: "em" or the label class name.
        level: the level's path, e.g. "s0".
        source: the array's location.
        rel_path: the array's directory under DEST (POSIX separators).
        keys: chunk keys, as file names relative to the array directory.
    """

    dataset: str
    crop_id: int
    group: str
    level: str
    source: Location
    rel_path: str
    keys: tuple[str, ...]


Chunk = tuple[ArrayFetch, str]  # an array and one of its chunk keys


@dataclass(frozen=True)
class MetaFile:
    """A metadata file to mirror: its path under DEST and its content."""

    rel_path: str
    data: bytes


@dataclass(frozen=True, kw_only=True)
class FetchPlan:
    """Everything `execute` downloads and `estimate` sizes.

    Attributes:
        targets: the selected crops.
        arrays: chunk lists, EM first, in target order.
        metadata: metadata files read from the source (parents before children; markers last).
        missing_labels: (crop id, class) pairs listed in the catalogue but absent at the source.
    """

    targets: tuple[Target, ...]
    arrays: tuple[ArrayFetch, ...]
    metadata: tuple[MetaFile, ...]
    missing_labels: tuple[tuple[int, str], ...] = ()


# ------------------------------------------------------------------------------------------------ geometry


def overlapping_range(start_nm: float, stop_nm: float, *, voxel_size_nm: float, translation_nm: float,
                      size_vox: int, padding_vox: int = 0) -> tuple[int, int]:
    """The half-open index range of one axis whose voxels overlap `[start_nm, stop_nm)`, widened by
    `padding_vox` on both sides and clipped to `[0, size_vox)` (empty when `hi <= lo`)."""
    # Voxel i spans translation + (i - 0.5, i + 0.5) * voxel_size; it overlaps when its upper edge lies
    # above start and its lower edge below stop (by more than GRID_EPS_VOX of a voxel).
    lo = math.floor((start_nm - translation_nm) / voxel_size_nm - 0.5 + GRID_EPS_VOX) + 1
    hi = math.ceil((stop_nm - translation_nm) / voxel_size_nm + 0.5 - GRID_EPS_VOX)
    return max(0, lo - padding_vox), min(size_vox, hi + padding_vox)


def relative_path(location: Location, dataset: str) -> str:
    """`<dataset>/<name>.zarr/...`: where a source node goes under DEST.

    Raises:
        ValueError: when the location has no `*.zarr` component.
    """
    path = urllib.parse.urlparse(location.url).path if location.kind == "http" else location.url
    parts = [urllib.parse.unquote(p) for p in path.split("/")]
    for i, part in enumerate(parts):
        if part.endswith(".zarr"):
            return "/".join([dataset, *parts[i:]])
    raise ValueError(f"{location}: no '<name>.zarr' component in the path; cannot place it under the destination")


@dataclass(frozen=True)
class ArrayMeta:
    """The parts of a zarr v2 `.zarray` that locate chunks."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    separator: str

    @classmethod
    def parse(cls, raw: bytes, *, source: str) -> ArrayMeta:
        """Parse `.zarray` bytes.

        Raises:
            ValueError: invalid JSON, not zarr v2, or not 3D.
        """
        try:
            meta = json.loads(raw)
            shape, chunks = tuple(meta["shape"]), tuple(meta["chunks"])
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{source}/.zarray: not a valid zarr v2 array description ({err})") from None
        if meta.get("zarr_format") != 2 or len(shape) != 3 or len(chunks) != 3:
            raise ValueError(f"{source}/.zarray: expected a 3D zarr v2 array, got format "
                             f"{meta.get('zarr_format')} shape {list(shape)}")
        return cls(tuple(map(int, shape)), tuple(map(int, chunks)), meta.get("dimension_separator") or ".")


@dataclass(frozen=True)
class LevelInfo:
    """One level of a multiscale group: OME-NGFF geometry, array layout and where it lives."""

    meta: LevelMeta
    array: ArrayMeta
    source: Location
    rel_path: str


def choose_em_levels(levels: Sequence[LevelInfo], gt_voxel_size_nm: Sequence[float],
                     mode: str = "matched") -> list[LevelInfo]:
    """EM levels to fetch for a crop annotated at `gt_voxel_size_nm` (see the module docstring).

    Raises:
        ValueError: for a mode other than "matched", "all" or a positive voxel size in nm.
    """
    model_nm = em_level_mode(mode)
    if mode == "all":
        return list(levels)
    wanted = [min(g, model_nm) for g in gt_voxel_size_nm] if model_nm else list(gt_voxel_size_nm)
    matched = [lv for lv in levels if all(v > EM_LEVEL_FACTOR * g for v, g in
                                          zip(lv.meta.voxel_size_nm, wanted, strict=True))]
    return matched or [levels[-1]]


def em_level_mode(mode: str) -> float | None:
    """The voxel size (nm) of an `--em-levels NM` mode, None for "matched" and "all".

    Raises:
        ValueError: neither a known mode nor a positive number.
    """
    if mode in EM_LEVEL_CHOICES:
        return None
    try:
        nm = float(mode)
    except ValueError:
        nm = math.nan
    if not (math.isfinite(nm) and nm > 0):
        raise ValueError(f"em_levels must be one of {EM_LEVEL_CHOICES} or a voxel size in nm (e.g. 8), got {mode!r}")
    return nm


# ------------------------------------------------------------------------------------------------ metadata


class MetadataReader:
    """Reads the metadata of zarr nodes, from DEST when mirrored before, else from the source (thread-safe)."""

    def __init__(self, dest: Path | None, *, refresh: bool = False):
        self._dest, self._refresh = dest, refresh
        self._lock = threading.Lock()
        self._nodes: dict[str, dict[str, bytes] | None] = {}
        self._fetched: dict[str, dict[str, bytes]] = {}

    def node(self, source: Location, rel_dir: str, *, marker: str, always_group: bool = False,
             need_attrs: bool = False) -> dict[str, bytes] | None:
        """`{".zattrs": ..., marker: ...}` of one node, or None when the node is absent at the source.

        A group that has `.zattrs` but no `.zgroup` (or any group when `always_group`) gets a
        synthesised `.zgroup`, so that zarr can open the mirrored hierarchy. With `need_attrs`, a local
        copy without `.zattrs` is not trusted (a multiscale group needs its `multiscales`).
        """
        with self._lock:
            if rel_dir in self._nodes:
                return self._nodes[rel_dir]
        files = self._read_local(rel_dir, marker)
        if files is not None and need_attrs and ATTRS not in files:
            files = None
        if files is None:
            files = {name: data for name in (ATTRS, marker) if (data := source.read_bytes(name)) is not None}
            if marker == GROUP_MARKER and marker not in files and (always_group or ATTRS in files):
                files[marker] = json.dumps({"zarr_format": 2}).encode()
            if marker not in files:
                files = None
            elif files:
                with self._lock:
                    self._fetched[rel_dir] = files
        with self._lock:
            self._nodes[rel_dir] = files
        return files

    def _read_local(self, rel_dir: str, marker: str) -> dict[str, bytes] | None:
        if self._dest is None or self._refresh or not (self._dest / rel_dir / marker).is_file():
            return None
        return {name: (self._dest / rel_dir / name).read_bytes()
                for name in (ATTRS, marker) if (self._dest / rel_dir / name).is_file()}

    def fetched(self) -> tuple[MetaFile, ...]:
        """Files read from the source, parents first and each node's marker last."""
        with self._lock:
            nodes = sorted(self._fetched.items())
        return tuple(MetaFile(f"{rel}/{name}", files[name]) for rel, files in nodes
                     for name in sorted(files, key=lambda n: n in (GROUP_MARKER, ARRAY_MARKER)))


def _parent(location: Location) -> Location:
    return Location(location.kind, location.url.rsplit("/", 1)[0])


def open_multiscale(reader: MetadataReader, source: Location, rel_dir: str) -> list[LevelInfo] | None:
    """Levels of the multiscale group at `source` (and its ancestors' metadata), or None when absent.

    Raises:
        ValueError: malformed `.zattrs`/`.zarray`.
        FileNotFoundError: a level named in `.zattrs` has no `.zarray`.
    """
    chain, loc, rel = [], source, rel_dir
    while not rel.rsplit("/", 1)[-1].endswith(".zarr") and "/" in rel:
        loc, rel = _parent(loc), rel.rsplit("/", 1)[0]
        chain.append((loc, rel))
    for loc, rel in reversed(chain):
        reader.node(loc, rel, marker=GROUP_MARKER, always_group=True)
    files = reader.node(source, rel_dir, marker=GROUP_MARKER, need_attrs=True)
    if files is None or ATTRS not in files:
        return None
    try:
        attrs = json.loads(files[ATTRS])
    except ValueError as err:
        raise ValueError(f"{source}/.zattrs: not valid JSON ({err})") from None
    levels = []
    for meta in parse_multiscales(attrs, source=str(source)):
        array_files = reader.node(source.join(meta.path), f"{rel_dir}/{meta.path}", marker=ARRAY_MARKER)
        if array_files is None:
            raise FileNotFoundError(f"{source.join(meta.path)}: level listed in .zattrs has no .zarray")
        array = ArrayMeta.parse(array_files[ARRAY_MARKER], source=str(source.join(meta.path)))
        levels.append(LevelInfo(meta, array, source.join(meta.path), f"{rel_dir}/{meta.path}"))
    return levels


# ---------------------------------------------------------------------------------------------------- plan


def _em_fetches(target: Target, levels: Sequence[LevelInfo], *, padding_vox: int, em_levels: str
                ) -> list[ArrayFetch]:
    start, stop = target.box_nm()
    out = []
    for lv in choose_em_levels(levels, target.gt_voxel_size_nm, em_levels):
        ranges = [overlapping_range(start[a], stop[a], voxel_size_nm=lv.meta.voxel_size_nm[a],
                                    translation_nm=lv.meta.translation_nm[a], size_vox=lv.array.shape[a],
                                    padding_vox=padding_vox) for a in range(3)]
        keys = chunk_keys(ranges, chunks=lv.array.chunks, separator=lv.array.separator)
        if not keys:
            log.warning("%s lies outside EM level %s (%s); nothing to fetch there", target.crop.name,
                        lv.meta.path, lv.source)
            continue
        out.append(ArrayFetch(dataset=target.crop.dataset, crop_id=target.crop.id, group="em",
                              level=lv.meta.path, source=lv.source, rel_path=lv.rel_path, keys=keys))
    return out


def _label_fetches(target: Target, name: str, levels: Sequence[LevelInfo]) -> list[ArrayFetch]:
    return [ArrayFetch(dataset=target.crop.dataset, crop_id=target.crop.id, group=name, level=lv.meta.path,
                       source=lv.source, rel_path=lv.rel_path,
                       keys=chunk_keys([(0, n) for n in lv.array.shape], chunks=lv.array.chunks,
                                       separator=lv.array.separator))
            for lv in levels]


def build_plan(catalog: Catalog, targets: Sequence[Target], *, dest: Path | None = None, padding_vox: int = 64,
               em_levels: str = "matched", labels: bool = True, refresh_metadata: bool = False,
               workers: int = 16) -> FetchPlan:
    """Read the metadata the targets need (in parallel) and list every chunk to fetch.

    Args:
        catalog: resolves the targets' relative URLs.
        targets: from `select_targets`.
        dest: the destination root; metadata mirrored there by an earlier run is reused.
        padding_vox: EM voxels added around each crop box at every level.
        em_levels: "matched", "all" or a voxel size in nm (module docstring).
        labels: plan the label arrays of training crops.
        refresh_metadata: read metadata from the source even when DEST has it.
        workers: parallel metadata reads.

    Raises:
        ValueError: negative padding, unknown em_levels, malformed metadata.
        FileNotFoundError: a dataset has no EM multiscale group at its URL.
        OSError: the source cannot be read.
    """
    if padding_vox < 0:
        raise ValueError(f"padding_vox must be >= 0, got {padding_vox}")
    em_level_mode(em_levels)  # a ValueError before any reading
    reader = MetadataReader(dest, refresh=refresh_metadata)
    em_of: dict[int, str] = {}
    em_futures: dict[str, tuple[Location, Future[list[LevelInfo] | None]]] = {}
    label_futures: list[tuple[Target, str, Future[list[LevelInfo] | None]]] = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for t in targets:
            source = catalog.locate(t.em_url)
            rel = em_of[t.crop.id] = relative_path(source, t.crop.dataset)
            if rel not in em_futures:
                em_futures[rel] = (source, pool.submit(open_multiscale, reader, source, rel))
            if labels and t.split == "train":
                crop_source = catalog.locate(t.crop_url)
                crop_rel = relative_path(crop_source, t.crop.dataset)
                label_futures += [(t, name, pool.submit(open_multiscale, reader, crop_source.join(name),
                                                        f"{crop_rel}/{name}")) for name in t.classes]
        arrays: list[ArrayFetch] = []
        for t in targets:
            source, future = em_futures[em_of[t.crop.id]]
            levels = future.result()
            if levels is None:
                raise FileNotFoundError(f"{source}: no EM multiscale group (.zattrs) for {t.crop.dataset}")
            arrays += _em_fetches(t, levels, padding_vox=padding_vox, em_levels=em_levels)
        missing = []
        for t, name, future in label_futures:
            label_levels = future.result()
            if label_levels is None:
                log.warning("%s/%s is listed in the catalogue but absent at the source; skipped",
                            t.crop.name, name)
                missing.append((t.crop.id, name))
                continue
            arrays += _label_fetches(t, name, label_levels)
    return FetchPlan(targets=tuple(targets), arrays=tuple(arrays), metadata=reader.fetched(),
                     missing_labels=tuple(missing))


# ------------------------------------------------------------------------------------------------- pending


@dataclass(frozen=True)
class Pending:
    """The distinct chunks of a plan that still need a request."""

    chunks: tuple[Chunk, ...]
    num_present: int  # already downloaded
    num_known_absent: int  # recorded as absent at the source by an earlier run


def pending_chunks(plan: FetchPlan, dest: Path | None, *, recheck_absent: bool = False) -> Pending:
    """Distinct (array, key) pairs of `plan` not yet in `dest` nor known to be absent."""
    seen: set[tuple[str, str]] = set()
    chunks, present, absent = [], 0, 0
    ledgers: dict[str, set[str]] = {}
    for array in plan.arrays:
        array_dir = dest / array.rel_path if dest is not None else None
        if array_dir is not None and array.rel_path not in ledgers:
            ledgers[array.rel_path] = set() if recheck_absent else read_ledger(array_dir)
        for key in array.keys:
            if (array.rel_path, key) in seen:
                continue
            seen.add((array.rel_path, key))
            if array_dir is not None and (array_dir / key).is_file():
                present += 1
            elif key in ledgers.get(array.rel_path, ()):
                absent += 1
            else:
                chunks.append((array, key))
    return Pending(tuple(chunks), present, absent)
