"""The scoring eras as command-line choices: every era registered in `cellseg.eval.eras` (one module each), so
that adding an era module offers it to every command's `--metric`.

The registry is read only when a value is checked or help is shown (`LazyChoices`): importing the scorers takes
about a second, and `cellseg --help` stays instant.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator


def era_names() -> tuple[str, ...]:
    """The registered eras, sorted by name."""
    from cellseg.eval.eras import registry

    return tuple(registry())


class LazyChoices:
    """argparse `choices` read from `load()` on first use (a value checked, help or an error shown); give the
    argument a `metavar`, else argparse reads them when the argument is added."""

    def __init__(self, load: Callable[[], tuple[str, ...]] = era_names) -> None:
        self.load = load

    def __contains__(self, value: object) -> bool:
        return value in self.load()

    def __iter__(self) -> Iterator[str]:
        return iter(self.load())


def add_era_alias(parser: argparse.ArgumentParser, dest: str = "metric") -> None:
    """`--era`: the earlier spelling of `--metric` in `submit` and `validate-submission`, still accepted (hidden)."""
    parser.add_argument("--era", dest=dest, choices=LazyChoices(), metavar="ERA", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
