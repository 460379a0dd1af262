"""`train.nonfinite`: what a NaN or infinite loss or gradient does to a run.

"error" (the default) keeps, on the device, the first step whose loss or gradient norm was not finite, and
raises `NonFiniteError` naming it at the next log, validation or checkpoint step: no host sync is added to
the steps in between, and nothing computed after that step is ever logged as a loss or written as a
checkpoint. "skip" decides every step (one host sync, and under DDP one collective so that every rank skips
the same steps): the step's update of the parameters is dropped (BatchNorm running statistics, which move in
the forward pass, are not rolled back), `nonfinite_skips` counts it in metrics.jsonl, and
`max_nonfinite_skips` skips in a row end the run with the error. With fp16, infinite gradients are the
GradScaler's to handle (it skips the update and lowers its scale); only the loss is checked then.
"""

from __future__ import annotations

import logging

import torch

from cellseg import runtime
from cellseg.config.schema import TrainConfig
from cellseg.train.run_checkpoints import NonFiniteError

log = logging.getLogger(__name__)
NONE_YET = 2**62  # "no non-finite step so far" in the device-side record of the first one
HINT = "lower optim.lr (or set optim.grad_clip_norm), check the data, or set train.nonfinite=skip"


class NonFiniteGuard:
    """Checks each step's loss and gradient norm (module docstring)."""

    def __init__(self, tc: TrainConfig, dist: runtime.Dist, *, fp16_scaler: bool) -> None:
        self.mode, self.limit, self.dist, self.fp16_scaler = tc.nonfinite, tc.max_nonfinite_skips, dist, fp16_scaler
        self.first_bad = torch.full((), NONE_YET, dtype=torch.int64, device=dist.device)
        self.in_row = self.in_window = self.total = 0
        self.last_ok = True  # whether the last step updated the weights (always, in "error" mode)

    def update_ok(self, loss: torch.Tensor, grad_norm: torch.Tensor, *, step: int) -> bool:
        """Whether step `step` (1-based, as logged) may update the weights."""
        finite = torch.isfinite(loss)
        if not self.fp16_scaler:
            finite = finite & torch.isfinite(grad_norm)
        if self.mode == "error":
            self.first_bad = torch.where(finite, self.first_bad, self.first_bad.clamp(max=step))
            return True
        ok = finite.to(torch.float32)
        if self.dist.distributed:
            torch.distributed.all_reduce(ok, op=torch.distributed.ReduceOp.MIN)
        self.last_ok = bool(ok.item())
        if self.last_ok:
            self.in_row = 0
            return True
        self.in_row, self.in_window, self.total = self.in_row + 1, self.in_window + 1, self.total + 1
        log.warning("step %d: NaN or infinite loss or gradients; its update is skipped (%d in a row, %d in all)",
                    step, self.in_row, self.total)
        if self.in_row >= self.limit:
            raise NonFiniteError(f"steps {step - self.in_row + 1}-{step}: NaN or infinite loss or gradients "
                                 f"{self.in_row} steps in a row (train.max_nonfinite_skips={self.limit}); {HINT}")
        return False

    def check(self) -> None:
        """Raise if a step so far was not finite ("error" mode; every rank must call it at the same steps).

        Raises:
            NonFiniteError: naming the first such step.
        """
        if self.mode != "error":
            return
        first = self.first_bad.clone()
        if self.dist.distributed:
            torch.distributed.all_reduce(first, op=torch.distributed.ReduceOp.MIN)
        step = int(first.item())
        if step < NONE_YET:
            raise NonFiniteError(f"step {step}: NaN or infinite loss or gradients (train.nonfinite=error): training "
                                 f"stopped, and no checkpoint holds weights from that step on; {HINT}")

    def counts(self) -> dict[str, int]:
        """Skipped steps since the last call, for metrics.jsonl ("skip" mode only)."""
        if self.mode != "skip":
            return {}
        out = {"nonfinite_skips": self.in_window}
        self.in_window = 0
        return out
