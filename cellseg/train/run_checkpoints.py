"""Complete, atomic checkpoints and the top-k bookkeeping of a run directory.

A checkpoint holds everything needed to continue bit for bit: the unwrapped model's weights, optimizer,
scheduler, GradScaler and EMA states, the step, the micro-batch size after any OOM back-off, every RNG
state (Python, NumPy, torch CPU and CUDA), the resolved config, package versions, the git commit and the
validation metric. It is written to a temporary file and renamed, so a crash never leaves a truncated
`last.pt`; weights holding NaN or infinity are never written (`NonFiniteError`). Everything in it loads with
`weights_only=True` (`cellseg.runtime.checkpoint.load`): the NumPy RNG state is stored as a tensor.

Layout: `run_dir/checkpoints/last.pt`, `step_<N>.pt` for the `keep_top_k` best validation scores,
`best.pt` (a hard link, or a copy, of the best one) and `index.json` (step → metric).

Resuming reads `last.pt`; when it is truncated or corrupt (a disk that filled up, a node that died during a
copy), `load_latest` says so and falls back to the newest intact `step_<N>.pt`, then `best.pt`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cellseg.runtime.checkpoint import CheckpointError, load, nonfinite_tensors, save_atomic, save_atomic_text

log = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """Training produced NaN or infinite values; nothing non-finite was written as a checkpoint."""


def rng_state() -> dict[str, Any]:
    """Every random generator a run touches, in a form `weights_only` loading accepts."""
    # The legacy global NumPy generator is saved because libraries (and user hooks) may draw from it.
    name, key, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002
    numpy_state = {"bit_generator": name, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                   "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore `rng_state()` (also the NumPy tuple of checkpoints written before it was a tensor).

    The states may arrive on the GPU (a checkpoint loaded with `map_location="cuda"`); the generators take
    them from host memory, so every tensor is copied back first.
    """
    random.setstate(state["python"])
    numpy_state = state["numpy"]
    if isinstance(numpy_state, dict):
        key = numpy_state["key"].cpu().numpy().astype(np.uint32)  # stored as int64: uint32 does not fit a tensor
        numpy_state = (numpy_state["bit_generator"], key, numpy_state["pos"], numpy_state["has_gauss"],
                       numpy_state["cached_gaussian"])
    np.random.set_state(numpy_state)  # noqa: NPY002 - see rng_state
    torch.set_rng_state(state["torch"].cpu())
    if torch.cuda.is_available() and state.get("cuda"):
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def check_finite_state(state: dict[str, Any]) -> None:
    """Refuse a checkpoint whose model or EMA weights hold NaN or infinity.

    Raises:
        NonFiniteError: naming the step and the first tensors affected.
    """
    for part in ("model", "ema"):
        bad = nonfinite_tensors(state.get(part) or {})
        if bad:
            raise NonFiniteError(f"step {state.get('step')}: {part} weights hold NaN or infinite values "
                                 f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); no checkpoint written")


def candidates(directory: Path) -> list[Path]:
    """Checkpoints to resume from, newest first: `last.pt`, `step_<N>.pt` by descending N, `best.pt`."""
    steps = sorted(((int(m[1]), p) for p in directory.glob("step_*.pt") if (m := re.fullmatch(r"step_(\d+)\.pt", p.name))),
                   reverse=True)
    return [p for p in [directory / "last.pt", *(p for _, p in steps), directory / "best.pt"] if p.is_file()]


def load_latest(directory: Path, map_location: str | torch.device = "cpu") -> tuple[dict[str, Any], Path]:
    """The newest intact checkpoint of `directory` and its path; corrupt ones are named and skipped.

    Raises:
        FileNotFoundError: no checkpoint at all.
        CheckpointError: every checkpoint is corrupt (each is named with its error).
    """
    found = candidates(directory)
    if not found:
        raise FileNotFoundError(f"{directory}: no checkpoint to resume from (no last.pt, step_<N>.pt or best.pt)")
    errors = []
    for path in found:
        try:
            ckpt = load(path, map_location=map_location)
        except CheckpointError as err:
            errors.append(str(err))
            log.warning("%s; trying an older checkpoint", err)
            continue
        if errors:
            log.warning("resuming from %s (step %s) instead of the corrupt %s", path, ckpt.get("step"),
                        ", ".join(str(p) for p in found[: len(errors)]))
        return ckpt, path
    raise CheckpointError("no intact checkpoint to resume from:\n  " + "\n  ".join(errors))


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

    def remove_partial_files(self) -> None:
        """Delete temporary files a killed writer left (call it holding the run directory's lock)."""
        for tmp in self.directory.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
            log.info("removed %s, left by an interrupted checkpoint write", tmp)

    def save_last(self, state: dict[str, Any]) -> Path:
        """Overwrite `last.pt` atomically (never with non-finite weights: `check_finite_state`)."""
        check_finite_state(state)
        path = self.directory / "last.pt"
        save_atomic(state, path)
        return path

    def offer(self, state: dict[str, Any], step: int, score: float) -> bool:
        """Keep this checkpoint if it is among the `top_k` best; update `best.pt`. Returns True if kept.

        A NaN score (a validation that scored nothing) is never kept. Of equal scores the later step ranks first.
        """
        if not math.isfinite(score):
            log.warning("step %d: validation score %s is not a number; not a candidate for best.pt", step, score)
            return False
        check_finite_state(state)
        # best first; a tie goes to the later step (a validation that cannot tell checkpoints apart keeps the newest)
        ranked = sorted({**self.scores, step: score}.items(), key=lambda kv: (-kv[1], -kv[0]))[: self.top_k]
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
