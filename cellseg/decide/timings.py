"""The report's clock: each step of `cellseg report` logged and timed, every run's rows kept in `timings.json`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
TIMINGS_FILE = "timings.json"  # each run's seconds per step so far (`Timings`; report.json: the last run's)


class Timings:
    """Log a line when each step starts and record how long it took; with `path`, every run's rows so far are
    rewritten there after each step (`timings.json`: a list with one list of rows per run of the report, the
    earlier ones of a resumed report kept: what a report cut short and resumed spent, per step)."""

    def __init__(self, path: Path | None = None, *, resuming: bool = False) -> None:
        self.rows: list[dict[str, Any]] = []
        self.path = path
        self.earlier: list[Any] = []
        if path is not None and resuming and path.is_file():
            with contextlib.suppress(ValueError):
                earlier = json.loads(path.read_text())
                self.earlier = earlier if isinstance(earlier, list) else []

    @contextlib.contextmanager
    def step(self, name: str, *, resumed: bool = False) -> Iterator[None]:
        """Time one step (a log line at its start and end); `resumed`: its outputs existed before."""
        log.info("==> %s%s", name, " (resuming)" if resumed else "")
        start = time.perf_counter()
        yield
        seconds = time.perf_counter() - start
        self.rows.append({"step": name, "seconds": round(seconds, 2), "resumed": resumed})
        log.info("    %s: %.1f s", name, seconds)
        if self.path is not None:
            write_atomic(self.path, json.dumps([*self.earlier, self.rows], indent=1) + "\n")


def write_atomic(path: Path, text: str) -> None:
    """Write `path` through a temporary file beside it (never half-written)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
