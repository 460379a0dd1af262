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


def _tiles(shape: Sequence[int], patch: Sequence[int], overlap: float) -> Iterator[tuple[slice, ...]]:
    starts = [tile_starts(s, p, overlap) for s, p in zip(shape, patch, strict=True)]
    for corner in itertools.product(*starts):
        yield tuple(slice(c, c + p) for c, p in zip(corner, patch, strict=True))


def sliding_window(
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
) -> torch.Tensor:
    """Predict a whole (C, Z, Y, X) volume tile by tile.

    Args:
        predict: maps a tile batch (B, C, *tile) on `device` to (B, K, *tile) (e.g. sigmoid of logits,
            possibly with TTA); a 2D model gets (B, C, Y, X) tiles when `patch_vox[0] == 1`.
        image: (C, Z, Y, X) input, on any device.
        patch_vox: tile shape (z, y, x).
        num_outputs: K.
        overlap: fraction of a tile shared with its neighbour (0 ≤ overlap < 1).
        batch_size: tiles per `predict` call.
        blend: "gaussian" or "constant".
        device: where `predict` runs (default: the image's device).
        accumulate_on: where the (K, Z, Y, X) sums live (default: `device`).
        pad_value: fill for volumes smaller than a tile (the output is cropped back).

    Returns:
        (K, Z, Y, X) float32 blended outputs on `accumulate_on`.
    """
    if not 0 <= overlap < 1:
        raise ValueError(f"overlap={overlap} must be in [0, 1)")
    if image.ndim != 4:
        raise ValueError(f"image must be (C, Z, Y, X), got shape {tuple(image.shape)}")
    device = device or image.device
    accumulate_on = accumulate_on or device
    shape = tuple(image.shape[1:])
    padded = tuple(max(s, p) for s, p in zip(shape, patch_vox, strict=True))
    if padded != shape:
        image = torch.nn.functional.pad(image, [a for s, p in zip(reversed(shape), reversed(padded), strict=True)
                                                for a in (0, p - s)], value=pad_value)
    weight = gaussian_weight(patch_vox, mode=blend).to(accumulate_on)
    total = torch.zeros((num_outputs, *padded), dtype=torch.float32, device=accumulate_on)
    norm = torch.zeros(padded, dtype=torch.float32, device=accumulate_on)
    is_2d = patch_vox[0] == 1
    tiles = list(_tiles(padded, patch_vox, overlap))
    for i in range(0, len(tiles), batch_size):
        chunk = tiles[i:i + batch_size]
        batch = torch.stack([image[(slice(None), *t)] for t in chunk]).to(device, non_blocking=True)
        out = predict(batch[:, :, 0] if is_2d else batch)
        out = out[:, :, None] if is_2d else out
        out = out.to(torch.float16).to(accumulate_on, torch.float32)  # see "Exactness" above
        for t, o in zip(chunk, out, strict=True):
            total[(slice(None), *t)] += o * weight
            norm[t] += weight
    total /= norm
    return total[(slice(None), *(slice(0, s) for s in shape))]
