"""When a run logs, validates, checkpoints and ends: in optimizer steps (`train.log_every`, `train.val_every`,
`train.checkpoint_every`, `train.max_steps`) and in minutes of the training clock (`train.time_budget_min`,
`train.val_every_min`; `cellseg.train.clock`).

The last step (the step limit or the end of the budget) always logs and validates. A validation writes the
checkpoint too, so a checkpoint step that validates writes no second one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cellseg.config.schema import TrainConfig
from cellseg.train.clock import crossed

SECONDS_PER_MIN = 60.0


@dataclass(frozen=True)
class Due:
    """What the loop does after a step."""

    log: bool
    validate: bool
    checkpoint: bool  # without validating (a validation checkpoints anyway)


class Schedule:
    """The step and clock limits and periods of `tc` (module docstring)."""

    def __init__(self, tc: TrainConfig) -> None:
        self.tc = tc
        self.budget_s = SECONDS_PER_MIN * tc.time_budget_min if tc.time_budget_min is not None else math.inf
        self.val_every_s = SECONDS_PER_MIN * tc.val_every_min if tc.val_every_min is not None else 0.0

    def more(self, step: int, clock_s: float) -> bool:
        """Whether another step runs after `step`, with `clock_s` training seconds spent."""
        return step < self.tc.max_steps and clock_s < self.budget_s

    def after(self, step: int, before_s: float, clock_s: float) -> Due:
        """What is due after `step`, the training clock having gone from `before_s` to `clock_s` over it."""
        tc = self.tc
        final = step == tc.max_steps or clock_s >= self.budget_s
        validate = step % tc.val_every == 0 or final or crossed(before_s, clock_s, self.val_every_s)
        return Due(log=step % tc.log_every == 0 or final, validate=validate,
                   checkpoint=not validate and step % tc.checkpoint_every == 0)
