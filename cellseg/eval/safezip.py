"""Checks on a submission zip before a single byte of array data is read from it.

Submissions come from strangers when a lab hosts its own leaderboard, so a zip is inspected from its
central directory alone and rejected when any member

- has an absolute path, a drive letter, a backslash or a `..` component (zip slip);
- is a symbolic link, a device or FIFO, or is encrypted; or appears twice;

or when the archive as a whole

- has more members or more decompressed bytes than the configured limits (default 50 GiB, the official
  evaluator's `MAX_UNCOMPRESSED_SIZE`);
- decompresses to far more than its arrays can hold: every chunk file of an array must fit that array's
  declared chunk size (plus codec slack), and files that belong to no declared array are capped in total.

cellseg never extracts a submission: arrays are read in place through `zarr.ZipStore`, and Python's
`zipfile` stops decompressing a member at its declared size, so these limits bound what scoring reads.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import stat
import zipfile
from dataclasses import dataclass, field

import numpy as np

METADATA_NAMES = frozenset({".zarray", ".zattrs", ".zgroup", ".zmetadata"})
MAX_PROBLEMS_SHOWN = 8


class UnsafeZipError(ValueError):
    """The zip was refused before anything was read from it (the message lists why)."""


@dataclass(frozen=True, kw_only=True)
class ZipLimits:
    """What a submission zip may contain.

    Attributes:
        max_members: number of entries.
        max_total_bytes: total decompressed size (the official evaluator's limit is 50 GiB).
        max_metadata_bytes: size of one `.zarray`/`.zattrs`/`.zgroup` file.
        max_other_bytes: total size of files that are not chunks of a declared array.
        slack_ratio: allowed expansion of a compressed chunk over its raw size.
        slack_bytes_per_chunk: constant codec overhead allowed per chunk file.
    """

    max_members: int = 2_000_000
    max_total_bytes: int = 50 * 1024**3
    max_metadata_bytes: int = 16 * 1024**2
    max_other_bytes: int = 64 * 1024**2
    slack_ratio: float = 1.1
    slack_bytes_per_chunk: int = 4096


@dataclass(frozen=True, kw_only=True)
class ZipIndex:
    """What the inspection learned: member names (normalised) and declared array sizes."""

    names: tuple[str, ...]
    total_bytes: int
    declared_bytes: int
    arrays: dict[str, int] = field(default_factory=dict)  # array directory -> declared raw bytes


def clean_member_name(name: str) -> tuple[str | None, str | None]:
    """Normalised member name, or (None, reason) for a name that could escape the extraction root."""
    if "\x00" in name or "\\" in name:
        return None, "contains a backslash or NUL"
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return None, "is an absolute path"
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        return None, "contains a '..' component"
    return "/".join(parts), None


def _member_type_problem(info: zipfile.ZipInfo) -> str | None:
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    if kind == stat.S_IFLNK:
        return "is a symbolic link"
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        return "is not a regular file or directory"
    if info.flag_bits & 0x1:
        return "is encrypted"
    return None


def _declared_chunk_bytes(meta: dict) -> tuple[int, int]:
    """(bytes of one raw chunk, number of chunks in the grid) from a `.zarray` document."""
    shape = [int(s) for s in meta["shape"]]
    chunks = [int(c) for c in meta["chunks"]]
    if len(shape) != len(chunks) or any(s < 0 for s in shape) or any(c <= 0 for c in chunks):
        raise ValueError("inconsistent shape/chunks")
    itemsize = np.dtype(meta["dtype"]).itemsize
    grid = math.prod(math.ceil(s / c) for s, c in zip(shape, chunks, strict=True))
    return math.prod(chunks) * itemsize, grid


def _open(path: str | os.PathLike[str]) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path, "r")
    except zipfile.BadZipFile as err:
        raise ValueError(f"{path}: not a valid zip archive ({err}); is the file complete?") from None


def _read_zarray(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> dict | None:
    try:
        return json.loads(archive.read(info))
    except (ValueError, zipfile.BadZipFile, OSError):
        return None  # unreadable metadata: its directory's files count as "other" bytes


def _name_problems(infos: list[zipfile.ZipInfo], limits: ZipLimits) -> tuple[dict[str, zipfile.ZipInfo], list[str]]:
    problems: list[str] = []
    if len(infos) > limits.max_members:
        problems.append(f"{len(infos)} members, more than the limit of {limits.max_members}")
    members: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        clean, reason = clean_member_name(info.filename)
        reason = reason or _member_type_problem(info)
        if reason:
            problems.append(f"member {info.filename!r} {reason}")
        elif clean in members:
            problems.append(f"member {clean!r} appears more than once")
        elif clean:
            members[clean] = info
    return members, problems


def _size_problems(archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], limits: ZipLimits
                   ) -> tuple[list[str], dict[str, int]]:
    problems: list[str] = []
    arrays: dict[str, tuple[int, int]] = {}
    for name, info in members.items():
        base = posixpath.basename(name)
        if base in METADATA_NAMES and info.file_size > limits.max_metadata_bytes:
            problems.append(f"metadata file {name!r} is {info.file_size} bytes")
        elif base == ".zarray" and (meta := _read_zarray(archive, info)) is not None:
            try:
                arrays[posixpath.dirname(name)] = _declared_chunk_bytes(meta)
            except (KeyError, TypeError, ValueError):
                pass
    other_bytes, used = 0, dict.fromkeys(arrays, 0)
    for name, info in members.items():
        if info.is_dir() or posixpath.basename(name) in METADATA_NAMES:
            continue
        owner = posixpath.dirname(name)
        while owner and owner not in arrays:
            owner = posixpath.dirname(owner)
        if not owner:
            other_bytes += info.file_size
            continue
        chunk_bytes, _ = arrays[owner]
        if info.file_size > chunk_bytes * limits.slack_ratio + limits.slack_bytes_per_chunk:
            problems.append(f"chunk {name!r} decompresses to {info.file_size} bytes but its array declares "
                            f"chunks of {chunk_bytes} bytes")
        used[owner] += info.file_size
    for owner, (chunk_bytes, grid) in arrays.items():
        allowed = grid * (chunk_bytes * limits.slack_ratio + limits.slack_bytes_per_chunk)
        if used[owner] > allowed:
            problems.append(f"array {owner!r} holds {used[owner]} decompressed bytes, more than its declared "
                            f"shape allows ({int(allowed)})")
    if other_bytes > limits.max_other_bytes:
        problems.append(f"{other_bytes} decompressed bytes belong to no declared array "
                        f"(limit {limits.max_other_bytes})")
    return problems, {k: v[0] * v[1] for k, v in arrays.items()}


def inspect_zip(path: str | os.PathLike[str], limits: ZipLimits | None = None) -> ZipIndex:
    """Inspect a submission zip from its central directory and `.zarray` files only.

    Raises:
        ValueError: the file is not a zip archive (corrupt, truncated).
        UnsafeZipError: the archive breaks one of the rules in the module docstring.
    """
    limits = limits or ZipLimits()
    with _open(path) as archive:
        members, problems = _name_problems(archive.infolist(), limits)
        total = sum(i.file_size for i in members.values())
        if total > limits.max_total_bytes:
            problems.append(f"decompresses to {total / 1024**3:.2f} GiB, more than the limit of "
                            f"{limits.max_total_bytes / 1024**3:.2f} GiB")
        if not problems:
            size_problems, arrays = _size_problems(archive, members, limits)
            problems += size_problems
    if problems:
        shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
        more = f" (and {len(problems) - MAX_PROBLEMS_SHOWN} more)" if len(problems) > MAX_PROBLEMS_SHOWN else ""
        raise UnsafeZipError(f"{path}: refused before reading anything: {shown}{more}")
    return ZipIndex(names=tuple(sorted(members)), total_bytes=total, declared_bytes=sum(arrays.values()),
                    arrays=arrays)
