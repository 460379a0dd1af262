"""Writing zarr v2 arrays and OME-NGFF multiscale groups, atomically, and replacing only what cellseg wrote.

Every writer builds its output under a hidden temporary sibling (`.<name>.tmp-<host>-<pid>-<id>`) and renames
it into place only when complete, so a crash never leaves a half-written array that looks valid. The host and
pid in the name let a later writer of the same target remove what a killed one left (`sweep_stale`).

An existing target is never replaced unless `overwrite=True`, and then only when it is an artifact of the
same kind that cellseg wrote (`artifact_kind`: its own marker, e.g. the `cellseg` entry of a prediction
store's `.zattrs` or a synthetic root's `synth.json`): never a run directory, a data root or a folder of
other files (`describe` names what it is). Missing parent groups (`.zgroup`) are created from the enclosing
`*.zarr` directory down, so the hierarchy stays readable by zarr and the challenge's tools.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import re
import shutil
import socket
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cellseg.data.ngff import build_multiscales, pyramid_levels

log = logging.getLogger(__name__)
LabelKind = Literal["em", "labels"]
DEFAULT_CHUNK = 64  # voxels per axis; 64³ uint8 = 256 KiB, a good unit for patch reads and HTTP fetches
MIN_LEVEL_SIZE = 16  # stop the pyramid before any axis drops below this many voxels


def _compressor() -> Any:
    from numcodecs import Blosc

    return Blosc(cname="zstd", clevel=3, shuffle=Blosc.BITSHUFFLE)


def ensure_groups(path: str | os.PathLike[str]) -> None:
    """Make `path` and its ancestors up to the enclosing `*.zarr` directory zarr groups (`.zgroup`).

    Without a `*.zarr` ancestor only `path` itself becomes a group.
    """
    path = Path(path)
    chain = [path]
    for parent in path.parents:
        if chain[-1].name.endswith(".zarr"):
            break
        chain.append(parent)
    else:
        chain = [path]
    for directory in chain:
        directory.mkdir(parents=True, exist_ok=True)
        marker = directory / ".zgroup"
        if not marker.exists() and not (directory / ".zarray").exists():
            marker.write_text(json.dumps({"zarr_format": 2}))


# What `atomic_dir` may replace when its caller names no kind (`write_array`, `write_multiscale` callers, stores).
OUTPUT_KINDS = ("zarr array", "multiscale image", "probabilities store", "segmentation store")
SYNTH_ROOT = "synthetic data root"
IMPORTED_ROOT = "imported data root"  # written by `cellseg import` (its `import.json`)
VOLUME_STORE = "volume prediction store"  # written by `cellseg predict-volume` (cellseg.volume.store)
TRUTH_STORE = "truth store"  # written by `cellseg truth` (the `cellseg_truth` entry of its `.zattrs`)
EXPORTED_MODEL = "exported model"  # `cellseg export`: model.json or ensemble.json of format "cellseg-export"
_TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.(?:tmp|old)-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{8}$")


def owner_tag() -> str:
    """`<host>-<pid>` of this process, carried by temporary names so that staleness is decidable later."""
    return f"{socket.gethostname()}-{os.getpid()}"


def process_alive(host: str, pid: int) -> bool | None:
    """Whether process `pid` of `host` runs; None when `host` is another machine (undecidable from here)."""
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether `pid` has exited and waits to be reaped: a container's init (or a killed parent's orphan reaper)
    may never reap it, and a zombie writes nothing. False where /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()  # the command name in parentheses may hold spaces
    return bool(fields) and fields[0] in ("Z", "X")


def temp_sibling(path: Path, tag: Literal["tmp", "old"] = "tmp") -> Path:
    """A hidden sibling name for `path` that carries this process's host and pid."""
    return path.with_name(f".{path.name}.{tag}-{owner_tag()}-{uuid.uuid4().hex[:8]}")


def sweep_stale(path: Path) -> list[Path]:
    """Remove the temporary siblings of `path` that processes of this host left and no longer use.

    Only names `temp_sibling` makes are considered, and only those of a pid that no longer runs here.
    """
    path = Path(path)
    removed: list[Path] = []
    if not path.parent.is_dir():
        return removed
    for entry in path.parent.glob(f".{glob.escape(path.name)}.*-*"):
        match = _TEMP_NAME.match(entry.name)
        if match is None or match["target"] != path.name or process_alive(match["host"], int(match["pid"])) is not False:
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        log.warning("removed %s, left by process %s of %s, which no longer runs", entry, match["pid"], match["host"])
        removed.append(entry)
    return removed


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _only_levels(path: Path, attrs: Mapping[str, Any]) -> bool:
    try:
        levels = {d["path"] for d in attrs["multiscales"][0]["datasets"]}
    except (KeyError, IndexError, TypeError):
        return False
    return all(p.name in levels or p.name in (".zgroup", ".zattrs") for p in path.iterdir())


def artifact_kind(path: str | os.PathLike[str]) -> str | None:
    """What cellseg wrote at `path`, read from the marker it wrote there; None for anything else.

    Stores and roots carry a marker: "probabilities store" / "segmentation store" / "volume prediction store"
    (the `cellseg` entry of `.zattrs`), "truth store" (its `cellseg_truth` entry), "synthetic data root" (`synth.json` by `cellseg synth`), "imported data root" (`import.json`
    by `cellseg import`). Single images are recognised by their
    form, which is what `write_array` / `write_multiscale` callers name: "zarr array", "multiscale image" (a
    group holding only its levels).
    """
    path = Path(path)
    if not path.is_dir():
        return None
    if (path / ".zarray").is_file():
        return "zarr array"
    attrs = _read_json(path / ".zattrs")
    store = attrs.get("cellseg")
    if isinstance(store, dict) and store.get("kind") in ("probabilities", "segmentation"):
        return f"{store['kind']} store"
    if isinstance(store, dict) and store.get("kind") == "volume-prediction":  # `cellseg predict-volume`
        return VOLUME_STORE
    if isinstance(attrs.get("cellseg_truth"), dict):  # `cellseg truth` (cellseg.eval.truth_store.MARKER)
        return TRUTH_STORE
    if "multiscales" in attrs and _only_levels(path, attrs):
        return "multiscale image"
    if _read_json(path / "synth.json").get("generator") == "cellseg synth":
        return SYNTH_ROOT
    if _read_json(path / "import.json").get("generator") == "cellseg import":
        return IMPORTED_ROOT
    if any(_read_json(path / name).get("format") == "cellseg-export" for name in ("model.json", "ensemble.json")):
        return EXPORTED_MODEL
    return None


def describe(path: str | os.PathLike[str]) -> str:
    """What `path` is, in words, for error messages ("a training run directory", "a data root", ...)."""
    path = Path(path)
    if path.is_symlink():
        return f"a symbolic link (to {os.readlink(path)})"
    if not path.exists():
        return "absent"
    if not path.is_dir():
        return "a file"
    if (path / "checkpoints").is_dir() or ((path / "config.yaml").is_file() and (path / "meta.json").is_file()):
        return "a training run directory (config.yaml, meta.json, checkpoints/)"
    kind = artifact_kind(path)
    if kind:
        return f"a cellseg {kind}"
    entries = sorted(p.name for p in path.iterdir())
    nested_zarr = any(path.glob("*/*.zarr"))
    if nested_zarr or any(e.endswith(".zarr") for e in entries) or {"datasplit.csv", "manifest.csv"} & set(entries):
        return "a data root (datasets, manifests)"
    if ".zgroup" in entries or ".zattrs" in entries:
        return "a zarr store that cellseg did not write"
    shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
    count = f"{len(entries)} {'entry' if len(entries) == 1 else 'entries'}"
    return f"a folder of {count} that cellseg did not write ({shown})" if entries else "an empty folder"


def check_replaceable(path: Path, *, overwrite: bool, kind: str | None) -> None:
    """Raise unless `overwrite` may replace the existing `path` with a new artifact of `kind` (module docstring).

    Raises:
        FileExistsError: `overwrite` is False, or `path` is not a cellseg artifact of that kind (the message
            says what it is).
    """
    if not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True (--overwrite) to replace it")
    if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        return  # an empty folder: nothing to lose
    allowed = (kind,) if kind else OUTPUT_KINDS
    if path.is_symlink() or artifact_kind(path) not in allowed:
        raise FileExistsError(f"{path} is {describe(path)}; --overwrite replaces only a {' or '.join(allowed)} that "
                              "cellseg wrote. Remove it yourself or choose another path")


def with_path(err: OSError, path: Path) -> OSError:
    """The same error (same errno and class) with a message naming `path`, the target the caller knows (an error
    already named by an inner writer is renamed for the outer target); errors without errno pass unchanged."""
    if err.errno is None:
        return err
    reason = getattr(err, "reason", None) or err.strerror or str(err)
    out = OSError(err.errno, f"{reason} (writing {path})")
    out.reason = reason  # type: ignore[attr-defined]
    return out


def replace_dir(new: Path, path: Path) -> None:
    """Move the finished directory `new` to `path`, replacing what is there (renamed aside, then removed)."""
    if path.exists():
        old = temp_sibling(path, "old")
        path.rename(old)
        new.rename(path)
        shutil.rmtree(old)
    else:
        new.rename(path)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str], *, overwrite: bool = False, kind: str | None = None) -> Iterator[Path]:
    """Yield a temporary directory that replaces `path` when the block exits without error.

    Args:
        overwrite: replace an existing `path`, only when it is a cellseg artifact of `kind` (`check_replaceable`).
        kind: what is being written (`artifact_kind` names); None: any of `OUTPUT_KINDS`.

    Raises:
        FileExistsError: `path` exists and may not be replaced.
        OSError: a write failed (disk full, read-only, permissions); the message names `path`.
    """
    path = Path(path)
    sweep_stale(path)
    if path.exists() or path.is_symlink():
        check_replaceable(path, overwrite=overwrite, kind=kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        try:
            yield tmp
            replace_dir(tmp, path)
        except OSError as err:
            raise with_path(err, path) from err
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _chunks_for(shape: Sequence[int], chunks: Sequence[int] | None) -> tuple[int, ...]:
    if chunks is None:
        chunks = [DEFAULT_CHUNK] * len(shape)
    return tuple(max(1, min(int(c), int(s))) for c, s in zip(chunks, shape, strict=True))


def _write_zarr_array(path: Path, data: np.ndarray, *, chunks: Sequence[int] | None,
                      attrs: Mapping[str, Any] | None) -> None:
    import zarr

    array = zarr.open_array(
        str(path), mode="w-", shape=data.shape, dtype=data.dtype, chunks=_chunks_for(data.shape, chunks),
        compressor=_compressor(), fill_value=0, dimension_separator="/",
    )
    array[...] = data
    if attrs:
        array.attrs.update(dict(attrs))


def create_multiscale_level(path: str | os.PathLike[str], shape: Sequence[int], dtype: np.dtype | str, *,
                            voxel_size_nm: Sequence[float], translation_nm: Sequence[float],
                            chunks: Sequence[int] | None = None) -> Any:
    """Create an empty one-level OME-NGFF multiscale group (`s0` filled with 0) to be written region by
    region; returns the writable zarr array of `s0`. The caller owns atomicity (build it inside a temporary
    directory and rename the whole thing)."""
    import zarr

    path = Path(path)
    path.mkdir(parents=True)
    (path / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    level = pyramid_levels(voxel_size_nm, translation_nm, 1)
    (path / ".zattrs").write_text(json.dumps(build_multiscales(level, name=path.name), indent=2))
    shape = tuple(int(n) for n in shape)
    return zarr.open_array(str(path / level[0].path), mode="w-", shape=shape, dtype=np.dtype(dtype),
                           chunks=_chunks_for(shape, chunks), compressor=_compressor(), fill_value=0,
                           dimension_separator="/")


def write_array(path: str | os.PathLike[str], data: np.ndarray, *, attrs: Mapping[str, Any] | None = None,
                chunks: Sequence[int] | None = None, overwrite: bool = False) -> Path:
    """Write one single-scale zarr v2 array (e.g. a submission's `crop<N>/<label>` with voxel_size attrs)."""
    path = Path(path)
    with atomic_dir(path, overwrite=overwrite, kind="zarr array") as tmp:
        _write_zarr_array(tmp, np.asarray(data), chunks=chunks, attrs=attrs)
    ensure_groups(path.parent)
    return path


def downsample_2x(data: np.ndarray, kind: LabelKind, factors: Sequence[int] = (2, 2, 2)) -> np.ndarray:
    """Down-sample a (z, y, x) volume by integer factors.

    `em`: block mean, rounded back to the input dtype (explicitly). `labels`: block mode, ties going to
    the larger id so that thin structures (membranes, pores) survive one level down.
    Odd sizes are padded by repeating the edge, so an n-voxel axis becomes ceil(n / factor).
    """
    pad = [(0, (-n) % f) for n, f in zip(data.shape, factors, strict=True)]
    if any(p for _, p in pad):
        data = np.pad(data, pad, mode="edge")
    fz, fy, fx = factors
    z, y, x = (n // f for n, f in zip(data.shape, factors, strict=True))
    blocks = data.reshape(z, fz, y, fy, x, fx).transpose(0, 2, 4, 1, 3, 5).reshape(z, y, x, fz * fy * fx)
    if kind == "em":
        mean = blocks.mean(axis=-1, dtype=np.float64)
        if np.issubdtype(data.dtype, np.integer):
            return np.rint(mean).astype(data.dtype)
        return mean.astype(data.dtype)
    if kind != "labels":
        raise ValueError(f"kind must be 'em' or 'labels', got {kind!r}")
    out = np.empty((z, y, x), dtype=data.dtype)
    for zi in range(z):  # slab by slab: the pairwise comparison is (y, x, n, n) booleans
        s = -np.sort(-blocks[zi].astype(np.int64), axis=-1) if np.issubdtype(data.dtype, np.signedinteger) \
            else np.sort(blocks[zi], axis=-1)[..., ::-1]
        counts = (s[..., :, None] == s[..., None, :]).sum(axis=-1)
        out[zi] = np.take_along_axis(s, counts.argmax(axis=-1)[..., None], axis=-1)[..., 0]
    return out


def default_num_levels(shape: Sequence[int], min_size: int = MIN_LEVEL_SIZE, max_levels: int = 8) -> int:
    """Levels of a 2× pyramid until an axis would drop below `min_size` voxels (at least 1)."""
    n, size = 1, min(shape)
    while n < max_levels and size // 2 >= min_size:
        size //= 2
        n += 1
    return n


def write_multiscale(
    path: str | os.PathLike[str],
    data: np.ndarray,
    *,
    voxel_size_nm: Sequence[float],
    translation_nm: Sequence[float],
    kind: LabelKind,
    num_levels: int | None = None,
    chunks: Sequence[int] | None = None,
    name: str | None = None,
    attrs: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a (z, y, x) volume as an OME-NGFF 0.4 multiscale group `s0, s1, ...` (2× pyramid).

    Args:
        path: the group directory to create (e.g. `.../labels/groundtruth/crop1/mito`).
        data: level `s0`.
        voxel_size_nm, translation_nm: grid of `s0` (translation = centre of voxel 0).
        kind: "em" (mean down-sampling) or "labels" (mode down-sampling).
        num_levels: pyramid depth; default until an axis would fall below 16 voxels.
        chunks: chunk shape (default 64³, clipped to the array).
        name: `multiscales[0].name`; default the directory name.
        attrs: extra group attributes.
        overwrite: replace an existing group.
    """
    path = Path(path)
    data = np.asarray(data)
    if data.ndim != 3:
        raise ValueError(f"{path}: expected a 3D (z, y, x) volume, got shape {data.shape}")
    num_levels = num_levels or default_num_levels(data.shape)
    levels = pyramid_levels(voxel_size_nm, translation_nm, num_levels)
    with atomic_dir(path, overwrite=overwrite, kind="multiscale image") as tmp:
        tmp.mkdir()
        (tmp / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
        (tmp / ".zattrs").write_text(json.dumps({**build_multiscales(levels, name=name or path.name),
                                                 **dict(attrs or {})}, indent=2))
        level_data = data
        for i, level in enumerate(levels):
            if i:
                level_data = downsample_2x(level_data, kind)
            _write_zarr_array(tmp / level.path, level_data, chunks=chunks, attrs=None)
    ensure_groups(path.parent)
    return path
