"""The streaming sliding window: its z-slabs equal a plain whole-volume Σ w·p / Σ w computed here, cover the
volume once in order, and a window resumed at a plane gives exactly the planes of the full run."""

import itertools

import pytest
import torch
from windows import sliding_window

from cellseg.infer.sliding_window import gaussian_weight, sliding_window_slabs, tile_starts


def _model(batch: torch.Tensor) -> torch.Tensor:
    """Two position-dependent outputs (not translation-equivariant: tile placement matters)."""
    ramp = torch.linspace(0.1, 0.9, batch.shape[-1])
    return torch.cat([torch.sigmoid(batch * ramp), batch.square() * ramp], dim=1)


def _plain(image: torch.Tensor, patch: tuple[int, int, int], overlap: float) -> torch.Tensor:
    """Whole-volume sums over every tile, in the same z-major order (the definition, without streaming)."""
    shape = image.shape[1:]
    weight = gaussian_weight(patch)
    total = torch.zeros((2, *shape))
    norm = torch.zeros(shape)
    starts = [tile_starts(s, p, overlap) for s, p in zip(shape, patch, strict=True)]
    for corner in itertools.product(*starts):
        t = tuple(slice(c, c + p) for c, p in zip(corner, patch, strict=True))
        tile = image[(slice(None), *t)][None]
        out = (_model(tile[:, :, 0]) if patch[0] == 1 else _model(tile))[0].half().float()
        total[(slice(None), *t)] += out.reshape(2, *patch) * weight
        norm[t] += weight
    return total / norm


@pytest.mark.parametrize(("patch", "overlap", "batch"), [((8, 16, 16), 0.5, 3), ((6, 8, 12), 0.25, 5),
                                                         ((1, 8, 8), 0.5, 7)])
def test_streamed_slabs_equal_the_whole_volume_sums(patch, overlap, batch):
    image = torch.rand((1, 37, 29, 23), generator=torch.Generator().manual_seed(0))
    slabs = list(sliding_window_slabs(_model, image, patch_vox=patch, num_outputs=2, overlap=overlap,
                                      batch_size=batch))
    assert [z0 for z0, _ in slabs] == sorted(z0 for z0, _ in slabs) and slabs[0][0] == 0
    assert sum(s.shape[1] for _, s in slabs) == image.shape[1]  # every plane once
    streamed = torch.cat([s for _, s in slabs], dim=1)
    assert torch.equal(streamed, _plain(image, patch, overlap))


def test_a_window_resumed_at_a_plane_gives_the_full_runs_planes_with_fewer_tiles():
    image = torch.rand((1, 40, 20, 20), generator=torch.Generator().manual_seed(1))
    calls = {"full": 0, "resumed": 0}

    def counting(key):
        def predict(batch):
            calls[key] += batch.shape[0]
            return _model(batch)
        return predict

    options = dict(patch_vox=(8, 16, 16), num_outputs=2, overlap=0.5, batch_size=4)
    full = sliding_window(counting("full"), image, **options)
    slabs = list(sliding_window_slabs(counting("resumed"), image, start_plane=21, **options))
    assert slabs[0][0] == 21
    resumed = torch.cat([s for _, s in slabs], dim=1)
    assert torch.equal(resumed, full[:, 21:])
    assert calls["resumed"] < calls["full"]


def test_small_volume_is_padded_and_cropped_back():
    image = torch.rand((1, 3, 5, 4), generator=torch.Generator().manual_seed(2))
    out = sliding_window(_model, image, patch_vox=(8, 16, 16), num_outputs=2, pad_value=0.0)
    assert out.shape == (2, 3, 5, 4) and torch.isfinite(out).all()
