"""Targets decoded by the augmentation, and its blur, against reference formulations."""

import numpy as np
import pytest
import torch
from scipy import ndimage

from cellseg.config.schema import AugmentConfig
from cellseg.data.augment import GpuAugment, gaussian_blur
from cellseg.data.target_bits import unpack_bits

CLASSES, BOUNDARIES = 11, 2  # 13 channels: the boundary bits start inside a byte


def _augment(patch):
    return GpuAugment(AugmentConfig(enabled=False), num_classes=CLASSES + BOUNDARIES, patch_shape_vox=patch,
                      voxel_size_nm=(8.0, 8.0, 8.0), num_boundaries=BOUNDARIES)


def _unpacked(bits, channels):
    """Reference decoding, sample by sample: `(B, Kb, *S)` uint8 → `(B, C, *S)` bool."""
    return torch.from_numpy(np.stack([unpack_bits(x, channels) for x in bits.numpy()]))


def _bytes(g, b, channels, spatial):
    return torch.randint(0, 256, (b, -(-channels // 8), *spatial), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize("patch", [(3, 4, 5), (1, 6, 7)])
def test_ids_targets_are_the_packed_table_rows_laid_out_channel_fastest(patch):
    g, b = torch.Generator().manual_seed(0), 3
    spatial = patch  # no context: the identity transform keeps every voxel
    ids = torch.randint(0, 7, (b, 1, *spatial), generator=g, dtype=torch.uint8)
    ids[:, :, 0] = 255  # the "unknown" id of wrapped-in strips
    batch = {"image": torch.randint(0, 256, (b, 1, *spatial), generator=g, dtype=torch.uint8), "ids": ids,
             "target_lut": torch.randint(0, 256, (b, 2, 256), generator=g, dtype=torch.uint8),
             "known_lut": torch.randint(0, 256, (b, 2, 256), generator=g, dtype=torch.uint8),
             "target_bits": _bytes(g, b, BOUNDARIES, spatial), "known_bits": _bytes(g, b, BOUNDARIES, spatial)}
    _, target, known = _augment(patch)(batch, 0)
    squeeze = (lambda t: t[:, :, 0]) if patch[0] == 1 else (lambda t: t)
    for name, lut, bits, out in (("target", "target_lut", "target_bits", target), ("known", "known_lut", "known_bits",
                                                                                   known)):
        rows = torch.stack([table[:, v[0].long()] for table, v in zip(batch[lut], squeeze(ids), strict=True)])
        want = _unpacked(rows, CLASSES + BOUNDARIES)  # each voxel: its id's bytes of the sample's table
        want[:, CLASSES:] = _unpacked(squeeze(batch[bits]), BOUNDARIES)
        assert out.dtype == torch.bool and torch.equal(out, want), name
        assert out.stride(1) == 1 and out.is_contiguous(memory_format=torch.channels_last_3d if out.ndim == 5
                                                        else torch.channels_last), name


def test_bit_targets_equal_the_unpacked_bytes():
    g, b, spatial = torch.Generator().manual_seed(1), 2, (4, 5, 6)
    batch = {"image": torch.randint(0, 256, (b, 1, *spatial), generator=g, dtype=torch.uint8),
             "target_bits": _bytes(g, b, CLASSES + BOUNDARIES, spatial),
             "known_bits": _bytes(g, b, CLASSES + BOUNDARIES, spatial)}
    _, target, known = _augment(spatial)(batch, 0)
    assert torch.equal(target, _unpacked(batch["target_bits"], CLASSES + BOUNDARIES))
    assert torch.equal(known, _unpacked(batch["known_bits"], CLASSES + BOUNDARIES))
    assert target.stride(1) == 1


@pytest.mark.parametrize("spatial", [(9, 10, 11), (12, 13)])
def test_blur_is_scipys_gaussian_filter_with_edge_replication(spatial):
    image = torch.rand((2, 1, *spatial), generator=torch.Generator().manual_seed(2), dtype=torch.float32)
    sigma = 0.75  # radius ceil(3 sigma) = 3 here and in scipy (int(4 sigma + 0.5))
    got = gaussian_blur(image, sigma)
    want = np.stack([ndimage.gaussian_filter(x[0], sigma, mode="nearest", truncate=4.0) for x in image.numpy()])
    assert got.shape == image.shape
    np.testing.assert_allclose(got[:, 0].numpy(), want, atol=1e-6)
