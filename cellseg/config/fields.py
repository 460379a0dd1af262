"""The pieces every config module shares: the value check, vector types and keys that name a scoring era.

An era key (`era_field`) holds the name of a scoring era; the eras are the modules of `cellseg.eval.eras`,
which this layer sits above and cannot import, so a config checks only that the name is text and
`check_eras` checks it against the registry where a command resolves its config (`cellseg.cli`); the
library checks it again where it scores (`cellseg.eval.eras.get_era`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

Vec3 = tuple[float, float, float]
Shape3 = tuple[int, int, int]
AXIS_NAMES = ("z", "y", "x")
# The scoring era configs and commands default to: the leaderboard's, as reconstructed from the official evaluator's
# merged changes #210-#214 (`cellseg.eval.eras.era_2026_07`; verified against the official code at 6b9ad68 for
# everything before #213, docs/scoring.md). "2026" (the code at 6b9ad68) and "2025" stay selectable.
DEFAULT_ERA = "2026-07"
ERA_KEY = "era"  # field metadata marking a key that names a scoring era


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def era_field(default: str = DEFAULT_ERA) -> Any:
    """A config key naming a scoring era (`DEFAULT_ERA` unless given); `check_eras` checks it."""
    return dataclasses.field(default=default, metadata={ERA_KEY: True})


def check_era_name(value: object, key: str) -> None:
    """An era key's value must be a name (text): what a config can check without the registry.

    Raises:
        ValueError: naming `key`.
    """
    _check(isinstance(value, str) and bool(value), f"{key}={value!r}: give the name of a scoring era, e.g. "
           f"{DEFAULT_ERA!r}")


def check_eras(config: Any, eras: Collection[str], prefix: str = "") -> None:
    """Every era key of `config` (a config dataclass, its sections included) names one of `eras` (the
    registered ones: `cellseg.eval.eras.registry()`).

    Raises:
        ValueError: naming the dotted key, its value and the registered eras.
    """
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.metadata.get(ERA_KEY):
            _check(value in eras, f"{prefix}{f.name}={value!r}: not a registered scoring era; choose one of "
                   f"{', '.join(eras)}")
        elif dataclasses.is_dataclass(value):
            check_eras(value, eras, f"{prefix}{f.name}.")
        elif isinstance(value, tuple):
            for item in value:
                if dataclasses.is_dataclass(item):
                    check_eras(item, eras, f"{prefix}{f.name}.")
