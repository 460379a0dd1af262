"""Targets bit-packed (channel c = bit c % 8 of byte c // 8), and `touching`, the voxels a boundary channel marks.

Packed bits let a crop's C target and known channels be written channel by channel without ever holding C
boolean volumes (`cellseg.data.targets`); `unpack_bits` turns them back into `(C, z, y, x)` bool.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def set_bit(bits: np.ndarray, channel: int, mask: np.ndarray) -> None:
    """bits[channel // 8] |= mask << (channel % 8), in place (a scalar OR when the mask is all True)."""
    bit = np.uint8(1 << (channel & 7))
    if mask.all():
        np.bitwise_or(bits[channel >> 3], bit, out=bits[channel >> 3])
        return
    np.bitwise_or(bits[channel >> 3], mask.view(np.uint8) * bit, out=bits[channel >> 3])


def gather_bytes(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """`table[:, ids]` for a (nbytes, 256) uint8 table, as one 8-byte gather per voxel plus a transpose."""
    nbytes = table.shape[0]
    wide = np.zeros((256, 8), np.uint8)
    wide[:, :nbytes] = table.T
    gathered = wide.view(np.uint64).ravel()[ids]  # (z, y, x) uint64: the voxel's 8 bytes
    return np.ascontiguousarray(np.moveaxis(gathered.view(np.uint8).reshape(*ids.shape, 8)[..., :nbytes], -1, 0))


def id_table(ids: Sequence[int]) -> np.ndarray:
    """Boolean lookup table over CellMap ids 0-255 that is True at `ids`."""
    table = np.zeros(256, dtype=bool)
    table[list(ids)] = True
    return table


def unpack_bits(bits: np.ndarray, num_channels: int) -> np.ndarray:
    """`(ceil(C/8), ...)` uint8 → `(C, ...)` bool (inverse of the packing above)."""
    out = np.empty((num_channels, *bits.shape[1:]), dtype=bool)
    for c in range(num_channels):
        np.not_equal(bits[c >> 3] & np.uint8(1 << (c & 7)), 0, out=out[c])
    return out


def touching(ids: np.ndarray) -> np.ndarray:
    """Voxels of an object with a 6-neighbour in a different object (background does not count).

    Work is restricted to the bounding box of the objects (instance classes are sparse in a patch).
    """
    out = np.zeros(ids.shape, dtype=bool)
    if not ids.any():
        return out
    mask = ids != 0
    nonzero = [np.flatnonzero(mask.any(axis=tuple(a for a in range(ids.ndim) if a != d))) for d in range(ids.ndim)]
    box = tuple(slice(n[0], n[-1] + 1) for n in nonzero)
    sub, sub_mask, sub_out = ids[box], mask[box], out[box]
    for axis in range(ids.ndim):
        a = [slice(None)] * ids.ndim
        b = [slice(None)] * ids.ndim
        a[axis], b[axis] = slice(1, None), slice(None, -1)
        a, b = tuple(a), tuple(b)
        diff = np.not_equal(sub[a], sub[b])  # in place from here on: no further temporaries
        diff &= sub_mask[a]
        diff &= sub_mask[b]
        sub_out[a] |= diff
        sub_out[b] |= diff
    return out
