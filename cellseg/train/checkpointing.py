"""The loop's checkpoints: `last.pt` at the current step, offered for `best.pt` after a validation, and
`ranking.json` beside `index.json` saying which score (and crops) the ranking numbers are.

Every rank calls `Checkpointer.save` at the same steps; rank 0 writes (`cellseg.train.run_checkpoints`) and the
others wait for it. A step already on disk is not written again: a run resumed from `last.pt`, or stopped right
after a checkpoint, keeps the file it has. Nothing is written after a non-finite step (`cellseg.train.guard`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cellseg import runtime
from cellseg.runtime.checkpoint import save_atomic_text
from cellseg.train.guard import NonFiniteGuard
from cellseg.train.run_checkpoints import rng_state
from cellseg.train.setup import Setup

RANKING_FILE = "ranking.json"  # beside index.json: which score (and crops) its numbers are
LAST = "last.pt"


class Checkpointer:
    """Writes the checkpoints of `s` for the training loop (module docstring)."""

    def __init__(self, s: Setup, guard: NonFiniteGuard) -> None:
        self.s, self.guard = s, guard
        # A run resumed from last.pt has its current step on disk: stopping before a step must not rewrite it.
        resumed = s.resumed_from
        self.saved_step = s.state.step if resumed is not None and resumed.name == LAST else -1

    def save(self, score: float | None = None) -> Path:
        """Write `last.pt` (and offer it for `best.pt` with a validation score); returns the path of `last.pt`."""
        s = self.s
        self.guard.check()
        path = s.keeper.directory / LAST
        if s.dist.is_main and (self.saved_step != s.state.step or score is not None):
            state = s.state_dict(metric=score, rng=rng_state())
            path = s.keeper.save_last(state)
            if score is not None:
                s.keeper.offer(state, s.state.step, score)
        self.saved_step = s.state.step
        runtime.barrier(s.dist)
        return path

    def save_ranking(self, result: dict[str, Any]) -> None:
        """Write `ranking.json` for a validation `result` (rank 0; other ranks have none)."""
        if not result:
            return
        ranking = {"ranked_by": result["ranked_by"], "metric": result["metric"], "combined": "decision mode",
                   "crops": result["crops"]["tuning"], "grid": result["grid"], "note": result["ranking_note"]}
        save_atomic_text(json.dumps(ranking, indent=1), self.s.keeper.directory / RANKING_FILE)
