"""Checkpoint files, shared by training (writing them) and inference (reading them), and what a run records
about its software: package versions and the git commit.

Writes go to a temporary sibling, are flushed to disk and renamed into place, so a crash never leaves a
truncated file; a failed write (disk full, read-only file system, permissions) raises an `OSError` naming the
checkpoint, where torch itself would say "unexpected pos 117440 vs 117336".

Reads never run code: `load` unpickles with `weights_only=True`, which admits tensors and plain Python
containers and numbers only. A checkpoint holds nothing else, except the NumPy RNG state of checkpoints
written before it was stored as a tensor: NumPy's array reconstruction (data, not code) is allow-listed for
those, so old checkpoints stay loadable. A crafted pickle that would call anything else is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import subprocess
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)
PACKAGES = ("cellseg", "torch", "numpy", "monai", "timm", "zarr", "tensorstore")
HASH_BLOCK = 1 << 24  # bytes read at a time when hashing a file


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: truncated, corrupt, or holding objects a safe load refuses."""


def versions() -> dict[str, str]:
    """Installed versions of the packages that shape a run's results."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["cuda"] = str(torch.version.cuda)
    out["cudnn"] = str(torch.backends.cudnn.version())
    return out


def git_commit(path: str | os.PathLike[str] | None = None) -> str:
    """The commit of the cellseg checkout (or "unknown" outside a git tree)."""
    here = Path(path or Path(__file__).resolve().parent)
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def _write_error(err: BaseException, path: Path) -> OSError | None:
    """The OSError behind a failed write (torch wraps it in a RuntimeError), with `path` in its message."""
    cause = err if isinstance(err, OSError) else err.__context__
    if not isinstance(cause, OSError) or cause.errno is None:
        return None
    return OSError(cause.errno, f"cannot write checkpoint {path}: {cause.strerror}")


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system lets a directory be opened
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_atomic(obj: Any, path: Path) -> None:
    """torch.save to a temporary sibling, flush it to disk, then rename over `path`.

    Raises:
        OSError: the write failed (disk full, read-only, permissions); the message names `path`, and `path`
            keeps its previous content.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        named = _write_error(err, path)
        if named is None:
            raise
        raise named from err
    _fsync_dir(path.parent)


def save_atomic_text(text: str, path: Path) -> None:
    """Write text to a temporary sibling, then rename over `path` (OSError names `path`)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OSError(err.errno, f"cannot write {path}: {err.strerror}") from err


def _numpy_globals() -> list[Any]:
    """NumPy's array reconstruction, which RNG states of older checkpoints need (data only, no code)."""
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file (a checkpoint, a package's file), read in blocks of `HASH_BLOCK` bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def load(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint safely (`weights_only=True`; module docstring).

    Raises:
        FileNotFoundError: no such file (the message lists the checkpoints present next to it).
        CheckpointError: the file is truncated or corrupt, or holds objects a weights-only load refuses
            (a crafted or foreign pickle); the message names the file.
    """
    path = Path(path)
    if not path.is_file():
        present = sorted(p.name for p in path.parent.glob("*.pt")) if path.parent.is_dir() else []
        raise FileNotFoundError(f"{path}: no checkpoint here (present: {present or 'none'})")
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        reason = _unpickling_reason(err)
        if "Unsupported global" in reason:
            raise CheckpointError(f"{path}: refusing to load: it holds objects other than tensors and plain data, "
                                  f"which could run code ({reason}). Only load checkpoints written by cellseg") from None
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({reason})") from None
    except Exception as err:  # a damaged file raises RuntimeError, EOFError, IndexError, ... depending on where
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint "
                              f"({_first_sentence(str(err)) or type(err).__name__})") from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path}: not a cellseg checkpoint (holds a {type(ckpt).__name__}, not a dict)")
    return ckpt


def _unpickling_reason(err: pickle.UnpicklingError) -> str:
    """The line of torch's weights-only error that says what was refused (not its advice)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    named = [line for line in lines if "WeightsUnpickler error" in line or "Unsupported" in line]
    return _first_sentence((named or lines or [type(err).__name__])[0].removeprefix("WeightsUnpickler error: "))


def _first_sentence(text: str) -> str:
    return text.strip().splitlines()[0].split(". ")[0].rstrip(".") if text.strip() else text


def nonfinite_tensors(state: Mapping[str, Any]) -> list[str]:
    """Names of the floating-point tensors in `state` (a state dict) holding NaN or infinity."""
    names = [k for k, v in state.items() if torch.is_tensor(v) and v.is_floating_point()]
    if not names:
        return []
    finite = torch.stack([torch.isfinite(state[k]).all() for k in names]).cpu()  # one host sync for all
    return [k for k, ok in zip(names, finite.tolist(), strict=True) if not ok]


def check_finite_weights(state: Mapping[str, Any], *, source: str) -> None:
    """Raise if a state dict holds NaN or infinite weights.

    Raises:
        ValueError: naming `source` and the first tensors affected.
    """
    bad = nonfinite_tensors(state)
    if bad:
        raise ValueError(f"{source}: {len(bad)} weight tensors hold NaN or infinite values "
                         f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); training diverged")


def check_checkpoint_channels(ckpt: Mapping[str, Any], channels: Sequence[str], *, source: str) -> None:
    """Raise unless the output channels a checkpoint was trained for are `channels`, in that order.

    The checkpoint's list is its `meta["channels"]` (classes, then `<class>_boundary` channels); checkpoints
    without one are compared on their config's `data.classes`. A model of the same architecture and channel
    count but another class order loads without complaint and predicts every class under another's name, so
    this check is what catches it.

    Raises:
        ValueError: the lists differ; the message names `source` and both lists.
    """
    recorded = list((ckpt.get("meta") or {}).get("channels") or [])
    expected = list(channels)
    if not recorded:
        recorded = list(((ckpt.get("config") or {}).get("data") or {}).get("classes") or [])
        expected = [c for c in expected if not c.endswith("_boundary")]
    if not recorded:
        log.warning("%s records no channel list; cannot check it against %s", source, expected)
        return
    if recorded != expected:
        raise ValueError(f"{source}: trained for channels {recorded}, but the run expects {expected}; "
                         "a checkpoint from another run (or class order) would put every class under another's name")


MODEL_KEYS = ("name", "preset", "params", "spatial_dims", "in_channels", "out_channels")  # what the weights fit


def check_checkpoint_model(ckpt: dict[str, Any], model: Mapping[str, Any], *, source: str) -> dict[str, Any]:
    """`ckpt`, when it was written by the model `model` describes (`ModelSpec.to_dict()`), compared on
    `MODEL_KEYS`; checkpoints that record no model pass (their weights are checked when loaded).

    Raises:
        ValueError: naming `source`, the checkpoint's architecture and the config's, and the keys that differ.
    """
    recorded = (ckpt.get("meta") or {}).get("model")
    if not recorded:
        return ckpt
    differ = [k for k in MODEL_KEYS if recorded.get(k) != model.get(k)]
    if differ:
        raise ValueError(f"{source}: written by {recorded.get('name')} ({recorded.get('preset')}), but the config "
                         f"builds {model.get('name')} ({model.get('preset')}); they differ in {', '.join(differ)}. "
                         "Resume with the run's own config (run_dir/config.yaml) or train into another run_dir")
    return ckpt
