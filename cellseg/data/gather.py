"""Cutting a batch of windows out of a `BlockStore` with a few gathers, whatever the batch size.

Cut sample by sample, a batch costs a dozen small tensor operations per sample in the training process: fine for
3D batches of a few large patches, the bottleneck for 2D batches of a hundred small ones. Here the whole batch is
one index computation: every output voxel (b, i, j, k) of a `(B, W, *read)` batch finds its voxel in its block,
and one gather reads the EM, one the targets' T bytes (stored channel-last for that). The rules are those of the
sample-by-sample cut (`Block.cut`, `ResidentLoader`), voxel for voxel:

- a rotated sample fills the read shape; any other sample fills the patch, centred, in a zero frame;
- a 2D window cut across y or x has its slicing axis first in the batch (`WINDOW_FIELDS`' `slice_axis`);
- targets outside the crop's box are the padded reads' values: the `all` id `ALL_OUTSIDE`, every bit 0.

Index tensors are int64 of the output's size, so batches are cut in chunks of at most `GATHER_VOXELS` voxels.
Shapes: `B` samples, `R` the read shape `(R0, R1, R2)` in batch orientation, `T` target bytes, `C` crops.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cellseg.data.blocks import BlockStore, Layout
from cellseg.data.targets import ALL_OUTSIDE

GATHER_VOXELS = 2**23  # output voxels per gather: bounds the index tensors (8 bytes each) to 64 MiB
# For each batch orientation, the world axis (z, y, x = 0, 1, 2) of each batch axis: a 2D window cut across y
# (slice_axis 1) is `(y, z, x)` in the batch, one cut across x `(x, z, y)`.
BATCH_TO_WORLD = ((0, 1, 2), (1, 0, 2), (2, 0, 1))


class WindowGather:
    """Cut `(B, WINDOW_FIELDS)` windows from `store` on its device.

    Args:
        store: the blocks, one per crop.
        layout: the sample's channels.
        read_shape_vox, patch_shape_vox: the batch's read shape and the patch (z, y, x; `(1, H, W)` in 2D).

    Example:
        >>> cut = WindowGather(store, layout, read_shape_vox=(1, 300, 300), patch_shape_vox=(1, 256, 256))
        >>> batch = layout.batch(cut(windows))  # (B, W, 1, 300, 300) uint8 on the store's device
    """

    def __init__(self, store: BlockStore, layout: Layout, *, read_shape_vox: Sequence[int],
                 patch_shape_vox: Sequence[int]):
        device = store.em.device
        as_long = lambda rows: torch.tensor(rows, dtype=torch.int64, device=device)  # noqa: E731
        self.store, self.layout, self.read = store, layout, tuple(read_shape_vox)
        self.em_base = as_long(store.em_base)  # (C,)
        self.em_stride = as_long([_strides(b.em.shape) for b in store.blocks])  # (C, 3), world axes
        self.target_base = as_long(store.target_base)
        self.target_stride = as_long([_strides(b.targets.shape[:3]) for b in store.blocks])  # rows of T bytes
        self.box_lo = as_long([b.offset for b in store.blocks])
        self.box_shape = as_long([tuple(b.targets.shape[:3]) for b in store.blocks])
        self.to_world = as_long(BATCH_TO_WORLD)
        self.read_t, self.patch_t = as_long(self.read), as_long(patch_shape_vox)
        self.centre = (self.read_t - self.patch_t) // 2  # where `_centre_pad` puts an unrotated patch
        self.outside = torch.zeros(layout.targets, dtype=torch.uint8, device=device)
        if layout.ids:
            self.outside[0] = ALL_OUTSIDE

    def __call__(self, windows: torch.Tensor) -> torch.Tensor:
        """`(B, 7)` int64 windows (`WINDOW_FIELDS`, best already on the store's device) → `(B, W, *read)` uint8 on
        the store's device."""
        windows = windows.to(self.em_base.device)
        per_chunk = max(1, GATHER_VOXELS // max(1, self.read[0] * self.read[1] * self.read[2]))
        return torch.cat([self._cut(windows[i:i + per_chunk]) for i in range(0, len(windows), per_chunk)])

    def _cut(self, windows: torch.Tensor) -> torch.Tensor:
        crop, rotate, start = windows[:, 0], windows[:, 2].bool()[:, None], windows[:, 4:7]
        world = self.to_world[windows[:, 3]]  # (B, 3): the world axis of each batch axis
        offset = torch.where(rotate, 0, self.centre)  # (B, 3): the window's first voxel in the output
        extent = torch.where(rotate, self.read_t, self.patch_t)
        em_index = (self.em_base[crop] + (start * self.em_stride[crop]).sum(1)).view(-1, 1, 1, 1)  # window starts
        box_start = start - self.box_lo[crop]  # the window's start in its crop's box (world axes)
        target_index = self.target_base[crop].view(-1, 1, 1, 1)
        valid, inside = None, None
        for axis, n in enumerate(self.read):
            w = world[:, axis:axis + 1]  # (B, 1)
            pos = torch.arange(n, device=windows.device)[None] - offset[:, axis:axis + 1]  # (B, n): in the window
            ok = (pos >= 0) & (pos < extent[:, axis:axis + 1])
            in_box = box_start.gather(1, w) + pos
            ok_box = ok & (in_box >= 0) & (in_box < self.box_shape[crop].gather(1, w))
            shape = [-1, 1, 1, 1]
            shape[1 + axis] = n
            em_index = em_index + (pos * self.em_stride[crop].gather(1, w)).view(shape)  # (B, ...) broadcasts
            target_index = target_index + (in_box * self.target_stride[crop].gather(1, w)).view(shape)
            valid = ok.view(shape) if valid is None else valid & ok.view(shape)
            inside = ok_box.view(shape) if inside is None else inside & ok_box.view(shape)
        em = torch.where(valid, self.store.em[em_index.clamp_(0, len(self.store.em) - 1)], 0)
        rows = len(self.store.targets)
        targets = self.store.targets[target_index.clamp_(0, max(0, rows - 1))] if rows else \
            torch.zeros((*em.shape, self.layout.targets), dtype=torch.uint8, device=em.device)
        outside = torch.where(valid[..., None], self.outside, 0)  # the zero frame holds zeros, the `all` id too
        targets = torch.where(inside[..., None], targets, outside)  # (B, *R, T)
        return torch.cat([em[:, None], targets.permute(0, 4, 1, 2, 3)], dim=1)


def _strides(shape: Sequence[int]) -> tuple[int, int, int]:
    """Element strides of a contiguous `(z, y, x)` array."""
    return shape[1] * shape[2], shape[2], 1
