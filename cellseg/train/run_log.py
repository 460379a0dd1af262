"""What a run tells its user: `metrics.jsonl`, TensorBoard events and a progress bar.

Only rank 0 writes. Every record carries the step, the wall-clock `time` (Unix seconds) and what the trainer's
`stamp` adds (the minutes of its training clock and of the job); validation records carry the metric era.
Pre-emption signals are `cellseg.train.stop`'s.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

log = logging.getLogger(__name__)
# The logger of the training loop's messages, whichever of its collaborators (`cellseg.train.log_window`,
# `validation_hook`, `compile_swap`) writes them: the name its log lines have always carried, which log filters
# (scripts/demo.sh's, a user's) match.
LOOP_LOGGER = "cellseg.train.trainer"


def process_age_s() -> float | None:
    """Seconds since this process started (Linux `/proc`: imports included), None where that is unknown."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        return round(uptime_s - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 3)  # field 22: start, in clock ticks
    except (OSError, ValueError, IndexError):
        return None


class RunLog:
    """Appends JSON lines to `metrics.jsonl`, mirrors scalars to TensorBoard, drives the progress bar."""

    def __init__(self, run_dir: Path, *, enabled: bool, total_steps: int | None, start_step: int,
                 stamp: Callable[[], dict[str, float]] | None = None):
        self.enabled = enabled
        self.stamp = stamp  # extra top-level values of every record (e.g. {"train_min": ..., "job_min": ...})
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
        entry = {"step": step, "time": time.time(), **(self.stamp() if self.stamp else {}), prefix: values}
        try:
            with self.path.open("a") as fh:
                fh.write(json.dumps(entry) + "\n")
        except OSError as err:  # disk full, quota: name the file
            raise OSError(err.errno, f"cannot append to {self.path}: {err.strerror}") from err
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
