"""The loop's validations: one pool of validation workers for the whole run, scoring on rank 0.

Rank 0 (the ranks that validate) keeps one `cellseg.train.valpool.ValidationPool` for all the validations of a
run; its workers start at the first validation (with the loader's stop-signal behaviour,
`cellseg.train.stop`) and end with the loop on every way out. Each validation scores the validation crops
(`cellseg.train.validate.run_validation`), records them in metrics.jsonl ("val") and logs the scores; the
other ranks wait at a barrier.
"""

from __future__ import annotations

import logging
from typing import Any

from cellseg import runtime
from cellseg.train.guard import NonFiniteGuard
from cellseg.train.run_log import LOOP_LOGGER, RunLog
from cellseg.train.setup import Setup
from cellseg.train.stop import StopRequest
from cellseg.train.validate import run_validation, validation_workers
from cellseg.train.valpool import ValidationPool

log = logging.getLogger(LOOP_LOGGER)


class ValidationHook:
    """Validates the model of `s` for the loop (module docstring)."""

    def __init__(self, s: Setup, guard: NonFiniteGuard) -> None:
        self.s, self.guard = s, guard
        self.pool: ValidationPool | None = None

    def open(self, stop: StopRequest) -> None:
        """Make the run's validation pool (its workers start at the first validation) on the ranks that validate."""
        s = self.s
        if s.dist.is_main and s.data.val_crops:
            self.pool = ValidationPool(validation_workers(s.cfg, s.data.val_crops), worker_init=stop.worker_init_fn,
                                       shield=stop.shield_workers)

    def close(self) -> None:
        """End the validation workers, if any."""
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.close()

    def run(self, run_log: RunLog) -> dict[str, Any]:
        """Score the validation crops (rank 0; `{}` on the others) and record them, as the ranks meet again
        (decision mode, tuning crops only: `cellseg.train.validate`)."""
        s, result = self.s, {}
        self.guard.check()
        if s.dist.is_main and s.data.val_crops:
            result = run_validation(s.eval_model(), s.data.val_crops, s.cfg, device=s.dist.device,
                                    precision=s.precision, pool=self.pool)
            run_log.record(s.state.step, result, prefix="val")
            log.info("step %d validation (%s metric, %d tuning crops, %s grid, %.1f s): overall %.4f (%d skipped) | "
                     "ranked by %s %.4f | %s", s.state.step, result["metric"], len(result["crops"]["tuning"]),
                     result["grid"], result["seconds"], result["overall_score"], result["skipped_crops"],
                     result["ranked_by"], result["ranking_score"],
                     ", ".join(f"{k} {v:.3f}" for k, v in result["class_scores"].items()))
        runtime.barrier(s.dist)
        return result
