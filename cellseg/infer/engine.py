"""The prediction engine shared by `cellseg predict` and validation during training: a model over one box
of EM, streamed out in z-slabs (`predict_slabs`) or whole (`predict_volume`), run as a `Window` says.

For one box: read the EM over the box on the model's grid plus half a patch of context on every side (from the
full EM volume; outside it the EM pad value), then the Gaussian-blended sliding window
(`cellseg.infer.sliding_window`) with batched tiles, each batch averaged over the TTA transforms
(`cellseg.infer.tta`), bf16 autocast on CUDA, sigmoid probabilities, optionally through the model under
torch.compile (`CompiledModel`). A 2D model predicts slice by slice; across z only, or across z, y and x
(isotropic voxels) with the three results averaged (`predict_volume`).

Data that is not there is never predicted silently: `require_em` refuses a box no EM level holds data for (a
partial download), naming the crop, the level and the `cellseg fetch` option, and the tiles whose EM is mostly at
the padding value are counted, batch by batch on the device, and reported in one warning per crop.

Shapes: `K` output channels, `C` image channels (1), `B` tiles, `S` a tile's spatial axes, `ZYX` the box's grid
(plus context while predicting).
"""

from __future__ import annotations

import functools
import logging
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from cellseg import runtime
from cellseg.data.arrays import Level, MultiscaleImage
from cellseg.data.grid import Grid
from cellseg.infer import tta
from cellseg.infer.sliding_window import sliding_window_slabs
from cellseg.infer.tiling import AXIS_INDEX, context_margin, stream_bytes, working_device
from cellseg.runtime.compile import CompiledModel, compile_backend

log = logging.getLogger(__name__)
EM_SCALE = 255.0  # uint8 EM -> [0, 1], as in training (`cellseg.data.augment`)
MOSTLY_PADDING = 0.5  # a tile with more than this share of its EM voxels at the padding value is "mostly padding"


def context_grid(grid: Grid, margin_vox: Sequence[int]) -> Grid:
    """`grid` enlarged by `margin_vox` voxels on each side (z, y, x): the EM a box is predicted from."""
    vs = grid.voxel_size_nm
    return Grid.of(translation_nm=[t - m * v for t, m, v in zip(grid.translation_nm, margin_vox, vs, strict=True)],
                   shape_vox=[n + 2 * m for n, m in zip(grid.shape_vox, margin_vox, strict=True)], voxel_size_nm=vs)


def _read_em(em: MultiscaleImage, grid: Grid, margin: Sequence[int], pad_value: int) -> torch.Tensor:
    """(1, Z, Y, X) uint8 EM over the grid enlarged by `margin` voxels per side (scaled to [0, 1] per tile)."""
    data = em.read(**context_grid(grid, margin).read_kwargs(), interpolation="area", pad_value=pad_value,
                   dtype=np.uint8)
    return torch.from_numpy(data)[None]


class PaddingTally:
    """Tiles of one crop whose EM is mostly at the padding value: counted per batch where the tiles are (no
    device synchronisation), reported in one warning (`report`)."""

    def __init__(self, what: str):
        self.what, self.tiles, self.warned = what, 0, False
        self.mostly: torch.Tensor | None = None

    def add(self, tiles_BCS: torch.Tensor, pad_value: int) -> None:
        """Count a batch of uint8 EM tiles."""
        padded = (tiles_BCS == pad_value).flatten(1).sum(1)
        n = (padded > MOSTLY_PADDING * tiles_BCS[0].numel()).sum()
        self.mostly = n if self.mostly is None else self.mostly + n
        self.tiles += tiles_BCS.shape[0]

    def report(self, pad_value: int) -> None:
        """Warn, once, when some tile counted so far was mostly padding."""
        mostly = 0 if self.warned or self.mostly is None else int(self.mostly)
        if mostly:
            self.warned = True
            log.warning("%s: %d of %d tiles (%.0f%%) read EM mostly (> %.0f%%) at the padding value %d: outside the "
                        "volume, its black border or chunks never downloaded. The model sees the padding, not EM: "
                        "where it is only context (at a volume's edge) the voxels beside it are predicted with less "
                        "context; voxels with no EM under them are predicted from nothing",
                        self.what, mostly, self.tiles, 100 * mostly / self.tiles, 100 * MOSTLY_PADDING, pad_value)


_TALLIES: weakref.WeakKeyDictionary[MultiscaleImage, PaddingTally] = weakref.WeakKeyDictionary()


def require_em(em: MultiscaleImage, grid: Grid, *patches_vox: Sequence[int], axes: Sequence[str] = ("z",),
               what: str) -> Level:
    """The EM level a box is predicted from, its context included (half of the largest of `patches_vox` around it,
    `axes`: a 2D model's slicing axes); names the box `what` (e.g. "crop 12") in the padding warning.

    Raises:
        ValueError: no EM level's chunks under the box were downloaded (`MultiscaleImage.require_data`: the message
            names `what`, the level and the `cellseg fetch` option that brings it).
    """
    margin = np.max([context_margin(p, axes) for p in patches_vox], axis=0)
    box = context_grid(grid, [int(m) for m in margin])
    level = em.require_data(box.translation_nm, box.shape_vox, box.voxel_size_nm, what=what)
    _TALLIES[em] = PaddingTally(what)
    return level


# Tile voxels per forward below which a forward is bound by kernel launches (CPU), not the GPU: the ViT-B of
# vit_2d runs 16 tiles of 256² (1 M voxels) at 3.6 ms of GPU work in 8.8 ms, and 64 tiles at 2.5x the
# throughput per tile. Engine ms per tile pass at 2, 4, 8 passes per forward (H200, bench/forward_probe.py):
# vit_3d 5.76 / 5.65 / 5.31, unet_2d 0.158 / 0.153 / -, swin_2d - / 0.383 / 0.380; wider never lost.
# `tta_fold` runs that many TTA passes as one batch.
MIN_FORWARD_VOX = 16 * 2**20


def make_forward(model: torch.nn.Module, *, device: torch.device, precision: runtime.Precision,
                 channels_last: bool = False, keep: Sequence[int] | None = None,
                 compiled: CompiledModel | None = None, batch_size: int | None = None
                 ) -> Callable[[torch.Tensor], torch.Tensor]:
    """uint8 EM tile batch (B, C, *S) → float32 sigmoid probabilities (B, K, *S) under autocast (K: the `keep`
    outputs). With `compiled`, batches run through it, the last one padded to `batch_size` tiles so that every
    call has the shape it was compiled for, and the kept channels' probabilities are one compiled kernel
    (`probabilities`)."""
    formats: dict[int, torch.memory_format] = {}
    index = None if keep is None else torch.tensor(list(keep), device=device)
    compile_post = compiled is not None and index is not None and COMPILE_PROBABILITIES
    post = compiled_probabilities(compile_backend()) if compile_post else probabilities
    if compile_post:
        torch._dynamo.mark_dynamic(index, 0)  # one graph for any number of kept channels

    def forward(batch: torch.Tensor) -> torch.Tensor:
        fmt = formats.setdefault(batch.ndim, runtime.memory_format(batch.ndim - 2, channels_last))
        image = (batch.to(torch.float32) / EM_SCALE).contiguous(memory_format=fmt)  # as in training
        n = image.shape[0]
        if compiled is not None and batch_size and n < batch_size:  # the last batch: pad to the compiled shape
            image = torch.cat([image, image[-1:].expand(batch_size - n, *image.shape[1:])])
        with runtime.autocast(device, precision):
            logits = (compiled or model)(image)[:n]
        if index is None:
            return torch.sigmoid(logits.float())
        return post(logits, index)

    return forward


def probabilities(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """float32 sigmoid of the `index` channels of the logits (B, K, *S) → (B, k, *S). Eagerly, three passes over
    memory (a gather, a cast, the sigmoid): on a 2D model the gather alone was 8 % of the GPU time (H200
    profile, `forward_probe_h200_profile_2d.json`); compiled (`compiled_probabilities`), one kernel.
    `index_select` on the channels-last logits: made channels-first first, it was slower (8.7 vs 7.4 ms per
    unet_3d tile pass, H200, bench/forward_probe.py)."""
    return torch.sigmoid(logits.index_select(1, index).float())


class _Probabilities(torch.nn.Module):
    def forward(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return probabilities(logits, index)


# False: `make_forward` runs `probabilities` eagerly after a compiled model (bench/forward_probe.py compares).
COMPILE_PROBABILITIES = True


@functools.cache
def compiled_probabilities(backend: str) -> CompiledModel:
    """`probabilities` under torch.compile with `backend` (`compile_module` reads it), shared by every model of
    the process: one graph per logits shape, the number of kept channels dynamic; eager, with a warning, if it
    fails to compile."""
    return CompiledModel(_Probabilities())


def tta_fold(batch_size: int, patch_vox: Sequence[int], num_transforms: int, device: torch.device) -> int:
    """TTA passes per forward (a power of two dividing `num_transforms`): the fewest that give a forward
    `MIN_FORWARD_VOX` tile voxels; 1 on CPU (no launch overhead to hide, and memory grows with it)."""
    fold, tile = 1, math.prod(patch_vox)
    while (device.type == "cuda" and batch_size * fold * tile < MIN_FORWARD_VOX
           and num_transforms % (2 * fold) == 0):
        fold *= 2
    return fold


@dataclass(frozen=True, kw_only=True)
class Window:
    """How `predict_slabs` and `predict_volume` run the model over a box: the sliding window and TTA settings
    (module docstring)."""

    patch_vox: tuple[int, int, int]  # tile shape (z, y, x); (1, H, W) for a 2D model
    device: torch.device
    precision: runtime.Precision
    overlap: float = 0.5
    batch_size: int = 4
    blend: str = "gaussian"
    transforms: tuple[tta.Transform, ...] = ()  # default: the identity only
    channels_last: bool = False  # channels_last(_3d) tiles (CUDA only)
    pad_value: int = 0  # uint8 EM value outside the volume
    compiled: CompiledModel | None = None  # the model under torch.compile (`make_forward`)
    tta_fold: int = 1  # TTA passes per forward (`tta_fold`): the model sees batch_size × tta_fold tiles

    @property
    def is_2d(self) -> bool:
        """A 2D model's window: tiles one plane thick."""
        return self.patch_vox[0] == 1


@torch.inference_mode()  # also across a generator's suspensions
def predict_slabs(model: torch.nn.Module, em: MultiscaleImage, grid: Grid, window: Window, *, num_outputs: int,
                  axis: str = "z", keep: Sequence[int] | None = None, start: int = 0, dtype: torch.dtype = torch.float16,
                  on_tiles: Callable[[int], None] | None = None, host: bool = True
                  ) -> Iterator[tuple[int, np.ndarray]] | Iterator[tuple[int, torch.Tensor]]:
    """Probabilities over `grid`, streamed in slabs along `axis` as the sliding window completes them.

    Args:
        model: in eval mode on `window.device`; 3D `(B, C, Z, Y, X)` or 2D `(B, C, Y, X)`.
        em: the dataset's EM, read in world coordinates with `window.pad_value` outside the volume.
        grid: the output grid (the model's voxel size).
        num_outputs: the model's output channels.
        axis: the slab axis: "z" for a 3D model; for a 2D model the axis its slices are cut across.
        keep: indices of the model outputs to return, in this order (default all); the others are dropped
            before TTA and blending.
        start: first plane (along `axis`, in the grid) to return; batches that only touch earlier planes are
            skipped, and the planes returned equal those of a run from 0 (a resumed crop).
        dtype: of the slabs (float16: what the store keeps; float32 for exact sums across axes).
        on_tiles: called with the number of tiles after every batch (progress bars).
        host: yield numpy arrays in host memory; False: tensors where the sums live (the GPU, normally), for a
            caller that keeps working on them there (`cellseg.infer.fused`).

    Yields:
        (offset along `axis` in the grid, (K, *grid with `axis` cut to the slab) array), in order, covering
        [start, grid size along `axis`) once.
    """
    tfms = list(window.transforms or tta.transforms(2 if window.is_2d else 3, (), 1))
    a = AXIS_INDEX[axis]
    if not window.is_2d and a != 0:
        raise ValueError(f"a 3D model streams along z, not {axis}")
    margin = context_margin(window.patch_vox, [axis])
    image_CZYX = _read_em(em, grid, margin, window.pad_value)
    if window.is_2d:  # only the box's slices are predicted, moved to the front (tiles are cut across axis 0)
        image_CZYX = image_CZYX[(slice(None),) * (1 + a) + (slice(margin[a], margin[a] + grid.shape_vox[a]),)]
        image_CZYX = image_CZYX.movedim(1 + a, 1)
    inner = [margin[d] for d in range(3) if d != a]
    shape = [grid.shape_vox[d] for d in range(3) if d != a]
    num_outputs = num_outputs if keep is None else len(keep)
    plane = [n + 2 * m for n, m in zip(shape, inner, strict=True)]
    work = working_device(window.device, stream_bytes(num_outputs, window.patch_vox, plane))
    image_CZYX = image_CZYX.to(working_device(window.device, image_CZYX.numel()))
    forward = make_forward(model, device=window.device, precision=window.precision, keep=keep,
                           channels_last=window.channels_last and window.device.type == "cuda",
                           compiled=window.compiled, batch_size=window.batch_size * window.tta_fold)

    tally = _TALLIES.get(em)
    if tally is None:  # a box no `require_em` named (validation during training): one warning per EM handle
        tally = _TALLIES.setdefault(em, PaddingTally(f"{em.location}, box from {grid.start_nm} nm"))

    def predict(tiles_BCS: torch.Tensor) -> torch.Tensor:
        tally.add(tiles_BCS, window.pad_value)
        out = tta.tta_predict(forward, tiles_BCS, tfms, fold=window.tta_fold)
        if on_tiles is not None:
            on_tiles(tiles_BCS.shape[0])
        return out

    lead = 0 if window.is_2d else margin[0]  # context planes before the box along the slab axis
    crop = (slice(None), slice(None), *(slice(m, m + n) for m, n in zip(inner, shape, strict=True)))
    slabs = sliding_window_slabs(predict, image_CZYX, patch_vox=window.patch_vox, num_outputs=num_outputs,
                                 overlap=window.overlap, batch_size=window.batch_size, blend=window.blend,
                                 device=window.device, accumulate_on=work, pad_value=window.pad_value,
                                 start_plane=lead + start)
    try:
        for z0, slab in slabs:
            lo, hi = max(z0, lead), min(z0 + slab.shape[1], lead + grid.shape_vox[a])
            if hi > lo:  # the box's planes of the slab, converted where the sums live, then copied to the host
                out = slab[:, lo - z0:hi - z0][crop].to(dtype)
                _check_finite(out, lo - lead, axis)
                yield lo - lead, (to_host(out).movedim(1, 1 + a).numpy() if host else out.movedim(1, 1 + a))
    except GeneratorExit:  # a consumer that stops at the last plane (`cellseg.infer.fused`) closes the generator
        tally.report(window.pad_value)
        raise
    tally.report(window.pad_value)


def _check_finite(probs: torch.Tensor, first_plane: int, axis: str) -> None:
    """Refuse NaN or infinite probabilities (broken weights or input) before they reach a store. One reduction
    where the slab lives; the copy to the host that follows synchronises anyway.

    Raises:
        ValueError: naming the output channels (model order of the kept ones) and the planes affected.
    """
    finite = torch.isfinite(probs).flatten(1).all(dim=1)
    if not bool(finite.all()):
        bad = torch.nonzero(~finite).flatten().tolist()
        raise ValueError(f"the model predicted NaN or infinite probabilities in output channel(s) {bad} (of those "
                         f"kept), planes {first_plane}-{first_plane + probs.shape[1] - 1} along {axis}: its weights "
                         "or its input are broken; nothing was written for these planes")


def to_host(t: torch.Tensor) -> torch.Tensor:
    """`t` in host memory; from a GPU through pinned memory (torch's caching host allocator reuses it): a copy to
    pageable memory ran at ~2 GB/s on an H200 host, a third of a 2D model's streaming time."""
    if not t.is_cuda:
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t)


@torch.inference_mode()
def predict_volume(model: torch.nn.Module, em: MultiscaleImage, grid: Grid, window: Window, *, num_outputs: int,
                   slice_axes: Sequence[str] = ("z",), keep: Sequence[int] | None = None,
                   dtype: torch.dtype = torch.float32, on_tiles: Callable[[int], None] | None = None) -> np.ndarray:
    """(K, Z, Y, X) probabilities of every output channel on `grid`: the slabs of `predict_slabs` (see there
    for the arguments) put together; a 2D model sliced across several axes averages them. What `cellseg predict`
    (a block of a crop), validation during training and the benchmarks call.

    Args:
        slice_axes: 2D only: the axes slices are cut across; the predictions are averaged.
        dtype: of the result (float32, or float16 to halve host memory: what the store keeps anyway).
    """
    axes = list(slice_axes) if window.is_2d else ["z"]
    k = num_outputs if keep is None else len(keep)
    total = torch.zeros((k, *grid.shape_vox), dtype=torch.float32 if len(axes) > 1 else dtype)
    for axis in axes:
        a = AXIS_INDEX[axis]
        for offset, slab in predict_slabs(model, em, grid, window, num_outputs=num_outputs, axis=axis, keep=keep,
                                          dtype=total.dtype, on_tiles=on_tiles):
            region = total[(slice(None),) * (1 + a) + (slice(offset, offset + slab.shape[1 + a]),)]
            if len(axes) > 1:  # averaged over the slicing axes
                region.add_(torch.from_numpy(slab))
            else:
                region.copy_(torch.from_numpy(slab))
    return (total if len(axes) == 1 else total / len(axes)).to(dtype).numpy()
