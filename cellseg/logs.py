"""The command line's log format, shared by the worker processes a command spawns (they log like it)."""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
LOG_DATE_FORMAT = "%H:%M:%S"


def configure(level: int, *, force: bool = False) -> None:
    """Log at `level` in the command line's format (`force`: replace what a spawned process inherited)."""
    logging.basicConfig(level=level, format=LOG_FORMAT, datefmt=LOG_DATE_FORMAT, force=force)
