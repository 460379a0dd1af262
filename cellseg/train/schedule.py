"""When a run logs, validates, checkpoints and ends: in optimizer steps (`train.log_every`, `train.val_every`,
`train.checkpoint_every`, `train.max_steps`) and in minutes of the training clock (`train.time_budget_min`,
`train.val_every_min`; `cellseg.train.clock`).

The last step (the step limit or the end of the budget) always logs and validates. A validation writes the
checkpoint too, so a checkpoint step that validates writes no second one. A stop signal (`cellseg.train.stop`)
ends the run before the next step; under DDP the ranks agree on it every `train.log_every` steps
(`stop_agreed`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cellseg import runtime
from cellseg.config.schema import TrainConfig
from cellseg.train.clock import crossed
from cellseg.train.stop import StopRequest

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


def stop_agreed(stop: StopRequest, d: runtime.Dist, *, step: int, every: int) -> bool:
    """Whether the run stops before the step after `step`. Single process: the flag itself, no GPU involved.
    DDP: every rank must stop at the same step, which takes a collective and a host sync, so ranks agree only
    every `every` steps (a pre-emption warning leaves minutes, steps take well under a second)."""
    if not d.distributed:
        return stop.requested
    if step % every:
        return False
    flag = torch.tensor(float(stop.requested), device=d.device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())
