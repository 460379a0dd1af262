"""Overlay images as plain arrays: RGBA layers drawn over an EM slice (no matplotlib state involved).

Every function takes 2D arrays of one slice, `(rows, cols)`, and returns an RGBA float image
`(rows, cols, 4)` in [0, 1] whose alpha is 0 wherever nothing is drawn, so it can be shown on top of
the EM with `imshow`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.colors import to_rgb

from cellseg.viz.palette import ERROR_COLORS, class_color, instance_colors

FILL_ALPHA = 0.5  # class fills: EM texture stays visible underneath
OUTLINE_ALPHA = 1.0


def _check_2d(name: str, array: np.ndarray, shape: tuple[int, ...] | None = None) -> None:
    if array.ndim != 2:
        raise ValueError(f"{name}: expected a 2D (rows, cols) slice, got shape {array.shape}")
    if shape is not None and array.shape != shape:
        raise ValueError(f"{name}: shape {array.shape} differs from the other layers' {shape}")


def outline(labels: np.ndarray) -> np.ndarray:
    """Pixels of a label image (bool or ids) that touch a 4-neighbour with a different value, background
    excluded: the inner border of every object, and the line between touching objects."""
    _check_2d("labels", labels)
    edge = np.zeros(labels.shape, dtype=bool)
    for axis in (0, 1):
        lo = [slice(None)] * 2
        hi = [slice(None)] * 2
        lo[axis], hi[axis] = slice(None, -1), slice(1, None)
        differs = labels[tuple(lo)] != labels[tuple(hi)]
        edge[tuple(lo)] |= differs
        edge[tuple(hi)] |= differs
    return edge & (labels != 0)


def semantic_rgba(masks: Mapping[str, np.ndarray], *, alpha: float = FILL_ALPHA, outlines: bool = False
                  ) -> np.ndarray:
    """Class masks painted in their palette colours, in the mapping's order (later classes on top).

    Args:
        masks: class name → bool `(rows, cols)` mask.
        alpha: fill opacity; with `outlines`, borders are drawn opaque on top of the fill.
    """
    if not masks:
        raise ValueError("semantic_rgba: no class masks to draw")
    shape = next(iter(masks.values())).shape
    rgba = np.zeros((*shape, 4))
    for name, mask in masks.items():
        _check_2d(name, mask, shape)
        mask = mask.astype(bool, copy=False)
        rgba[mask] = (*class_color(name), alpha)
        if outlines:
            rgba[outline(mask)] = (*class_color(name), OUTLINE_ALPHA)
    return rgba


def instance_rgba(ids: np.ndarray, *, seed: int = 0, alpha: float = FILL_ALPHA, outlines: bool = True
                  ) -> np.ndarray:
    """Object ids painted with seeded colours (`palette.instance_colors`); id 0 stays transparent.

    With `outlines`, each object's border is drawn opaque in its own colour, so touching objects
    stay apart even where their fills look alike.
    """
    _check_2d("ids", ids)
    if ids.dtype.kind not in "ui":
        raise ValueError(f"instance ids must be integers, got {ids.dtype}")
    if ids.size and ids.min() < 0:
        raise ValueError("instance ids must be non-negative")
    rgba = np.zeros((*ids.shape, 4))
    unique, inverse = np.unique(ids, return_inverse=True)
    colours = instance_colors(unique, seed=seed)
    rgba[..., :3] = colours[inverse.reshape(ids.shape)]
    rgba[..., 3] = np.where(ids != 0, alpha, 0.0)
    if outlines:
        rgba[outline(ids), 3] = OUTLINE_ALPHA
    return rgba


def stack_rgba(layers: Sequence[np.ndarray]) -> np.ndarray:
    """Composite RGBA layers, later ones over earlier ones ("over" operator, straight alpha)."""
    if not layers:
        raise ValueError("stack_rgba: no layers")
    out = np.zeros_like(layers[0])
    for layer in layers:
        a_top, a_bottom = layer[..., 3:], out[..., 3:]
        a_out = a_top + a_bottom * (1 - a_top)
        rgb = np.divide(layer[..., :3] * a_top + out[..., :3] * a_bottom * (1 - a_top), a_out,
                        out=np.zeros_like(out[..., :3]), where=a_out > 0)
        out = np.concatenate([rgb, a_out], axis=-1)
    return out


def error_rgba(truth: np.ndarray, prediction: np.ndarray, known: np.ndarray | None = None, *,
               alpha: float = 0.85) -> np.ndarray:
    """Agreement map of two masks: true positives light, false positives red, false negatives blue,
    unannotated pixels (where `known` is False) dark grey; true negatives transparent."""
    _check_2d("truth", truth)
    _check_2d("prediction", prediction, truth.shape)
    truth, prediction = truth.astype(bool, copy=False), prediction.astype(bool, copy=False)
    known = np.ones(truth.shape, dtype=bool) if known is None else known.astype(bool, copy=False)
    _check_2d("known", known, truth.shape)
    rgba = np.zeros((*truth.shape, 4))
    for kind, where in (("tp", truth & prediction), ("fp", prediction & ~truth), ("fn", truth & ~prediction)):
        rgba[where & known] = (*to_rgb(ERROR_COLORS[kind]), alpha)
    rgba[~known] = (*to_rgb(ERROR_COLORS["unknown"]), alpha)
    return rgba


def error_counts(truth: np.ndarray, prediction: np.ndarray, known: np.ndarray | None = None) -> dict[str, int]:
    """Pixel counts of true positives, false positives and false negatives over the known pixels."""
    truth, prediction = truth.astype(bool, copy=False), prediction.astype(bool, copy=False)
    known = np.ones(truth.shape, dtype=bool) if known is None else known.astype(bool, copy=False)
    return {"tp": int((truth & prediction & known).sum()), "fp": int((prediction & ~truth & known).sum()),
            "fn": int((truth & ~prediction & known).sum())}
