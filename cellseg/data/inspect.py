"""Describe what is on disk: a data root (synthetic or a real download), a zarr group or a zarr array.

A *data root* holds `<dataset>/<dataset>.zarr/recon-1/...` folders, optionally with the manifests that
`cellseg synth` and `cellseg fetch` write. Without manifests (e.g. a `csc fetch-data` download) the
layout itself is scanned: EM levels, crops and their label classes.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cellseg.data.chunks import chunk_keys
from cellseg.data.crops import Catalog
from cellseg.data.ngff import parse_multiscales
from cellseg.data.stores import resolve

EM_PATH = "recon-1/em/fibsem-uint8"
GT_PATH = "recon-1/labels/groundtruth"
# The padding fraction is counted at the finest EM level of at most this many voxels: exact at s0 for the
# synthetic presets, a few seconds per dataset for real volumes (counted chunk by chunk, downloaded chunks only).
PAD_SCAN_MAX_VOXELS = 2**28


def disk_bytes(path: str | os.PathLike[str]) -> int:
    """Total size of the files under `path`."""
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def free_disk(path: str | os.PathLike[str]) -> tuple[Path, int]:
    """The folder whose file system `path` will be written to (its nearest existing ancestor) and its free bytes."""
    import shutil

    where = Path(path).resolve()
    while not where.exists():
        where = where.parent
    return where, shutil.disk_usage(where).free


def human_bytes(n: float) -> str:
    """`1536` → `1.5 KiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _fmt(values: tuple[float, ...] | tuple[int, ...], sep: str = "×") -> str:
    return sep.join(f"{v:g}" for v in values)


@dataclass
class DatasetScan:
    """What the layout scan found for one dataset."""

    name: str
    em_levels: list[str] = field(default_factory=list)
    crops: dict[str, dict[str, str]] = field(default_factory=dict)  # crop → class → s0 voxel size text
    bytes_on_disk: int = 0
    padding: str = ""  # share of the EM on disk at the padding value, with the level it was counted at


def padding_fraction(em_dir: Path, pad_value: int = 0) -> tuple[str, float, int] | None:
    """(level, share of voxels equal to `pad_value`, voxels counted) of an EM group on disk, counted at its
    finest level of at most `PAD_SCAN_MAX_VOXELS` voxels over the chunks present (a partial download holds only
    some: absent chunks would read as 0 and count as padding); None without levels or chunks."""
    import zarr

    levels = parse_multiscales(resolve(em_dir).read_json(".zattrs"), source=str(em_dir))
    for lv in levels:
        array = zarr.open_array(str(em_dir / lv.path), mode="r")
        if np.prod(array.shape) <= PAD_SCAN_MAX_VOXELS or lv is levels[-1]:
            break
    separator = array._dimension_separator or "."
    keys = chunk_keys([(0, n) for n in array.shape], chunks=array.chunks, separator=separator)
    padded = counted = 0
    for key in keys:
        if not (em_dir / lv.path / key).is_file():
            continue
        index = [int(i) for i in key.split(separator)]
        block = array[tuple(slice(i * c, (i + 1) * c) for i, c in zip(index, array.chunks, strict=True))]
        padded += int(np.count_nonzero(block == pad_value))
        counted += block.size
    return (lv.path, padded / counted, counted) if counted else None


def _scan_dataset(zarr_dir: Path, pad_value: int = 0) -> DatasetScan:
    scan = DatasetScan(name=zarr_dir.parent.name, bytes_on_disk=disk_bytes(zarr_dir))
    em = zarr_dir / EM_PATH
    if (em / ".zattrs").is_file():
        for lv in parse_multiscales(resolve(em).read_json(".zattrs"), source=str(em)):
            scan.em_levels.append(f"{lv.path}@{_fmt(lv.voxel_size_nm)}")
        found = padding_fraction(em, pad_value)
        scan.padding = (f"{100 * found[1]:.2f} % of the EM on disk equals the padding value {pad_value} "
                        f"(level {found[0]}, {found[2]:,} voxels)") if found else "no EM chunks on disk"
    gt = zarr_dir / GT_PATH
    for crop_dir in sorted(gt.glob("crop*"), key=lambda p: (len(p.name), p.name)):
        classes = {}
        for class_dir in sorted(p for p in crop_dir.iterdir() if (p / ".zattrs").is_file()):
            levels = parse_multiscales(resolve(class_dir).read_json(".zattrs"), source=str(class_dir))
            classes[class_dir.name] = _fmt(levels[0].voxel_size_nm)
        scan.crops[crop_dir.name] = classes
    return scan


def iter_dataset_dirs(root: Path) -> Iterator[Path]:
    """The `<root>/<dataset>/<dataset>.zarr` directories of a data root."""
    for ds in sorted(p for p in root.iterdir() if p.is_dir()):
        zarr_dir = ds / f"{ds.name}.zarr"
        if zarr_dir.is_dir():
            yield zarr_dir


def describe_root(root: Path, pad_value: int = 0) -> str:
    """Datasets, crops, classes per crop, voxel sizes, sizes on disk and the share of EM at the padding value."""
    scans = [_scan_dataset(z, pad_value) for z in iter_dataset_dirs(root)]
    if not scans:
        raise ValueError(f"{root}: no <dataset>/<dataset>.zarr folders here; not a CellMap data root")
    total = sum(s.bytes_on_disk for s in scans)
    n_crops = sum(len(s.crops) for s in scans)
    lines = [f"data root {root}: {len(scans)} datasets, {n_crops} crops with labels on disk, {human_bytes(total)}"]
    for s in scans:
        lines.append(f"\n{s.name}  ({human_bytes(s.bytes_on_disk)})")
        lines.append(f"  EM levels (nm): {', '.join(s.em_levels) or 'none on disk'}")
        if s.padding:
            lines.append(f"  padding: {s.padding}")
        for crop, classes in s.crops.items():
            by_size: dict[str, list[str]] = defaultdict(list)
            for name, size in classes.items():
                by_size[size].append(name)
            text = "; ".join(f"{len(v)} classes @ {k} nm" for k, v in by_size.items()) or "no classes"
            lines.append(f"  {crop:<9} {text}: {', '.join(sorted(classes))}")
    manifests = [n for n in ("manifest.csv", "train_crop_manifest.csv", "test_crop_manifest.csv", "datasplit.csv")
                 if (root / n).is_file()]
    if "train_crop_manifest.csv" in manifests:
        catalog = Catalog.from_dir(root)
        lines += ["", f"manifests: {', '.join(manifests)}", catalog.summary()]
    if (root / "ground_truth.zarr").is_dir():
        truth = root / "ground_truth.zarr"
        crops = sorted(p.name for p in truth.glob("crop*"))
        lines.append(f"\nheld-out truth {truth}: {len(crops)} crops ({', '.join(crops)}), {human_bytes(disk_bytes(truth))}")
    return "\n".join(lines)


def describe_zarr(path: Path) -> str:
    """Levels and metadata of a multiscale group, the metadata of an array, or the children of a group."""
    location = resolve(path)
    zarray = location.read_json(".zarray")
    attrs = location.read_json(".zattrs") or {}
    if zarray is not None:
        lines = [f"zarr array {path}", f"  shape {tuple(zarray['shape'])}, dtype {zarray['dtype']}, "
                                        f"chunks {tuple(zarray['chunks'])}, compressor {zarray.get('compressor')}"]
        lines += [f"  attribute {k}: {v}" for k, v in attrs.items()]
        return "\n".join(lines)
    if location.read_json(".zgroup") is None:
        raise ValueError(f"{path}: neither a zarr array (.zarray) nor a group (.zgroup)")
    if "multiscales" in attrs:
        lines = [f"OME-NGFF multiscale group {path} ({attrs['multiscales'][0].get('name', '')})",
                 f"  {'level':<6} {'voxel size (nm)':>16} {'translation (nm)':>26} {'shape (z,y,x)':>18} {'dtype':>7}"]
        for lv in parse_multiscales(attrs, source=str(path)):
            meta = location.join(lv.path).read_json(".zarray") or {}
            lines.append(f"  {lv.path:<6} {_fmt(lv.voxel_size_nm):>16} {_fmt(lv.translation_nm, ', '):>26} "
                         f"{_fmt(tuple(meta.get('shape', ()))):>18} {meta.get('dtype', '?'):>7}")
        return "\n".join(lines)
    children = sorted(p.name for p in path.iterdir() if (p / ".zarray").exists() or (p / ".zgroup").exists())
    return f"zarr group {path}: {len(children)} children\n  " + "\n  ".join(children)


def describe(path: str | os.PathLike[str], *, pad_value: int = 0) -> str:
    """`cellseg info PATH`: pick the right description for what `path` is."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    if (path / ".zarray").exists() or (path / ".zgroup").exists():
        return describe_zarr(path)
    return describe_root(path, pad_value)
