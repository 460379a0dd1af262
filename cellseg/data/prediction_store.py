"""Prediction stores: what `predict`, `ensemble` and `postprocess` write and read, crop by crop.

Layout (a zarr v2 directory, readable by zarr, tensorstore, neuroglancer and `cellseg submit`):

    PRED.zarr/.zattrs                 {"cellseg": {"kind", "channels", "instance_channels", "provenance"}}
    PRED.zarr/crop<N>/.zattrs         {"cellseg_crop": {"grid": {...}, "dataset": ..., ...}}
    PRED.zarr/crop<N>/<channel>/      OME-NGFF 0.4 multiscale group, `s0` (z, y, x) on the crop's grid

A channel may lie on its own grid (a segmentation decoded on each label's annotation grid, where the labels
of a crop differ): the crop's `.zattrs` then list it under "channel_grids" ({channel: grid}); `grid(crop,
channel)` answers for either. Stores without that entry have one grid per crop.

`kind` is "probabilities" (float16 in [0, 1], or uint8 holding round(255 p) when written quantised) or
"segmentation" (uint8 {0, 1} for semantic classes, uint32 object ids for instance classes: never
wrapped). `channels` are the class names, followed by auxiliary channels such as `mito_boundary`. A crop
holds all of them, or the subset its `.zattrs` lists under "channels" (a test crop: only what it is scored on).

A crop group is built under the hidden name `.crop<N>.partial` and renamed into place only when every
channel is written, so a crop that exists is complete and a re-run skips it (`completed`). Channels can be
written region by region (`CropWriter`), so no crop has to fit in memory; a partial crop records its
finished regions, and a writer with the same key resumes them after a kill.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cellseg.data.arrays import MultiscaleImage
from cellseg.data.grid import Grid
from cellseg.data.write import (
    DEFAULT_CHUNK,
    atomic_dir,
    create_multiscale_level,
    owner_tag,
    process_alive,
    replace_dir,
    sweep_stale,
    with_path,
)
from cellseg.pool import usable_cores

Kind = Literal["probabilities", "segmentation"]
KINDS: tuple[str, ...] = ("probabilities", "segmentation")
QUANTUM = 255  # uint8 probabilities hold round(255 p)
PARTIAL_SUFFIX = ".partial"  # `.<crop>.partial`: a crop being written
PROGRESS_FILE = "progress.json"  # in a partial crop: its key, grid, channels and finished work units
WRITE_THREADS = 16  # channels compressed and written at once by `CropWriter.write_all`
BOUNDARY_SUFFIX = "_boundary"  # auxiliary channel of an instance class: its touching-object boundaries (as in meta.json)


def boundary_channel(class_name: str) -> str:
    """Name of the boundary channel of an instance class."""
    return f"{class_name}{BOUNDARY_SUFFIX}"


def grid_to_json(grid: Grid) -> dict[str, list[float] | list[int]]:
    return {"translation_nm": [float(v) for v in grid.translation_nm], "shape_vox": [int(v) for v in grid.shape_vox],
            "voxel_size_nm": [float(v) for v in grid.voxel_size_nm]}


def grid_from_json(data: Mapping[str, Any]) -> Grid:
    return Grid.of(translation_nm=data["translation_nm"], shape_vox=data["shape_vox"],
                   voxel_size_nm=data["voxel_size_nm"])


def quantise(probs: np.ndarray) -> np.ndarray:
    """float probabilities → uint8 round(255 p) (values are clipped to [0, 1] first)."""
    return np.rint(np.clip(probs, 0.0, 1.0) * QUANTUM).astype(np.uint8)


@dataclass(frozen=True)
class PredictionStore:
    """An open prediction store (see the module docstring for the layout)."""

    path: Path
    kind: Kind
    channels: tuple[str, ...]
    instance_channels: tuple[str, ...]
    provenance: dict[str, Any]

    @classmethod
    def create(cls, path: str | os.PathLike[str], *, kind: Kind, channels: Sequence[str],
               instance_channels: Sequence[str] = (), provenance: Mapping[str, Any] | None = None,
               overwrite: bool = False, resume: bool = False) -> PredictionStore:
        """Create a store, or with `resume` reopen an existing one written with the same channels.

        `overwrite` replaces only a store of the same kind that cellseg wrote (the `cellseg` entry of its
        `.zattrs` is the marker), never a run directory, a data root or other files.

        Raises:
            FileExistsError: `path` exists and neither `overwrite` nor `resume` is given, or it is not a cellseg
                store of this kind (the message says what it is).
            ValueError: `resume` of a store with other kind or channels; an unknown kind; duplicate channels.
        """
        path = Path(path)
        if kind not in KINDS:
            raise ValueError(f"{path}: kind {kind!r} is not one of {KINDS}")
        if len(set(channels)) != len(channels):
            raise ValueError(f"{path}: duplicate channel names in {list(channels)}")
        unknown = sorted(set(instance_channels) - set(channels))
        if unknown:
            raise ValueError(f"{path}: instance channels {unknown} are not among the channels")
        if path.exists() and resume:
            store = cls.open(path)
            if store.kind != kind or store.channels != tuple(channels):
                raise ValueError(f"{path}: cannot resume: it holds {store.kind} of {list(store.channels)}, "
                                 f"this run writes {kind} of {list(channels)} (use --overwrite to start over)")
            return store
        attrs = {"kind": kind, "channels": list(channels), "instance_channels": list(instance_channels),
                 "provenance": dict(provenance or {})}
        with atomic_dir(path, overwrite=overwrite, kind=f"{kind} store") as tmp:
            tmp.mkdir()
            (tmp / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
            (tmp / ".zattrs").write_text(json.dumps({"cellseg": attrs}, indent=2))
        return cls.open(path)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> PredictionStore:
        """Open a store written by `create`.

        Raises:
            FileNotFoundError: no such directory.
            ValueError: the directory is not a cellseg prediction store.
        """
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: no prediction store here")
        attrs_file = path / ".zattrs"
        try:
            attrs = json.loads(attrs_file.read_text())["cellseg"]
        except (OSError, KeyError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: not a cellseg prediction store ({attrs_file} lacks a 'cellseg' entry)") from err
        return cls(path=path, kind=attrs["kind"], channels=tuple(attrs["channels"]),
                   instance_channels=tuple(attrs.get("instance_channels", ())),
                   provenance=dict(attrs.get("provenance", {})))

    @property
    def classes(self) -> tuple[str, ...]:
        """The channels that are classes (auxiliary boundary channels left out)."""
        return tuple(c for c in self.channels if not c.endswith(BOUNDARY_SUFFIX))

    def completed(self) -> list[str]:
        """Names of the crops written completely, sorted."""
        return sorted(p.name for p in self.path.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and (p / ".zattrs").exists())

    def __contains__(self, crop: str) -> bool:
        return (self.path / crop / ".zattrs").exists()

    def crop_attrs(self, crop: str) -> dict[str, Any]:
        """The crop's attributes (grid, dataset, and whatever the writer recorded)."""
        try:
            return json.loads((self.path / crop / ".zattrs").read_text())["cellseg_crop"]
        except FileNotFoundError as err:
            raise KeyError(f"{self.path}: no crop {crop!r} (written: {self.completed()})") from err

    def grid(self, crop: str, channel: str | None = None) -> Grid:
        """The world-space grid of the crop's arrays, or of one channel (its own grid when it has one)."""
        attrs = self.crop_attrs(crop)
        own = attrs.get("channel_grids", {}).get(channel) if channel is not None else None
        return grid_from_json(own or attrs["grid"])

    def write_crop(self, crop: str, grid: Grid, arrays: Mapping[str, np.ndarray], *,
                   attrs: Mapping[str, Any] | None = None, overwrite: bool = False,
                   chunks: Sequence[int] | None = None, grids: Mapping[str, Grid] | None = None) -> None:
        """Write every channel of one crop at once, atomically (`crop_writer` for channel- or block-wise writes).

        Args:
            crop: group name, e.g. "crop234".
            grid: world grid of the arrays (translation = centre of voxel 0).
            arrays: channel → (z, y, x) array of its grid's shape; exactly the store's channels. Probability
                stores take float16/float32 in [0, 1] (stored as float16) or uint8 (stored as is);
                segmentation stores take bool/uint8 masks and uint32 ids for instance channels.
            attrs: extra crop attributes (e.g. dataset, timings).
            overwrite: replace the crop if it exists.
            grids: channels on their own grid (the others lie on `grid`).

        Raises:
            ValueError: wrong channel set, shape or dtype.
            FileExistsError: the crop exists and `overwrite` is not given.
        """
        if set(arrays) != set(self.channels):
            raise ValueError(f"{self.path}/{crop}: got channels {sorted(arrays)}, the store holds {list(self.channels)}")
        grids = dict(grids or {})
        for name, data in arrays.items():
            shape = tuple(grids.get(name, grid).shape_vox)
            if np.shape(data) != shape:
                raise ValueError(f"{self.path}/{crop}/{name}: shape {np.shape(data)} differs from the grid's {shape}")
        writer = self.crop_writer(crop, grid, overwrite=overwrite, chunks=chunks, grids=grids)
        for name in self.channels:
            writer.write(name, arrays[name])
        writer.commit(attrs)

    def crop_writer(self, crop: str, grid: Grid, *, key: str = "", overwrite: bool = False,
                    chunks: Sequence[int] | None = None, channels: Sequence[str] | None = None,
                    grids: Mapping[str, Grid] | None = None) -> CropWriter:
        """A writer of one crop, channel by channel and region by region (`CropWriter`).

        Args:
            channels: the channels this crop holds, in the store's order (default all; e.g. only those a test
                crop is scored on).
            key: what the content depends on (e.g. checkpoint and prediction settings): a partial crop left
                by a killed writer with the same key and grid is resumed, any other one discarded.
            overwrite: replace the crop, when it exists, at `commit`.
            grids: channels on their own grid, other than `grid` (the crop's, which the others lie on).

        Raises:
            FileExistsError: the crop exists and `overwrite` is not given (raised now, before any work).
            ValueError: channels not of the store, or grids of channels the crop does not hold.
        """
        if crop in self and not overwrite:
            raise FileExistsError(f"{self.path}/{crop} already exists; pass overwrite=True (--overwrite) to replace it")
        subset = tuple(self.channels if channels is None else channels)
        if [c for c in self.channels if c in subset] != list(subset):
            raise ValueError(f"{self.path}/{crop}: channels {list(subset)} are not the store's "
                             f"{list(self.channels)} (or a subset in its order)")
        own = {c: g for c, g in (grids or {}).items() if g != grid}
        if set(own) - set(subset):
            raise ValueError(f"{self.path}/{crop}: grids given for {sorted(set(own) - set(subset))}, which the crop "
                             f"does not hold ({list(subset)})")
        return CropWriter(self, crop, grid, key=key, chunks=tuple(chunks or (DEFAULT_CHUNK,) * 3),
                          overwrite=overwrite, channels=subset, grids=own)

    def crop_channels(self, crop: str) -> tuple[str, ...]:
        """The channels a crop holds: all the store's, or the subset it was written with."""
        return tuple(self.crop_attrs(crop).get("channels", self.channels))

    def stored(self, where: str, name: str, data: np.ndarray) -> np.ndarray:
        """`data` of channel `name` as it is stored (dtype checked, converted without loss of meaning).

        Raises:
            ValueError: a dtype the store's kind does not take, negative or too large instance ids.
        """
        data = np.asarray(data)
        if self.kind == "probabilities":
            if data.dtype == np.uint8:
                return data
            if data.dtype not in (np.float16, np.float32, np.float64):
                raise ValueError(f"{where}: probabilities must be float or uint8 (quantised), got {data.dtype}")
            return data.astype(np.float16)
        if name in self.instance_channels:
            if data.dtype.kind not in "ui" or (data.size and data.min() < 0):
                raise ValueError(f"{where}: instance ids must be non-negative integers, got {data.dtype}")
            if data.size and int(data.max()) > np.iinfo(np.uint32).max:
                raise ValueError(f"{where}: instance id {int(data.max())} does not fit uint32")
            return data.astype(np.uint32)
        if data.dtype != np.bool_ and not (data.dtype == np.uint8 and (data.size == 0 or data.max() <= 1)):
            raise ValueError(f"{where}: a semantic mask must be bool or uint8 0/1, got {data.dtype}")
        return data.astype(np.uint8)

    def read(self, crop: str, channel: str) -> np.ndarray:
        """One channel of one crop at `s0`: float32 probabilities in [0, 1] for probability stores
        (uint8 ones de-quantised), the stored masks/ids for segmentation stores."""
        if channel not in self.channels:
            raise KeyError(f"{self.path}: no channel {channel!r} (channels: {list(self.channels)})")
        if channel not in (held := self.crop_channels(crop)):
            raise KeyError(f"{self.path}/{crop}: no channel {channel!r}: the crop holds {list(held)}")
        data = MultiscaleImage(str(self.path / crop / channel), backend="zarr").read_level("s0")
        if self.kind == "probabilities":
            if data.dtype == np.uint8:
                return data.astype(np.float32) / QUANTUM
            return data.astype(np.float32)
        return data

    def image(self, crop: str, channel: str) -> MultiscaleImage:
        """The channel as a `MultiscaleImage`, to read it on another grid (world coordinates)."""
        return MultiscaleImage(str(self.path / crop / channel), backend="zarr")


def _check_not_busy(path: Path, progress: Mapping[str, Any] | None) -> None:
    """Refuse a partial crop that a live process of this host is writing (two commands on one store).

    Raises:
        FileExistsError: naming the partial crop and its writer.
    """
    host, _, pid = str((progress or {}).get("owner", "")).rpartition("-")
    if host and pid.isdigit() and f"{host}-{pid}" != owner_tag() and process_alive(host, int(pid)):
        raise FileExistsError(f"{path}: being written by process {pid} of {host}; two commands writing one crop of "
                              "a store would corrupt it: wait for that one, or write another store")


class CropWriter:
    """One crop being written into the hidden group `.<crop>.partial`, renamed to `<crop>` by `commit`.

    Channels are written whole or region by region (`write` with an offset), so a crop never has to be held
    in memory at once; a channel of `grids` lies on its own grid, the others on `grid`. `mark_done` records finished work units (e.g. prediction blocks) in the partial group;
    a later writer with the same key, grid and chunks resumes them (`done`), any other partial is discarded.
    A crop that exists under its own name is therefore always complete.
    """

    def __init__(self, store: PredictionStore, crop: str, grid: Grid, *, key: str, chunks: tuple[int, ...],
                 overwrite: bool, channels: tuple[str, ...], grids: Mapping[str, Grid] | None = None) -> None:
        self.store, self.crop, self.grid, self.overwrite, self.channels = store, crop, grid, overwrite, channels
        self.grids = dict(grids or {})
        self.path = store.path / f".{crop}{PARTIAL_SUFFIX}"
        sweep_stale(store.path / crop)  # a replaced crop that a killed writer did not finish removing
        self._chunks = chunks
        self._progress: dict[str, Any] = {"grid": grid_to_json(grid), "key": key, "chunks": list(chunks),
                                          "channels": list(channels), "done": []}
        if self.grids:
            self._progress["channel_grids"] = {c: grid_to_json(g) for c, g in self.grids.items()}
        self._arrays: dict[str, Any] = {}
        previous = self._read_progress()
        _check_not_busy(self.path, previous)
        self._progress["owner"] = owner_tag()
        same = ("grid", "key", "chunks", "channels", "channel_grids")
        if previous is not None and all(previous.get(k) == self._progress.get(k) for k in same):
            self._progress["done"] = list(previous["done"])
        elif self.path.exists():
            shutil.rmtree(self.path)  # another key or grid, or no progress record: start over
        if not self.path.exists():
            self.path.mkdir(parents=True)
            (self.path / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
            self._save_progress()

    def grid_of(self, channel: str) -> Grid:
        """The grid `channel` is written on."""
        return self.grids.get(channel, self.grid)

    @property
    def done(self) -> frozenset[str]:
        """The work units recorded by `mark_done` (here or by the killed writer this one resumes)."""
        return frozenset(self._progress["done"])

    def write(self, channel: str, data: np.ndarray, offset: Sequence[int] = (0, 0, 0)) -> None:
        """Write `data` (z, y, x) of `channel` at voxel `offset` of the crop's grid.

        Raises:
            ValueError: unknown channel, a region outside the grid, or a dtype the store does not take
                (or unlike the dtype already written to this channel).
        """
        where = f"{self.store.path}/{self.crop}/{channel}"
        if channel not in self.channels:
            raise ValueError(f"{where}: not a channel of this crop ({list(self.channels)})")
        data = np.asarray(data)
        shape = tuple(self.grid_of(channel).shape_vox)
        if data.ndim != 3 or len(offset) != 3 or any(
                o < 0 or o + n > s for o, n, s in zip(offset, data.shape, shape, strict=True)):
            raise ValueError(f"{where}: region {data.shape} at {tuple(offset)} is not inside the grid {shape}")
        stored = self.store.stored(where, channel, data)
        try:
            array = self._array(channel, stored.dtype)
            if array.dtype != stored.dtype:
                raise ValueError(f"{where}: writing {stored.dtype} into a {array.dtype} array")
            array[tuple(slice(o, o + n) for o, n in zip(offset, data.shape, strict=True))] = stored
        except OSError as err:  # disk full, read-only, permissions: name the store and channel
            raise with_path(err, Path(where)) from err

    def write_all(self, arrays: Mapping[str, np.ndarray], offset: Sequence[int] = (0, 0, 0)) -> None:
        """`write` several channels' regions at the same offset, in parallel (compression releases the GIL)."""
        with ThreadPoolExecutor(min(len(arrays), usable_cores(), WRITE_THREADS) or 1) as pool:
            list(pool.map(lambda item: self.write(item[0], item[1], offset), arrays.items()))

    def copy(self, channel: str, source: PredictionStore, crop: str) -> None:
        """Write `channel` as `source` stores it for `crop`: its multiscale group copied file by file (chunks,
        dtype and compression kept, nothing decoded), so the channel is bit for bit its source's.

        Raises:
            ValueError: unknown channel, a source of another kind, lacking the channel, or on another grid.
        """
        where = f"{self.store.path}/{self.crop}/{channel}"
        if channel not in self.channels:
            raise ValueError(f"{where}: not a channel of this crop ({list(self.channels)})")
        if source.kind != self.store.kind:
            raise ValueError(f"{where}: cannot copy {source.kind} from {source.path} into a {self.store.kind} store")
        if channel not in source.crop_channels(crop):
            raise ValueError(f"{where}: {source.path}/{crop} does not hold {channel}")
        if source.grid(crop, channel) != self.grid_of(channel):
            raise ValueError(f"{where}: {source.path}/{crop}/{channel} lies on {source.grid(crop, channel)}, this "
                             f"crop writes it on {self.grid_of(channel)}")
        target = self.path / channel
        if target.exists():
            shutil.rmtree(target)  # a partial copy or write of a killed writer
        self._arrays.pop(channel, None)
        try:
            shutil.copytree(source.path / crop / channel, target)
        except OSError as err:
            raise with_path(err, Path(where)) from err

    def mark_done(self, unit: str) -> None:
        """Record a finished unit of work (after its regions are written)."""
        self._progress["done"].append(unit)
        self._save_progress()

    def discard(self) -> None:
        """Remove the partial crop: its input was refused (a kill leaves it instead, for a later writer to resume)."""
        shutil.rmtree(self.path, ignore_errors=True)

    def commit(self, attrs: Mapping[str, Any] | None = None) -> None:
        """Rename the crop into place with its attributes.

        Raises:
            ValueError: a channel was never written.
            FileExistsError: the crop appeared meanwhile and `overwrite` was not given.
        """
        missing = [c for c in self.channels if not (self.path / c / "s0" / ".zarray").exists()]
        if missing:
            raise ValueError(f"{self.path}: channels never written: {missing}")
        (self.path / PROGRESS_FILE).unlink()
        meta: dict[str, Any] = {"cellseg_crop": {"grid": grid_to_json(self.grid), **dict(attrs or {})}}
        if self.channels != self.store.channels:
            meta["cellseg_crop"]["channels"] = list(self.channels)
        if self.grids:
            meta["cellseg_crop"]["channel_grids"] = {c: grid_to_json(g) for c, g in self.grids.items()}
        (self.path / ".zattrs").write_text(json.dumps(meta, indent=2))  # the marker of a complete crop
        final = self.store.path / self.crop
        if final.exists() and not self.overwrite:
            raise FileExistsError(f"{final} already exists; pass overwrite=True (--overwrite) to replace it")
        replace_dir(self.path, final)

    def _array(self, channel: str, dtype: np.dtype) -> Any:
        if channel not in self._arrays:
            import zarr

            group = self.path / channel
            if (group / "s0" / ".zarray").exists():  # written by the writer this one resumes
                self._arrays[channel] = zarr.open_array(str(group / "s0"), mode="r+")
            else:
                if group.exists():
                    shutil.rmtree(group)
                grid = self.grid_of(channel)
                self._arrays[channel] = create_multiscale_level(
                    group, grid.shape_vox, dtype, voxel_size_nm=grid.voxel_size_nm,
                    translation_nm=grid.translation_nm, chunks=self._chunks)
        return self._arrays[channel]

    def _read_progress(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.path / PROGRESS_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def _save_progress(self) -> None:
        tmp = self.path / f".{PROGRESS_FILE}.tmp"
        tmp.write_text(json.dumps(self._progress))
        os.replace(tmp, self.path / PROGRESS_FILE)
