"""Sliding-window prediction over a volume with Gaussian (or constant) blending, tiles batched.

Tiles of `patch_vox` are placed so that neighbours overlap by `overlap` (nnU-Net's step 0.5 by default)
and the last tile of every axis is flush with the volume's end. Tile outputs are blended as Σ w·p / Σ w.

Exactness: weights are quantised to multiples of 1/128 (at least 1/128, so borders keep some weight) and
tile outputs are rounded to float16 before the float32 accumulation. Every product then needs at most
8 + 11 bits and every partial sum of equal values at most 24, so blending a constant returns the
constant bit for bit, and in general the result is the correctly rounded weighted mean of the
float16 tile outputs. Probabilities are stored as float16 or uint8 afterwards anyway.

Shapes: `C` input channels, `K` output channels, `S` the spatial axes (z, y, x); a 2D model sees
`(B, C, Y, X)` tiles cut from z-slices when `patch_vox[0] == 1`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence

import torch

WEIGHT_QUANTUM = 128  # weights are k / 128, k in 1..128 (see the module docstring)
PredictFn = Callable[[torch.Tensor], torch.Tensor]


def tile_starts(size: int, patch: int, overlap: float) -> list[int]:
    """Start offsets covering [0, size) with tiles of `patch` overlapping by ≥ `overlap` (last one flush)."""
    if size <= patch:
        return [0]
    step = max(1, int(patch * (1 - overlap)))
    n = math.ceil((size - patch) / step) + 1
    return [round(i * (size - patch) / (n - 1)) for i in range(n)]


def gaussian_weight(patch_vox: Sequence[int], *, sigma_scale: float = 1 / 8, mode: str = "gaussian") -> torch.Tensor:
    """Blending weights of one tile, quantised to multiples of 1/128 in [1/128, 1]."""
    if mode == "constant":
        return torch.ones(tuple(patch_vox))
    if mode != "gaussian":
        raise ValueError(f"blend mode {mode!r} is not 'gaussian' or 'constant'")
    axes = []
    for n in patch_vox:
        x = torch.arange(n, dtype=torch.float64) - (n - 1) / 2
        sigma = max(n * sigma_scale, 1e-6)
        axes.append(torch.exp(-0.5 * (x / sigma) ** 2))
    w = axes[0]
    for a in axes[1:]:
        w = w[..., None] * a
    w = w / w.max()
    return (torch.round(w * WEIGHT_QUANTUM).clamp(min=1) / WEIGHT_QUANTUM).float()


def window_tiles(shape: Sequence[int], patch: Sequence[int], overlap: float, *, start_plane: int = 0,
                 batch_size: int = 1) -> list[tuple[slice, ...]]:
    """The tiles the sliding window runs over a (padded) volume of `shape`, z-major (z, then y, then x).

    With `start_plane` > 0 the batches (of `batch_size` tiles) that only touch planes before it are left
    out: the planes from `start_plane` on get exactly the sums of the full run (same tiles, same batches).
    """
    starts = [tile_starts(s, p, overlap) for s, p in zip(shape, patch, strict=True)]
    tiles = [tuple(slice(c, c + p) for c, p in zip(corner, patch, strict=True))
             for corner in itertools.product(*starts)]
    first = next((i for i, t in enumerate(tiles) if t[0].stop > start_plane), len(tiles))
    return tiles[first - first % batch_size:]


def _check(image: torch.Tensor, overlap: float) -> None:
    if not 0 <= overlap < 1:
        raise ValueError(f"overlap={overlap} must be in [0, 1)")
    if image.ndim != 4:
        raise ValueError(f"image must be (C, Z, Y, X), got shape {tuple(image.shape)}")


def sliding_window_slabs(
    predict: PredictFn,
    image: torch.Tensor,
    *,
    patch_vox: Sequence[int],
    num_outputs: int,
    overlap: float = 0.5,
    batch_size: int = 4,
    blend: str = "gaussian",
    device: torch.device | None = None,
    accumulate_on: torch.device | None = None,
    pad_value: float = 0.0,
    start_plane: int = 0,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Predict a (C, Z, Y, X) volume tile by tile, yielding the blended result in z-slabs as they complete.

    Tiles run z-major, so once the tiles starting at plane z are done, nothing touches the planes before the
    next tile's start: those are divided by their weights and yielded as `(z0, (K, dz, Y, X))`, in order and
    covering [start_plane, Z) once. The sums span one tile depth (`patch_vox[0]` planes) of the y/x extent,
    whatever Z is: a crop of any depth streams through a fixed amount of memory, and no tile runs twice.

    Args:
        predict: maps a tile batch (B, C, *tile) on `device` to (B, K, *tile) (e.g. sigmoid of logits,
            possibly with TTA); a 2D model gets (B, C, Y, X) tiles when `patch_vox[0] == 1`.
        image: (C, Z, Y, X) input of any dtype, on any device; tiles are moved to `device` as they are cut.
        patch_vox: tile shape (z, y, x).
        num_outputs: K.
        overlap: fraction of a tile shared with its neighbour (0 ≤ overlap < 1).
        batch_size: tiles per `predict` call.
        blend: "gaussian" or "constant".
        device: where `predict` runs (default: the image's device).
        accumulate_on: where the (K, patch z, Y, X) sums live (default: `device`).
        pad_value: fill (in the image's units) for volumes smaller than a tile (the output is cropped back).
        start_plane: yield planes from this one on only, skipping the batches that only touch earlier ones
            (a resumed crop gets exactly the values an uninterrupted run would have given).

    Yields:
        (z0, (K, dz, Y, X) float32 blended outputs on `accumulate_on`), z0 increasing.
    """
    _check(image, overlap)
    device = device or image.device
    accumulate_on = accumulate_on or device
    shape = tuple(image.shape[1:])
    padded = tuple(max(s, p) for s, p in zip(shape, patch_vox, strict=True))
    if padded != shape:
        image = torch.nn.functional.pad(image, [a for s, p in zip(reversed(shape), reversed(padded), strict=True)
                                                for a in (0, p - s)], value=pad_value)
    weight = gaussian_weight(patch_vox, mode=blend).to(accumulate_on)
    depth, plane = patch_vox[0], padded[1:]
    sums = torch.zeros((num_outputs, depth, *plane), dtype=torch.float32, device=accumulate_on)
    norm = torch.zeros((depth, *plane), dtype=torch.float32, device=accumulate_on)
    tiles = window_tiles(padded, patch_vox, overlap, start_plane=start_plane, batch_size=batch_size)
    base = tiles[0][0].start if tiles else 0  # the plane sums[:, 0] holds
    is_2d = depth == 1

    def finish(upto: int) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield the planes [base, upto) (they are complete) and shift the sums to start at `upto`."""
        nonlocal base
        lo, hi = max(base, start_plane), min(upto, shape[0])
        if hi > lo:
            rows = slice(lo - base, hi - base)
            yield lo, (sums[:, rows] / norm[rows])[:, :, :shape[1], :shape[2]]
        step, rest = upto - base, depth - (upto - base)
        if rest > 0:  # planes already summed by earlier tiles that the next ones overlap
            sums[:, :rest] = sums[:, step:].clone()
            norm[:rest] = norm[step:].clone()
        sums[:, max(rest, 0):] = 0
        norm[max(rest, 0):] = 0
        base = upto

    for i in range(0, len(tiles), batch_size):
        chunk = tiles[i:i + batch_size]
        batch = torch.stack([image[(slice(None), *t)] for t in chunk]).to(device, non_blocking=True)
        out = predict(batch[:, :, 0] if is_2d else batch)
        out = out[:, :, None] if is_2d else out
        out = out.to(torch.float16).to(accumulate_on, torch.float32)  # see "Exactness" above
        for t, o in zip(chunk, out, strict=True):
            if t[0].start != base:
                yield from finish(t[0].start)
            local = (slice(0, depth), *t[1:])
            sums[(slice(None), *local)].addcmul_(o, weight)
            norm[local] += weight
    yield from finish(padded[0])
