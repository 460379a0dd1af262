"""Complete, atomic checkpoints and the top-k bookkeeping of a run directory.

A checkpoint holds everything needed to continue bit for bit: the unwrapped model's weights, optimizer,
scheduler, GradScaler and EMA states, the step, the micro-batch size after any OOM back-off, every RNG
state (Python, NumPy, torch CPU and CUDA), the resolved config, package versions, the git commit and the
validation metric. It is written to a temporary file and renamed, so a crash never leaves a truncated
`last.pt`.

Layout: `run_dir/checkpoints/last.pt`, `step_<N>.pt` for the `keep_top_k` best validation scores,
`best.pt` (a hard link, or a copy, of the best one) and `index.json` (step → metric).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cellseg.runtime.checkpoint import save_atomic, save_atomic_text

log = logging.getLogger(__name__)


def rng_state() -> dict[str, Any]:
    """Every random generator a run touches."""
    # The legacy global NumPy generator is saved because libraries (and user hooks) may draw from it.
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),  # noqa: NPY002
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore `rng_state()`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002 - see rng_state
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and state.get("cuda"):
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class CheckpointKeeper:
    """Writes `last.pt` and keeps the `top_k` best checkpoints by validation score (higher is better)."""

    directory: Path
    top_k: int = 3
    scores: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        index = self.directory / "index.json"
        if index.is_file():
            self.scores = {int(k): float(v) for k, v in json.loads(index.read_text()).items()}

    def save_last(self, state: dict[str, Any]) -> Path:
        """Overwrite `last.pt` atomically."""
        path = self.directory / "last.pt"
        save_atomic(state, path)
        return path

    def offer(self, state: dict[str, Any], step: int, score: float) -> bool:
        """Keep this checkpoint if it is among the `top_k` best; update `best.pt`. Returns True if kept."""
        ranked = sorted({**self.scores, step: score}.items(), key=lambda kv: -kv[1])[: self.top_k]
        if step not in dict(ranked):
            return False
        save_atomic(state, self.directory / f"step_{step}.pt")
        for old in set(self.scores) - set(dict(ranked)):
            (self.directory / f"step_{old}.pt").unlink(missing_ok=True)
        self.scores = dict(ranked)
        save_atomic_text(json.dumps(self.scores, indent=1), self.directory / "index.json")
        self._link_best(ranked[0][0])
        return True

    def _link_best(self, step: int) -> None:
        best, tmp = self.directory / "best.pt", self.directory / ".best.pt.tmp"
        source = self.directory / f"step_{step}.pt"
        if best.exists() and os.path.samefile(best, source):
            return  # already the best (renaming one hard link onto another would leave `tmp` behind)
        tmp.unlink(missing_ok=True)
        try:
            os.link(source, tmp)
        except OSError:  # file systems without hard links
            shutil.copyfile(source, tmp)
        os.replace(tmp, best)
