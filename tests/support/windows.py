"""The whole volume a streaming sliding window predicts, for tests that compare volumes."""

from collections.abc import Sequence
from typing import Any

import torch

from cellseg.infer.sliding_window import PredictFn, sliding_window_slabs


def sliding_window(predict: PredictFn, image: torch.Tensor, *, patch_vox: Sequence[int], num_outputs: int,
                   **options: Any) -> torch.Tensor:
    """The (K, Z, Y, X) float32 result of `sliding_window_slabs` (same arguments): its z-slabs joined in order."""
    slabs = sliding_window_slabs(predict, image, patch_vox=patch_vox, num_outputs=num_outputs, **options)
    return torch.cat([slab for _, slab in slabs], dim=1)
