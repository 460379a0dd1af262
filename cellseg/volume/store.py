"""The whole-volume output store that `cellseg predict-volume` writes: probabilities (and, with `--instances`,
masks and ids) over a world ROI of one dataset, as OME-NGFF multiscale groups a viewer opens directly.

Layout (a zarr v2 directory store, blosc):

    OUT.zarr/.zattrs                  {"cellseg": {"kind": "volume-prediction", "format": 1, "dataset", "data_root",
                                       "roi_nm": {"offset", "shape"}, "voxel_size_nm", "block_vox", "chunk_vox",
                                       "num_levels", "classes", "channels", "instance_classes", "members", "tta", "settings",
                                       "created", "cellseg_version"}}
    OUT.zarr/probabilities/<channel>/ OME-NGFF 0.4 multiscale group: s0 uint8 round(255 p) on the ROI's grid,
                                      s1..sN 2× mean-downsampled uint8; one per class and per boundary channel
                                      (`<class>_boundary`) of an instance class the members predict
    OUT.zarr/labels/<class>/          with instances: the same, with "image-label"; s0 uint8 {0, 1} for a semantic
                                      class, uint64 ids for an instance class (0 background, unique over the volume)
    OUT.zarr/.blocks/<task>/          done markers of the block scheduler (resume)
    OUT.zarr/.stitch/<class>/         per-block face records for merging instances
    OUT.zarr/summary.json             the last run's summary (blocks, failures, rates)

Axes are (z, y, x) in nanometres. `roi_nm.offset` is the ROI's lower corner (the edge of voxel 0); every level's
NGFF translation is the centre of its voxel 0, as everywhere in cellseg (`cellseg.data.grid`), so s0's
translation is `offset + voxel_size / 2`.

Every array of every level exists (filled with 0) from creation, chunked `chunk_vox` (clipped to the array), so
workers write blocks into place. A write block is a whole number of chunks at every level it writes, so no two
blocks ever write one chunk (`check_alignment`).
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import cellseg
from cellseg.data.grid import Grid, shape3
from cellseg.data.ngff import build_multiscales, pyramid_levels
from cellseg.data.write import DEFAULT_CHUNK, VOLUME_STORE, _compressor, atomic_dir, describe

KIND = "volume-prediction"
FORMAT = 1
PROBABILITIES = "probabilities"
LABELS = "labels"
BLOCKS_DIR = ".blocks"
STITCH_DIR = ".stitch"
SUMMARY_FILE = "summary.json"
# A resumed store must have been created with the same values of these entries.
RESUME_KEYS = ("dataset", "roi_nm", "voxel_size_nm", "block_vox", "chunk_vox", "num_levels", "classes",
               "channels", "instance_classes", "members", "tta", "settings")


def check_alignment(block_vox: Sequence[int], chunk_vox: Sequence[int]) -> None:
    """Raise unless a write block of `block_vox` voxels is a whole number of `chunk_vox` chunks (a pyramid level's
    block is whole chunks of its level by construction, `level_block_vox`).

    Raises:
        ValueError: naming the axis, the block and the chunk.
    """
    for axis, b, c in zip("zyx", block_vox, chunk_vox, strict=True):
        if c <= 0 or b <= 0 or b % c:
            raise ValueError(f"block edge {b} voxels along {axis} is not a whole number of {c}-voxel chunks: "
                             "choose --block-vox as a multiple of the chunk (default chunk 64)")


def level_block_vox(block_vox: Sequence[int], chunk_vox: Sequence[int], level: int) -> tuple[int, int, int]:
    """The block of pyramid level `level`, in that level's voxels: the s0 write block halved `level` times, rounded
    up to whole chunks of the level (so no two blocks write one chunk). Level blocks then cover the s0 block's
    extent until it is less than a chunk of the level, and the levels are built by as many workers as s0 was,
    each block as soon as the blocks below it are written.

    Example:
        >>> level_block_vox((384, 512, 512), (64, 64, 64), 3)
        (64, 64, 64)
    """
    return tuple(int(c) * -(-int(b) // (int(c) << level))
                 for b, c in zip(shape3(block_vox), shape3(chunk_vox), strict=True))  # type: ignore[return-value]


def level_grid(grid: Grid, level: int) -> Grid:
    """Level `level`'s grid of the s0 grid `grid`: 2× voxels per level (rounded up: a last partial voxel is kept),
    translation at the centre of its voxel 0."""
    meta = pyramid_levels(grid.voxel_size_nm, grid.translation_nm, level + 1)[level]
    shape = list(grid.shape_vox)
    for _ in range(level):
        shape = [(n + 1) // 2 for n in shape]
    return Grid.of(translation_nm=meta.translation_nm, shape_vox=shape, voxel_size_nm=meta.voxel_size_nm)


def roi_grid(offset_nm: Sequence[float], shape_nm: Sequence[float], voxel_size_nm: Sequence[float]) -> Grid:
    """The s0 grid of an ROI given by its lower corner and extent in nm (whole voxels: the extent is divided by
    the voxel size and rounded).

    Raises:
        ValueError: an extent that is not a positive whole number of voxels (within 1e-6 of one).
    """
    shape = []
    for axis, s, v in zip("zyx", shape_nm, voxel_size_nm, strict=True):
        n = float(s) / float(v)
        if n < 1 or abs(n - round(n)) > 1e-6:
            raise ValueError(f"ROI extent {s} nm along {axis} is not a positive whole number of {v} nm voxels")
        shape.append(round(n))
    return Grid.of(translation_nm=[o + v / 2 for o, v in zip(offset_nm, voxel_size_nm, strict=True)],
                   shape_vox=shape, voxel_size_nm=voxel_size_nm)


def _group(path: Path, attrs: Mapping[str, Any] | None = None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    if attrs is not None:
        (path / ".zattrs").write_text(json.dumps(dict(attrs), indent=2))


def _multiscale(path: Path, grid: Grid, dtype: np.dtype, *, num_levels: int, chunk_vox: Sequence[int],
                label: bool) -> None:
    """An empty multiscale group: every level's array created, filled with 0."""
    import zarr

    metas = pyramid_levels(grid.voxel_size_nm, grid.translation_nm, num_levels)
    attrs = build_multiscales(metas, name=path.name)
    if label:
        attrs["image-label"] = {"version": "0.4", "source": {"image": "../../probabilities/" + path.name}}
    _group(path, attrs)
    for level, meta in enumerate(metas):
        shape = level_grid(grid, level).shape_vox
        chunks = tuple(max(1, min(int(c), int(n))) for c, n in zip(chunk_vox, shape, strict=True))
        zarr.open_array(str(path / meta.path), mode="w-", shape=shape, dtype=dtype, chunks=chunks,
                        compressor=_compressor(), fill_value=0, dimension_separator="/")


def label_dtype(class_name: str, instance_classes: Sequence[str]) -> np.dtype:
    """uint64 ids for an instance class, uint8 {0, 1} for a semantic one."""
    return np.dtype(np.uint64) if class_name in instance_classes else np.dtype(np.uint8)


@dataclass(frozen=True)
class VolumeStore:
    """An open whole-volume store (module docstring); `attrs` is its `.zattrs` "cellseg" entry."""

    path: Path
    attrs: dict[str, Any]

    @classmethod
    def create(cls, path: str | os.PathLike[str], *, dataset: str, data_root: str, grid: Grid,
               block_vox: Sequence[int], classes: Sequence[str], channels: Sequence[str] | None = None,
               instance_classes: Sequence[str] = (),
               instances: bool = False, members: Sequence[Mapping[str, Any]] = (), tta: int = 1,
               settings: Mapping[str, Any] | None = None, chunk_vox: Sequence[int] = (DEFAULT_CHUNK,) * 3,
               num_levels: int | None = None, resume: bool = False) -> VolumeStore:
        """Create the store with every array empty, or with `resume` reopen the one a run with the same settings
        (`RESUME_KEYS`) created. `channels` are the probability groups (default `classes`; the classes first);
        `instances` adds the `labels/` groups, one per class.

        Raises:
            FileExistsError: `path` exists and `resume` is not given, or it is not a volume store (the message
                says what it is). Nothing existing is ever replaced.
            ValueError: `resume` of a store written with other settings (named); blocks not aligned to chunks;
                duplicate or unknown classes.
        """
        from cellseg.data.write import default_num_levels

        path = Path(path)
        chunk_vox, block_vox = shape3(chunk_vox), shape3(block_vox)
        channels = list(classes if channels is None else channels)
        if len(set(channels)) != len(channels) or len(set(classes)) != len(classes):
            raise ValueError(f"{path}: duplicate classes or channels in {list(channels)}")
        if set(classes) - set(channels):
            raise ValueError(f"{path}: classes {sorted(set(classes) - set(channels))} are not among the channels")
        if set(instance_classes) - set(classes):
            raise ValueError(f"{path}: instance classes {sorted(set(instance_classes) - set(classes))} are not "
                             f"among the classes {list(classes)}")
        levels = num_levels or default_num_levels(grid.shape_vox)
        check_alignment(block_vox, chunk_vox)
        attrs = {"kind": KIND, "format": FORMAT, "dataset": dataset, "data_root": str(data_root),
                 "roi_nm": {"offset": [float(v) for v in grid.start_nm],
                            "shape": [float(n * v) for n, v in zip(grid.shape_vox, grid.voxel_size_nm, strict=True)]},
                 "voxel_size_nm": [float(v) for v in grid.voxel_size_nm], "block_vox": list(block_vox),
                 "chunk_vox": list(chunk_vox), "num_levels": levels, "classes": list(classes), "channels": channels,
                 "instance_classes": [c for c in classes if c in instance_classes and instances],
                 "members": [dict(m) for m in members], "tta": int(tta),
                 "settings": json.loads(json.dumps(dict(settings or {}))),
                 "cellseg_version": cellseg.__version__,
                 "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        if path.exists() or path.is_symlink():
            if not resume:
                raise FileExistsError(f"{path} already exists ({describe(path)}); pass --resume to continue the "
                                      "run that wrote it, or choose another --out")
            store = cls.open(path)
            differ = [k for k in RESUME_KEYS if store.attrs.get(k) != attrs[k]]
            if differ:
                raise ValueError(f"{path}: cannot resume: it was written with other {', '.join(differ)} "
                                 f"(stored {', '.join(f'{k}={store.attrs.get(k)!r}' for k in differ)}); choose "
                                 "another --out or the same settings")
            if instances and not (path / LABELS).is_dir():
                raise ValueError(f"{path}: cannot resume with --instances: it was created without them")
            return store
        with atomic_dir(path, kind=VOLUME_STORE) as tmp:  # renamed into place once every array exists
            _group(tmp, {"cellseg": attrs})
            _group(tmp / PROBABILITIES)
            for c in channels:
                _multiscale(tmp / PROBABILITIES / c, grid, np.dtype(np.uint8), num_levels=levels,
                            chunk_vox=chunk_vox, label=False)
            if instances:
                _group(tmp / LABELS, {"labels": list(classes)})
                for c in classes:
                    _multiscale(tmp / LABELS / c, grid, label_dtype(c, attrs["instance_classes"]),
                                num_levels=levels, chunk_vox=chunk_vox, label=True)
        return cls(path, attrs)

    @staticmethod
    def exists(path: str | os.PathLike[str]) -> bool:
        """Whether `path` holds a volume store (of any settings)."""
        try:
            entry = json.loads((Path(path) / ".zattrs").read_text()).get("cellseg")
        except (OSError, ValueError, AttributeError):
            return False
        return isinstance(entry, dict) and entry.get("kind") == KIND

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> VolumeStore:
        """Open an existing store.

        Raises:
            FileNotFoundError: nothing at `path`.
            ValueError: `path` is something else (a prediction store of crops, a data root, ...: named), or a
                volume store of a newer format.
        """
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such volume store")
        try:
            entry = json.loads((path / ".zattrs").read_text()).get("cellseg")
        except (OSError, ValueError, AttributeError):
            entry = None
        if not isinstance(entry, dict) or entry.get("kind") != KIND:
            raise ValueError(f"{path} is {describe(path)}, not a volume prediction store (`cellseg predict-volume` "
                             "output); choose another --out")
        if int(entry.get("format", 0)) > FORMAT:
            raise ValueError(f"{path}: volume store format {entry.get('format')} is newer than this cellseg reads "
                             f"({FORMAT})")
        return cls(path, entry)

    # ------------------------------------------------------------------------------------------ geometry

    @property
    def grid(self) -> Grid:
        """The s0 grid of the ROI."""
        return roi_grid(self.attrs["roi_nm"]["offset"], self.attrs["roi_nm"]["shape"], self.attrs["voxel_size_nm"])

    @property
    def block_vox(self) -> tuple[int, int, int]:
        return shape3(self.attrs["block_vox"])

    @property
    def chunk_vox(self) -> tuple[int, int, int]:
        return shape3(self.attrs["chunk_vox"])

    @property
    def num_levels(self) -> int:
        return int(self.attrs["num_levels"])

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(self.attrs["classes"])

    @property
    def channels(self) -> tuple[str, ...]:
        """The probability groups: the classes, then boundary channels."""
        return tuple(self.attrs.get("channels", self.attrs["classes"]))

    @property
    def instance_classes(self) -> tuple[str, ...]:
        return tuple(self.attrs["instance_classes"])

    @property
    def has_labels(self) -> bool:
        """Whether the store holds `labels/` (created with instances)."""
        return (self.path / LABELS).is_dir()

    def level_grid(self, level: int) -> Grid:
        """The grid of pyramid level `level` (0 = s0)."""
        return level_grid(self.grid, level)

    # ------------------------------------------------------------------------------------------ arrays

    def array(self, group: str, class_name: str, level: int = 0) -> Any:
        """The writable zarr array of `group` ("probabilities" or "labels") / `class_name` / s`level`.

        Raises:
            KeyError: no such class or level in the store (named).
        """
        import zarr

        where = self.path / group / class_name / f"s{level}"
        if not (where / ".zarray").is_file():
            raise KeyError(f"{self.path}: no array {group}/{class_name}/s{level}")
        return zarr.open_array(str(where), mode="r+")

    def tracking_dir(self, task: str) -> Path:
        """The scheduler's done markers of `task` (under `.blocks/`)."""
        return self.path / BLOCKS_DIR / task

    def stitch_dir(self, class_name: str) -> Path:
        """The per-block face records of `class_name` (under `.stitch/`)."""
        return self.path / STITCH_DIR / class_name

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY_FILE
