"""Typed configuration of inference: how a trained run predicts (`InferConfig`).

Same rules as the training schema (`cellseg.config.schema`): frozen, keyword-only dataclasses whose
`__post_init__` raises `ValueError` naming the key and the valid choices; YAML files under `configs/infer/`
set them, with `key=value` overrides (`cellseg.config.load`); `docs/config.md` is generated from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cellseg.config.schema import _check

STORE_CHUNK_VOX = 64  # the prediction store's chunk edge (`cellseg.data.write.DEFAULT_CHUNK`)


@dataclass(frozen=True, kw_only=True)
class InferConfig:
    """How a trained run predicts crops (`cellseg predict`, `cellseg predict-ensemble`).

    Attributes:
        tta: test-time transforms averaged per tile: 8 (3D: identity + 7 flip combinations; 2D: the 8 in-plane
            symmetries) or 1 (none).
        overlap: fraction of a tile shared with its neighbour, in [0, 1).
        blend: "gaussian" (tiles weighted towards their centre) or "constant".
        checkpoint: "best", "last" or the path of a checkpoint file of the run.
        batch_size: tiles per sliding-window batch (null: the run's training micro-batch).
        tta_fold: TTA passes per forward, batched together (null: on CUDA the fewest that give 16 Mi tile voxels
            per forward; 1 on CPU).
        device: "auto" (CUDA when available), "cpu" or "cuda".
        axes_2d: 2D models: slice across "z" only, or across "zyx" and average (isotropic voxels only).
        channels: "scored" (a test crop gets only the classes it is scored on and their boundary channels) or
            "all" (every output channel for every crop).
        block_vox: cut a crop into columns of at most this many voxels in y and x (2D over z, y and x: cubic
            blocks); null: as large as host and GPU memory allow.
        compile: torch.compile the model: "auto" (CUDA only), "on" or "off"; a compiler error falls back to eager.
        uint8: store round(255 p) as uint8 instead of float16.
        overwrite: replace the output store entirely (default: add the missing crops to it).
        data_root: data root to read from instead of the run's `data.root` (null: the run's).
        progress: show progress bars.
    """

    tta: int = 8
    overlap: float = 0.5
    blend: Literal["gaussian", "constant"] = "gaussian"
    checkpoint: str = "best"
    batch_size: int | None = None
    tta_fold: int | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    axes_2d: Literal["z", "zyx"] = "z"
    channels: Literal["scored", "all"] = "scored"
    block_vox: int | None = None
    compile: Literal["auto", "on", "off"] = "auto"
    uint8: bool = False
    overwrite: bool = False
    data_root: str | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        _check(self.tta >= 1, f"infer.tta={self.tta} (--tta {self.tta}): need at least 1 (1 = no test-time "
               "augmentation)")
        _check(0 <= self.overlap < 1, f"infer.overlap={self.overlap} (--overlap {self.overlap}): must be in [0, 1)")
        _check(self.batch_size is None or self.batch_size >= 1,
               f"infer.batch_size={self.batch_size} (--batch-size {self.batch_size}): must be at least 1")
        _check(self.tta_fold is None or (self.tta_fold >= 1 and self.tta % self.tta_fold == 0),
               f"infer.tta_fold={self.tta_fold} (--tta-fold {self.tta_fold}): must divide infer.tta={self.tta}")
        _check(self.blend in ("gaussian", "constant"), f"infer.blend={self.blend!r}: choose 'gaussian' or 'constant'")
        _check(self.block_vox is None or self.block_vox >= 1,
               f"infer.block_vox={self.block_vox} (--block {self.block_vox}): must be a positive number of voxels "
               f"(multiples of {STORE_CHUNK_VOX}, the store's chunk, write whole chunks)")
        _check(self.channels in ("scored", "all"), f"infer.channels={self.channels!r}: choose 'scored' or 'all'")
        _check(self.compile in ("auto", "on", "off"), f"infer.compile={self.compile!r}: choose 'auto', 'on' or 'off'")
        _check(self.axes_2d in ("z", "zyx"), f"infer.axes_2d={self.axes_2d!r}: choose 'z' or 'zyx'")
        _check(self.device in ("auto", "cpu", "cuda"), f"infer.device={self.device!r}: choose 'auto', 'cpu' or 'cuda'")
