"""Test-time augmentation: invertible flips (and in-plane transposes), each undone before averaging.

The transforms form a group acting on the spatial axes of a `(B, C, *S)` tensor; each one is its own
kind of mirror, so `invert(apply(x)) == x` exactly (no interpolation). Candidates are enumerated in a fixed
order and the first `n` kept:

1. the flips of every subset of the allowed axes, identity first (3D with z, y, x allowed: identity + the
   7 flip combinations; 2D: identity + 3);
2. then, if y and x may be swapped, the same flips followed by a y/x transpose (2D: the other 4 of the 8
   in-plane symmetries; 3D with a restricted axis set: extra transforms to reach `n`).

So 3D gets identity + 7 flips, 2D gets the 8 in-plane symmetries (the dihedral group of the square), and a
model whose `ModelSpec.tta_axes` is restricted (anisotropic data) gets what its axes allow; if fewer than
`n` exist, all are used and a log line says so.

Shapes: `B` batch, `C` channels, `S` the spatial axes (`ZYX` in 3D, `YX` in 2D).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)
AXES_BY_DIMS = {2: "yx", 3: "zyx"}
PredictFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Transform:
    """Flip `flip_axes`, then (optionally) swap y and x; `invert` undoes it in the reverse order.

    Example:
        >>> t = Transform(axes="zyx", flip_axes=("z", "x"))
        >>> x = torch.arange(8.).reshape(1, 1, 2, 2, 2)
        >>> bool((t.invert(t.apply(x)) == x).all())
        True
    """

    axes: str  # spatial axis names of the tensors this acts on: "zyx" or "yx"
    flip_axes: tuple[str, ...] = ()
    transpose_yx: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.flip_axes) - set(self.axes)
        if unknown:
            raise ValueError(f"flip axes {sorted(unknown)} are not among the spatial axes {self.axes!r}")

    @property
    def name(self) -> str:
        """E.g. "identity", "flip_zx", "transpose_yx+flip_y" (recorded in prediction provenance)."""
        parts = (["flip_" + "".join(self.flip_axes)] if self.flip_axes else []) + \
                (["transpose_yx"] if self.transpose_yx else [])
        return "+".join(parts) or "identity"

    def _dims(self, x: torch.Tensor) -> tuple[list[int], tuple[int, int]]:
        if x.ndim != 2 + len(self.axes):
            raise ValueError(f"transform {self.name} acts on (B, C, {', '.join(self.axes.upper())}) tensors, "
                             f"got shape {tuple(x.shape)}")
        first = x.ndim - len(self.axes)
        flips = [first + self.axes.index(a) for a in self.flip_axes]
        return flips, (first + self.axes.index("y"), first + self.axes.index("x"))

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """The transformed `(B, C, *S)` tensor (a copy when not the identity)."""
        flips, (y, x_dim) = self._dims(x)
        out = torch.flip(x, flips) if flips else x
        return out.transpose(y, x_dim) if self.transpose_yx else out

    def invert(self, y: torch.Tensor) -> torch.Tensor:
        """Undo `apply` on a model output `(B, K, *S')` (transpose back first, then flip back)."""
        flips, (y_dim, x_dim) = self._dims(y)
        out = y.transpose(y_dim, x_dim) if self.transpose_yx else y
        return torch.flip(out, flips) if flips else out


def transforms(spatial_dims: int, allowed_axes: Sequence[str], n: int = 8, *,
               transpose_axes: Sequence[str] = ()) -> list[Transform]:
    """The first `n` TTA transforms for a model (order and rule in the module docstring).

    Args:
        spatial_dims: 2 or 3.
        allowed_axes: axes that may be flipped (`ModelSpec.tta_axes`); axes the tensor lacks are ignored
            (a 2D model's "z").
        n: how many transforms to use (1: identity only).
        transpose_axes: `ModelSpec.tta_transpose_axes`; y and x both listed allows the y/x swap.

    Raises:
        ValueError: `spatial_dims` not 2 or 3, or `n` < 1.
    """
    if spatial_dims not in AXES_BY_DIMS:
        raise ValueError(f"spatial_dims must be 2 or 3, got {spatial_dims}")
    if n < 1:
        raise ValueError(f"the number of TTA transforms must be at least 1, got {n}")
    axes = AXES_BY_DIMS[spatial_dims]
    flippable = [a for a in axes if a in set(allowed_axes)]  # spatial order, whatever order was given
    flip_sets = [c for k in range(len(flippable) + 1) for c in itertools.combinations(flippable, k)]
    transposes = [False, True] if {"y", "x"} <= set(transpose_axes) else [False]
    candidates = [Transform(axes=axes, flip_axes=f, transpose_yx=t) for t in transposes for f in flip_sets]
    if len(candidates) < n:
        log.info("TTA: only %d distinct transforms exist for a %dD model with flip axes %s%s; using all of them "
                 "instead of %d", len(candidates), spatial_dims, flippable or "none",
                 " and a y/x transpose" if len(transposes) == 2 else "", n)
    return candidates[:n]


def tta_predict(predict_fn: PredictFn, batch: torch.Tensor, tfms: Sequence[Transform], *,
                fold: int = 1) -> torch.Tensor:
    """Mean over `tfms` of `invert(predict_fn(apply(batch)))`, in float32.

    Transforms run `fold` at a time: their inputs concatenated into one call of `predict_fn` (bigger forwards for
    models whose small ones are launch-bound), so memory is that of `fold` forward passes plus a few partial
    sums. The sum is pairwise (a binary counter of partial sums), in transform order whatever `fold` is: for 2^k
    transforms whose outputs agree it is exact, so TTA over an equivariant model returns the single-pass result
    bit for bit.

    Args:
        predict_fn: maps `(B, C, *S)` to `(B, K, *S)` (e.g. sigmoid probabilities).
        batch: `(B, C, *S)` input tiles.
        tfms: the transforms (at least one; `[identity]` is a plain pass).
        fold: transforms per call of `predict_fn` (those whose outputs keep the batch's shape; a transpose of
            non-square tiles runs alone).
    """
    if not tfms:
        raise ValueError("tta_predict needs at least one transform (the identity for no TTA)")
    if fold < 1:
        raise ValueError(f"fold must be at least 1, got {fold}")
    partials: list[torch.Tensor | None] = []  # partials[i]: the sum of 2^i outputs, or None
    for start in range(0, len(tfms), fold):
        group = tfms[start:start + fold]
        inputs = [t.apply(batch) for t in group]
        if len(group) > 1 and all(x.shape == batch.shape for x in inputs):
            outputs = predict_fn(torch.cat(inputs)).split(batch.shape[0])
        else:
            outputs = tuple(predict_fn(x) for x in inputs)
        for t, out in zip(group, outputs, strict=True):
            carry = t.invert(out).float()
            level = 0
            while level < len(partials) and partials[level] is not None:
                carry = partials[level] + carry  # a new tensor: outputs are never modified in place
                partials[level] = None
                level += 1
            if level == len(partials):
                partials.append(None)
            partials[level] = carry
    present = [p for p in partials if p is not None]
    total = present[0]
    for p in present[1:]:
        total = total + p
    return total if len(tfms) == 1 else total / len(tfms)
