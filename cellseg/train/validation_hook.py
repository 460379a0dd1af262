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
from cellseg.eval.eras import get_era
from cellseg.train.guard import NonFiniteGuard
from cellseg.train.run_log import LOOP_LOGGER, RunLog
from cellseg.train.setup import Setup
from cellseg.train.stop import StopRequest
from cellseg.train.validate import run_validation, validation_workers
from cellseg.train.valpool import ValidationPool

log = logging.getLogger(LOOP_LOGGER)
TIE = 1e-12  # ranking scores closer than this are equal


class ValidationHook:
    """Validates the model of `s` for the loop (module docstring)."""

    def __init__(self, s: Setup, guard: NonFiniteGuard) -> None:
        self.s, self.guard = s, guard
        self.pool: ValidationPool | None = None
        self.watch = DecisionWatch()

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
                     result["ranked_by"], result["ranking_score"], class_line(result))
            self.watch.observe(result)
        runtime.barrier(s.dist)
        return result



class DecisionWatch:
    """Warns once when every validation of a run so far (two or more) ranked the same: best.pt is then the latest
    checkpoint by the tie rule, chosen by nothing the validation saw."""

    def __init__(self) -> None:
        self.rankings: list[float] = []
        self.warned = False

    def observe(self, result: dict[str, Any]) -> bool:
        """Take one validation's result; True when it warned."""
        self.rankings.append(float(result["ranking_score"]))
        blind = result.get("uninformed_classes") or []
        if len(self.rankings) == 1 and blind:
            log.warning("%d of %d classes have no foreground in any tuning crop and take no part in ranking the "
                        "checkpoints: %s", len(blind), len(result["class_scores"]), ", ".join(blind))
        if self.warned or len(self.rankings) < 2 or max(self.rankings) - min(self.rankings) > TIE:
            return False
        self.warned = True
        pairs = sum(len(labels) for labels in result["crop_scores"].values())
        log.warning("validation decided nothing: %d validations all ranked %.4f (%s); %d of %d (crop, class) pairs "
                    "were skipped%s. best.pt is the latest checkpoint, not a chosen one: give the run validation "
                    "crops with foreground of its classes", len(self.rankings), self.rankings[0],
                    result["ranked_by"], result["skipped_crops"], pairs,
                    f" and {len(blind)} classes have no foreground in any tuning crop ({', '.join(blind)})"
                    if blind else "")
        return True


def class_line(result: dict[str, Any]) -> str:
    """Each class's official score, marked where it says nothing: "(no foreground)" where no tuning crop has the
    class's foreground (its score only counts what was predicted there), "(k skipped)" for crops the era
    skipped."""
    era, skipped = get_era(result["metric"]), {}
    for labels in result["crop_scores"].values():
        for label, scores in labels.items():
            skipped[label] = skipped.get(label, 0) + era.is_skipped(scores)
    blind = set(result.get("uninformed_classes") or [])
    parts = []
    for label, value in result["class_scores"].items():
        note = " (no foreground)" if label in blind else f" ({skipped[label]} skipped)" if skipped.get(label) else ""
        parts.append(f"{label} {value:.3f}{note}")
    return ", ".join(parts)
