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
