"""The training clock: seconds spent training, which a wall-clock budget (`train.time_budget_min`) and the
learning-rate schedule defined over it read.

What counts: wall-clock time from the end of each job's first optimizer step (so torch.compile, cuDNN
autotuning, loader start-up and every other set-up cost of a job are not charged) to the end of the run, with
the clock paused while the run validates or writes a checkpoint (so validating more often does not shorten
training). Waiting for the loader counts: a loader-bound model is charged for it. A resumed run continues from
the seconds its checkpoint stored (`Setup.state_dict`'s "train_seconds").

Under DDP every rank must take the same decisions (learning rate, validation, stop) at the same step, so they
read `shared_s`, a value the trainer agrees on between ranks (the maximum of their clocks) every
`train.log_every` steps; a single process refreshes it every step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch

from cellseg import runtime


class TrainClock:
    """Seconds of training, paused and resumed by the trainer (module docstring).

    Args:
        now: a monotonic clock in seconds (tests inject a fake one).

    Example:
        >>> clock = TrainClock()
        >>> clock.start(); ...; clock.pause()
        >>> clock.seconds()  # doctest: +SKIP
        12.5
    """

    def __init__(self, *, now: Callable[[], float] = time.perf_counter):
        self.now = now
        self._banked = 0.0  # seconds of earlier jobs and of this job's finished running spells
        self._since: float | None = None  # `now()` when the current running spell began; None while paused
        self.shared_s = 0.0  # the value all ranks agree on (set by the trainer; see the module docstring)

    @property
    def running(self) -> bool:
        """True between `start` and `pause`."""
        return self._since is not None

    def seconds(self) -> float:
        """Training seconds so far (this process's own reading)."""
        return self._banked + (self.now() - self._since if self._since is not None else 0.0)

    def start(self) -> None:
        """Start (or resume) counting; a running clock is left as it is."""
        if self._since is None:
            self._since = self.now()

    def pause(self) -> None:
        """Stop counting until the next `start`."""
        if self._since is not None:
            self._banked += self.now() - self._since
            self._since = None

    def restore(self, seconds: float) -> None:
        """Set the clock, paused, to `seconds` (a resumed run's stored training time)."""
        self._banked, self._since = float(seconds), None
        self.shared_s = float(seconds)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Not counting inside the block (validation, checkpoints); counting again after it if it was before."""
        was_running = self.running
        self.pause()
        try:
            yield
        finally:
            if was_running:
                self.start()


def crossed(previous_s: float, now_s: float, every_s: float) -> bool:
    """True when a multiple of `every_s` lies in (previous_s, now_s]: a periodic event in clock time is due."""
    return every_s > 0 and int(now_s // every_s) > int(previous_s // every_s)


@contextlib.contextmanager
def off_the_clock(clock: TrainClock, device: torch.device) -> Iterator[None]:
    """Validation, checkpoints and the compile switch are not charged: the clock pauses once the queued GPU work
    is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with clock.paused():
        yield


def share(clock: TrainClock, d: runtime.Dist, *, step: int, every: int) -> None:
    """Refresh the value decisions read (`TrainClock.shared_s`): every step in a single process; under DDP the
    ranks' maximum every `every` steps (a collective and a host sync), so every rank sets the same learning
    rate and validates and stops at the same step."""
    if not d.distributed:
        clock.shared_s = clock.seconds()
        return
    if step % every:
        return
    seconds = torch.tensor(clock.seconds(), device=d.device, dtype=torch.float64)
    torch.distributed.all_reduce(seconds, op=torch.distributed.ReduceOp.MAX)
    clock.shared_s = float(seconds.item())
