"""Argument types shared by several sub-commands."""

from __future__ import annotations

import argparse


def class_volume(text: str) -> tuple[str, str]:
    """`CLASS=VOLUME` (a label class and the file or array holding it) as a pair.

    Raises:
        argparse.ArgumentTypeError: no `=`, or an empty side.
    """
    name, sep, spec = text.partition("=")
    if not sep or not name or not spec:
        raise argparse.ArgumentTypeError(f"{text!r} is not CLASS=VOLUME (e.g. mito=mito.tif)")
    return name, spec


def predict_jobs(text: str) -> int | str:
    """`--predict-jobs`: "auto" or a whole number (its range is checked by the options or config).

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 'auto' or a number of processes ≥ 1") from None


def metric_choices() -> tuple[str, ...]:
    """What `--metric` of `report` and `decide` takes: "all" (and its alias "both") or one registered era
    (imported on first use: `--help` stays light)."""
    from cellseg.decide.inputs import metric_choices as choices

    return choices()
