"""Typed configuration (`schema`) and its YAML loader (`load`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cellseg.config.load import dump, load
from cellseg.config.schema import RunConfig


def load_run_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """A `RunConfig` from a YAML file (with `include:`) and dotted `key=value` overrides."""
    return load(RunConfig, path, overrides)


__all__ = ["RunConfig", "dump", "load", "load_run_config"]
