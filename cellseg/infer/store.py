"""Prediction stores: what `predict`, `ensemble` and `postprocess` write and read, crop by crop.

Layout (a zarr v2 directory, readable by zarr, tensorstore, neuroglancer and `cellseg submit`):

    PRED.zarr/.zattrs                 {"cellseg": {"kind", "channels", "instance_channels", "provenance"}}
    PRED.zarr/crop<N>/.zattrs         {"cellseg_crop": {"grid": {...}, "dataset": ..., ...}}
    PRED.zarr/crop<N>/<channel>/      OME-NGFF 0.4 multiscale group, `s0` (z, y, x) on the crop's grid

`kind` is "probabilities" (float16 in [0, 1], or uint8 holding round(255 p) when written quantised) or
"segmentation" (uint8 {0, 1} for semantic classes, uint32 object ids for instance classes: never
wrapped). `channels` are the class names, followed by auxiliary channels such as `mito_boundary`.

A crop group is built under a hidden temporary name and renamed into place only when every channel is
written, so a crop that exists is complete: an interrupted run leaves no half-written crop, and a re-run
skips the crops already there (`completed`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cellseg.data.arrays import MultiscaleImage
from cellseg.data.targets import Grid
from cellseg.data.write import DEFAULT_CHUNK, atomic_dir, write_multiscale

Kind = Literal["probabilities", "segmentation"]
KINDS: tuple[str, ...] = ("probabilities", "segmentation")
QUANTUM = 255  # uint8 probabilities hold round(255 p)
BOUNDARY_SUFFIX = "_boundary"  # auxiliary channel of an instance class: its touching-object boundaries (as in meta.json)


def boundary_channel(class_name: str) -> str:
    """Name of the boundary channel of an instance class."""
    return f"{class_name}{BOUNDARY_SUFFIX}"


def grid_to_json(grid: Grid) -> dict[str, list[float] | list[int]]:
    return {"translation_nm": [float(v) for v in grid.translation_nm], "shape_vox": [int(v) for v in grid.shape_vox],
            "voxel_size_nm": [float(v) for v in grid.voxel_size_nm]}


def grid_from_json(data: Mapping[str, Any]) -> Grid:
    return Grid(translation_nm=tuple(float(v) for v in data["translation_nm"]),  # type: ignore[arg-type]
                shape_vox=tuple(int(v) for v in data["shape_vox"]),  # type: ignore[arg-type]
                voxel_size_nm=tuple(float(v) for v in data["voxel_size_nm"]))  # type: ignore[arg-type]


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

        Raises:
            FileExistsError: `path` exists and neither `overwrite` nor `resume` is given.
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
        with atomic_dir(path, overwrite=overwrite) as tmp:
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

    def grid(self, crop: str) -> Grid:
        """The world-space grid of the crop's arrays."""
        return grid_from_json(self.crop_attrs(crop)["grid"])

    def write_crop(self, crop: str, grid: Grid, arrays: Mapping[str, np.ndarray], *,
                   attrs: Mapping[str, Any] | None = None, overwrite: bool = False,
                   chunks: Sequence[int] | None = None) -> None:
        """Write every channel of one crop, atomically.

        Args:
            crop: group name, e.g. "crop234".
            grid: world grid of the arrays (translation = centre of voxel 0).
            arrays: channel → (z, y, x) array of `grid.shape_vox`; exactly the store's channels. Probability
                stores take float16/float32 in [0, 1] (stored as float16) or uint8 (stored as is);
                segmentation stores take bool/uint8 masks and uint32 ids for instance channels.
            attrs: extra crop attributes (e.g. dataset, timings).
            overwrite: replace the crop if it exists.

        Raises:
            ValueError: wrong channel set, shape or dtype.
        """
        if set(arrays) != set(self.channels):
            raise ValueError(f"{self.path}/{crop}: got channels {sorted(arrays)}, the store holds {list(self.channels)}")
        stored = {name: self._stored(crop, name, arrays[name], grid) for name in self.channels}
        meta = {"cellseg_crop": {"grid": grid_to_json(grid), **dict(attrs or {})}}
        with atomic_dir(self.path / crop, overwrite=overwrite) as tmp:
            tmp.mkdir()
            (tmp / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
            for name, data in stored.items():
                kind = "em" if self.kind == "probabilities" else "labels"
                write_multiscale(tmp / name, data, voxel_size_nm=grid.voxel_size_nm,
                                 translation_nm=grid.translation_nm, kind=kind, num_levels=1,
                                 chunks=chunks or (DEFAULT_CHUNK,) * 3)
            (tmp / ".zattrs").write_text(json.dumps(meta, indent=2))  # last: marks the crop complete

    def _stored(self, crop: str, name: str, data: np.ndarray, grid: Grid) -> np.ndarray:
        where = f"{self.path}/{crop}/{name}"
        data = np.asarray(data)
        if data.shape != tuple(grid.shape_vox):
            raise ValueError(f"{where}: shape {data.shape} differs from the grid's {tuple(grid.shape_vox)}")
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
        data = MultiscaleImage(str(self.path / crop / channel), backend="zarr").read_level("s0")
        if self.kind == "probabilities":
            if data.dtype == np.uint8:
                return data.astype(np.float32) / QUANTUM
            return data.astype(np.float32)
        return data

    def image(self, crop: str, channel: str) -> MultiscaleImage:
        """The channel as a `MultiscaleImage`, to read it on another grid (world coordinates)."""
        return MultiscaleImage(str(self.path / crop / channel), backend="zarr")
