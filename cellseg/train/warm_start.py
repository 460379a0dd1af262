"""What a training job measures before its first step, kept for the next job of the same shape.

Two start-up measurements cost a GPU job seconds each time and give the same answer for the same model, batch,
patch, precision, GPU, software and code:

- the GPU-room probe (`cellseg.train.setup`): one eager forward + backward at the batch, whose peak memory sizes
  the GPU memory left for resident data. It is the process's first GPU work, so it also pays cuDNN's autotuning
  of every eager convolution: 5-17 s on an H200;
- `train.compile: auto` (`cellseg.train.compile_choice`): compiled and eager steps timed against each other, for the
  model and for the loss.

A job records both, and whether it compiled the model (the compile cache then holds its graphs, so a later job
compiles before its first step instead of in the background: `cellseg.train.background`), in
`$CELLSEG_CACHE/startup/<key>.json` (`cellseg.cache`); a later job with the same key
reuses them: it skips the eager probe and the eager timings, and compiles only what was found faster (from the
compile cache beside it, so a warm start loads kernels instead of building them). The key hashes everything the
answers depend on: GPU model, torch/CUDA/cuDNN versions, the model's spec, batch, patch, output channels,
precision, memory format, compile mode and backend, cuDNN and TF32 settings, the loss's configuration, and the
source of the model, loss and compile code (an edit measures again). `train.startup_cache: false` measures every
time; a record that cannot be read is ignored with a warning and rewritten.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from cellseg.cache import cache_root
from cellseg.config.load import to_dict
from cellseg.config.schema import RunConfig
from cellseg.runtime.checkpoint import versions

log = logging.getLogger(__name__)
FOLDER = "startup"
FORMAT = 1  # bump when the record's fields change meaning
_PACKAGE = Path(__file__).resolve().parents[1]
# The code whose behaviour the record captures: the networks, the loss and the layout of its targets, and how
# compiling is decided.
SOURCES = ("models", "losses.py", "data/augment.py", "train/build.py", "train/compile_choice.py", "runtime/compile.py")


def _source_digest() -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        path = _PACKAGE / name
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(file.relative_to(_PACKAGE).as_posix().encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def startup_key(cfg: RunConfig, model: torch.nn.Module, *, device: torch.device, batch: int,
                fmt: torch.memory_format, precision: str) -> str:
    """The hash that names a job's start-up record (module docstring: what it covers)."""
    tc = cfg.train
    spec = getattr(model, "spec", None)
    parts = {
        "format": FORMAT, "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": {k: v for k, v in versions().items() if k in ("torch", "cuda", "cudnn")},
        "model": spec.to_dict() if spec is not None else type(model).__qualname__,
        "batch": batch, "patch": list(cfg.data.patch_shape_vox), "channels": cfg.data.num_target_channels,
        "precision": precision, "memory_format": str(fmt), "compile_mode": tc.compile_mode,
        "backend": os.environ.get("CELLSEG_COMPILE_BACKEND", "inductor"), "cudnn_benchmark": tc.cudnn_benchmark,
        "tf32": tc.tf32, "activation_checkpointing": tc.activation_checkpointing, "loss": to_dict(cfg.loss),
        "source": _source_digest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


class StartupRecord:
    """One job's start-up record: `get`/`put` of named entries, written to disk by `save` (atomically)."""

    def __init__(self, key: str | None, *, folder: Path | None = None) -> None:
        self.key = key
        self.path = (folder or cache_root() / FOLDER) / f"{key}.json" if key else None
        self.loaded: dict[str, Any] = self._read()
        self.entries: dict[str, Any] = dict(self.loaded)

    @classmethod
    def disabled(cls) -> StartupRecord:
        """A record that reuses and keeps nothing (`train.startup_cache: false`, CPU jobs)."""
        return cls(None)

    def _read(self) -> dict[str, Any]:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format') if isinstance(data, dict) else type(data).__name__}")
        except (OSError, ValueError) as err:
            log.warning("start-up record %s is unreadable (%s): measuring again", self.path, err)
            return {}
        return data

    def get(self, name: str) -> Any:
        """The entry an earlier job recorded (None: measure it)."""
        return self.loaded.get(name)

    def put(self, name: str, value: Any) -> None:
        self.entries[name] = value

    def save(self) -> None:
        """Write the record if it changed; a read-only cache folder only costs the next job the probes."""
        if self.path is None or self.entries == self.loaded:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({**self.entries, "format": FORMAT}, indent=1, default=str))
            os.replace(tmp, self.path)
        except OSError as err:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            log.warning("start-up record %s not written (%s): the next job measures again", self.path, err)
            return
        self.loaded = dict(self.entries)
