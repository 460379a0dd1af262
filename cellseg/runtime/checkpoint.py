"""Checkpoint files, shared by training (writing them) and inference (reading them), and what a run records
about its software: package versions and the git commit.

Writes go to a temporary sibling and are renamed into place, so a crash never leaves a truncated file.
"""

from __future__ import annotations

import logging
import os
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
PACKAGES = ("cellseg", "torch", "numpy", "monai", "timm", "zarr", "tensorstore")


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


def save_atomic(obj: Any, path: Path) -> None:
    """torch.save to a temporary sibling, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint.

    Raises:
        FileNotFoundError: naming the run directory's checkpoint folder when it is empty.
    """
    path = Path(path)
    if not path.is_file():
        present = sorted(p.name for p in path.parent.glob("*.pt")) if path.parent.is_dir() else []
        raise FileNotFoundError(f"{path}: no checkpoint here (present: {present or 'none'})")
    return torch.load(path, map_location=map_location, weights_only=False)


def save_atomic_text(text: str, path: Path) -> None:
    """Write text to a temporary sibling, then rename over `path`."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
