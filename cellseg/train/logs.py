"""What a run tells its user: `metrics.jsonl`, TensorBoard events, a progress bar, and pre-emption signals.

Only rank 0 writes. Every record carries the step; validation records carry the metric era.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

log = logging.getLogger(__name__)


class RunLog:
    """Appends JSON lines to `metrics.jsonl`, mirrors scalars to TensorBoard, drives the progress bar."""

    def __init__(self, run_dir: Path, *, enabled: bool, total_steps: int, start_step: int):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.bar = tqdm(total=total_steps, initial=start_step, disable=not enabled, unit="step",
                        dynamic_ncols=True, desc="train")
        self.tb = None
        if enabled:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
            except ImportError:  # tensorboard is optional at run time; metrics.jsonl has everything
                log.warning("tensorboard is not installed: metrics go to metrics.jsonl only")

    def record(self, step: int, values: dict[str, Any], *, prefix: str = "train") -> None:
        """Write one record; numeric leaves also go to TensorBoard as `prefix/key`."""
        if not self.enabled:
            return
        entry = {"step": step, "time": time.time(), prefix: values}
        with self.path.open("a") as fh:
            fh.write(json.dumps(entry) + "\n")
        if self.tb is not None:
            for key, value in _flatten(values):
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.tb.add_scalar(f"{prefix}/{key}", value, step)

    def advance(self, n: int, postfix: dict[str, str]) -> None:
        """Move the bar by `n` steps and show throughput/loss."""
        self.bar.update(n)
        self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        """Flush and close."""
        self.bar.close()
        if self.tb is not None:
            self.tb.close()


def _flatten(values: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += _flatten(value, f"{name}/")
        else:
            out.append((name, value))
    return out


class StopRequest:
    """Turns SIGTERM / SIGUSR1 (SLURM pre-emption, `scancel --signal`) into a flag the loop polls."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.requested = False
        self._previous = {}
        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals cannot be caught here
                pass

    def _handle(self, signum: int, frame: object) -> None:
        log.warning("received %s: checkpointing and stopping after this step", signal.Signals(signum).name)
        self.requested = True

    def restore(self) -> None:
        """Put the previous handlers back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
