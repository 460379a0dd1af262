"""Resident training data: each training crop read once into memory, every batch cut from it with slices.

The streaming loader (`dataset.py`, `loader.py`) reads every patch from zarr in DataLoader workers: chunk
decoding, resampling and target packing, sample after sample. The annotated data at one voxel size is small,
so resident data reads each training crop once instead, into a block (`cellseg.data.blocks`: the crop's EM
with the margin its samples can reach, its targets in the compact form the workers ship), in GPU memory when
it fits, else in host memory; a batch is then cut on the GPU (or on the CPU into one pinned buffer, copied to
the GPU in one transfer).

Same samples as streaming: sample i is `PatchSampler(i)` → `PatchSpec` → `PatchDataset.grid_for` (rotated
samples take the context-enlarged window, the others the patch centred in a zero frame), and the
`EpochSampler` decides which indices form a batch, so seeds, epochs and resumed runs behave the same. Where
the EM has a level at the training voxel size, windows are plain slices and a batch equals the streaming
loader's bit for bit: EM, ids, class bits and known masks, and the boundary channels whenever the streaming
loader takes them from `data.boundary_cache` (blocks compute them over the whole crop, as the cache does; per
patch the streaming loader misses touching voxels on the patch's faces). Where no EM level has the training
voxel size, a block is resampled once, on the lattice of the closest level, and samples snap to that lattice:
a sample moves by less than half a voxel from where the streaming loader would read it, and its EM is the
block's resampling.

Where the data goes (`data.resident`, `choose_placement`): GPU memory when the blocks fit a share of what the
model and a training step leave free, else host memory within a budget, else streaming, with a notice.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from cellseg.config.schema import DataConfig
from cellseg.data.blocks import Block, Layout, block_grid, block_nbytes, fill_block
from cellseg.data.dataset import EpochSampler, PatchDataset
from cellseg.data.grid import Grid

log = logging.getLogger(__name__)
Placement = Literal["gpu", "host", "off"]
HOST_AVAILABLE_SHARE = 0.5  # never take more than this share of the host memory available now


def choose_placement(mode: str, nbytes: int, *, cuda: bool, gpu_room_bytes: int, gpu_share: float,
                     host_budget_bytes: int) -> tuple[Placement, str]:
    """Where resident data of `nbytes` goes under `data.resident=mode` (see `DataConfig`), and why (for the log).

    "auto" takes the GPU when the data fits `gpu_share` of `gpu_room_bytes`, "gpu" when it fits all of it; both
    fall back to host memory within `host_budget_bytes`, "host" goes there only; anything else streams ("off").
    """
    if mode == "off":
        return "off", "data.resident=off"
    why = []
    if mode in ("auto", "gpu"):
        room = int(gpu_room_bytes * (gpu_share if mode == "auto" else 1.0))
        if cuda and nbytes <= room:
            return "gpu", f"{_gb(nbytes)} fit the GPU's {_gb(room)}"
        share = "data.resident_gpu_share of " if mode == "auto" else ""
        why.append(f"{_gb(nbytes)} exceed {share}the GPU's free {_gb(room)}" if cuda else "no CUDA device")
    if mode in ("auto", "gpu", "host") and nbytes <= host_budget_bytes:
        return "host", "; ".join([*why, f"{_gb(nbytes)} fit the host budget of {_gb(host_budget_bytes)}"])
    why.append(f"{_gb(nbytes)} exceed the host budget of {_gb(host_budget_bytes)} (data.resident_host_gb)")
    return "off", "; ".join(why)


def host_budget_bytes(cfg: DataConfig) -> int:
    """`data.resident_host_gb` shared by the machine's training processes (torchrun's LOCAL_WORLD_SIZE), at most
    `HOST_AVAILABLE_SHARE` of the memory available now."""
    share = cfg.resident_host_gb * 1e9 / int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    available = _available_host_bytes()
    return int(min(share, HOST_AVAILABLE_SHARE * available) if available else share)


def _available_host_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), else None."""
    meminfo = Path("/proc/meminfo")
    if not meminfo.is_file():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024  # reported in kB
    return None


def _gb(nbytes: float) -> str:
    """A byte count for the log: GB, or MB below 1 GB."""
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


class ResidentLoader:
    """Batches cut from resident blocks: an iterable in place of the DataLoader, with the same batch dict and the
    same `EpochSampler` contract (`sampler.set_epoch(epoch, start_batch=...)`, then `iter(loader)`).

    Args:
        dataset: the streaming dataset (sampler, windows, targets' encoding); nothing is read through it here.
        sampler: the rank's `EpochSampler`.
        blocks: one per training crop, in crop order.
        batch_size: samples per batch (the last, incomplete batch of an epoch is dropped, as the DataLoader does).
        device: where batches are delivered; blocks on another device are cut there and copied in one transfer.
        placement: "gpu" or "host", for the log and `TrainData.resident`.

    Example:
        >>> loader = build_resident(dataset, epochs, cfg, batch_size=8, device=torch.device("cuda"))
        >>> image, target, known = augment(next(iter(loader)), step=0)
    """

    def __init__(self, dataset: PatchDataset, sampler: EpochSampler, blocks: Sequence[Block], *, batch_size: int,
                 device: torch.device, placement: Placement, setup_s: float = 0.0):
        self.dataset, self.sampler, self.blocks = dataset, sampler, list(blocks)
        self.batch_size, self.device, self.placement, self.setup_s = batch_size, device, placement, setup_s
        self.layout = Layout.of(dataset)
        self.nbytes = sum(b.nbytes for b in self.blocks)
        self._centre, self._frame = _centre_and_frame(dataset.read_shape_vox, dataset.patch_shape_vox)
        self._luts = None
        if self.layout.ids:  # (crops, 2, Kb, 256): target and known tables per crop
            tables = [np.stack(c.lookup_tables) for c in dataset.crops]
            self._luts = torch.from_numpy(np.stack(tables)).to(device)

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        indices = iter(self.sampler)
        while len(chunk := list(itertools.islice(indices, self.batch_size))) == self.batch_size:
            yield self.batch(chunk)

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """The batch of these global sample indices, on `self.device`."""
        source = self.blocks[0].em.device
        pin = source.type == "cpu" and self.device.type == "cuda"
        zeroed = source.type == "cuda"  # there one memset of the batch costs less than zeroing frames one by one
        cut = (torch.zeros if zeroed else torch.empty)((len(indices), self.layout.width, *self.dataset.read_shape_vox),
                                                       dtype=torch.uint8, device=source, pin_memory=pin)
        meta = torch.tensor([self._cut(cut[b], i, zeroed=zeroed) for b, i in enumerate(indices)], dtype=torch.int64)
        cut, meta = _to_device(cut, self.device), _to_device(meta, self.device)
        batch: dict[str, torch.Tensor] = {**self.layout.batch(cut), "crop": meta[:, 0], "seed": meta[:, 1],
                                          "rotate": meta[:, 2].bool()}
        if self._luts is not None:
            luts = self._luts[meta[:, 0]]
            batch.update(target_lut=luts[:, 0], known_lut=luts[:, 1])
        return batch

    def _cut(self, out: torch.Tensor, i: int, *, zeroed: bool) -> tuple[int, int, int]:
        """Copy sample i into `out` `(W, *read)` (already zero if `zeroed`); returns (crop, seed, rotate)."""
        ds = self.dataset
        spec = ds.sampler(int(i))
        rotate = ds.rotates(spec)
        grid = ds.grid_for(spec, None if rotate else ds.patch_shape_vox)
        block = self.blocks[spec.crop]
        start = block.start_of(grid)
        if not rotate:  # the patch centred in a zero frame of the read shape, as the streaming loader pads it
            for region in [] if zeroed else self._frame:
                out[region].zero_()
            out = out[self._centre]
        if spec.slice_axis != 0 and grid.shape_vox[spec.slice_axis] == 1:  # 2D across y or x: the batch has the
            out = out.movedim(1, 1 + spec.slice_axis)  # slicing axis first; the block, in world orientation
        block.cut(out, start, zeroed=zeroed)
        return spec.crop, spec.seed, int(rotate)


def _centre_and_frame(read: Sequence[int], patch: Sequence[int]) -> tuple[tuple[slice, ...], list[tuple[slice, ...]]]:
    """Index of the patch centred in a `(W, *read)` box, and of the (at most 6) boxes around it."""
    inner: list[slice] = [slice(None)]
    frame = []
    for n, m in zip(read, patch, strict=True):
        lo = (n - m) // 2  # the streaming loader's `_centre_pad` puts the odd voxel after the patch
        frame += [(*inner, slice(0, lo)), (*inner, slice(lo + m, n))] if n > m else []
        inner.append(slice(lo, lo + m))
    return tuple(inner), frame


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` on `device`; a host tensor bound for a GPU goes through pinned memory, without waiting for the copy."""
    if t.device == device or (device.type == t.device.type and device.index is None):
        return t
    if device.type == "cuda" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def build_resident(dataset: PatchDataset, sampler: EpochSampler, cfg: DataConfig, *, batch_size: int,
                   device: torch.device, gpu_room_bytes: int | None = None, progress: bool = False
                   ) -> ResidentLoader | None:
    """Read the training crops into blocks where `data.resident` and the budgets allow; None means streaming.

    Args:
        dataset, sampler: the streaming dataset and the rank's `EpochSampler` (they define the samples).
        cfg: `data.resident`, `resident_host_gb` and `resident_gpu_share`.
        batch_size: samples per batch.
        device: the training device.
        gpu_room_bytes: GPU memory the training leaves free (`cellseg.train.setup` measures it after the model and
            one step at the batch size); default: what is free now.
        progress: show a progress bar while reading.
    """
    start = time.perf_counter()
    layout = Layout.of(dataset)
    points = dataset.sampler.index.points
    grids = [block_grid(c, points[k], dataset) for k, c in enumerate(dataset.crops)]
    nbytes = sum(block_nbytes(g, c, layout) for g, c in zip(grids, dataset.crops, strict=True))
    cuda, host_budget = device.type == "cuda", host_budget_bytes(cfg)
    if gpu_room_bytes is None:
        gpu_room_bytes = torch.cuda.mem_get_info(device)[0] if cuda else 0
    placement, why = choose_placement(cfg.resident, nbytes, cuda=cuda, gpu_room_bytes=gpu_room_bytes,
                                      gpu_share=cfg.resident_gpu_share, host_budget_bytes=host_budget)
    blocks = _allocate(grids, dataset, layout, device if placement == "gpu" else torch.device("cpu"), placement)
    if blocks is None and placement == "gpu":  # the estimate was wrong: never an out-of-memory error from here
        placement, why = choose_placement("host", nbytes, cuda=cuda, gpu_room_bytes=0, gpu_share=0.0,
                                          host_budget_bytes=host_budget)
        why = f"the GPU allocation failed; {why}"
        blocks = _allocate(grids, dataset, layout, torch.device("cpu"), placement)
    if blocks is None:
        if cfg.resident != "off":
            log.warning("training data streams from zarr through loader workers (%s)", why)
        return None
    if cfg.resident in ("auto", placement):
        log.info("resident training data in %s memory (%s)", placement, why)
    else:
        log.warning("data.resident=%s: the training data goes to %s memory instead (%s)", cfg.resident, placement, why)
    _fill(blocks, dataset, layout, progress=progress)
    return ResidentLoader(dataset, sampler, blocks, batch_size=batch_size, device=device, placement=placement,
                          setup_s=time.perf_counter() - start)


def _allocate(grids: Sequence[Grid], dataset: PatchDataset, layout: Layout, device: torch.device,
              placement: Placement) -> list[Block] | None:
    """Empty blocks on `device`; None when `placement` is "off" or the memory is not there (logged)."""
    if placement == "off":
        return None
    try:
        return [Block.empty(g, c, layout=layout, device=device) for g, c in zip(grids, dataset.crops, strict=True)]
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as err:  # RuntimeError: a failed CUDA allocation
        log.warning("resident training data: %s memory could not be allocated (%s)", placement,
                    str(err).splitlines()[0] if str(err) else type(err).__name__)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return None


def _fill(blocks: Sequence[Block], dataset: PatchDataset, layout: Layout, *, progress: bool) -> None:
    """Read every block (with a progress bar), logging crops, bytes and seconds per CellMap dataset."""
    from tqdm import tqdm

    stats: dict[str, tuple[int, int, float]] = {}
    total = sum(b.nbytes for b in blocks)
    with tqdm(total=total, unit="B", unit_scale=True, desc="resident training data", disable=not progress,
              leave=False) as bar:
        for block, crop in zip(blocks, dataset.crops, strict=True):
            start = time.perf_counter()
            fill_block(block, crop, dataset, layout, bar)
            crops, nbytes, seconds = stats.get(block.dataset, (0, 0, 0.0))
            stats[block.dataset] = (crops + 1, nbytes + block.nbytes, seconds + time.perf_counter() - start)
    for name, (crops, nbytes, seconds) in sorted(stats.items()):
        log.info("resident training data, %s: %d crops, %s, read in %.1f s", name, crops, _gb(nbytes), seconds)
    log.info("resident training data: %d crops, %s on %s, read in %.1f s", len(blocks), _gb(total),
             blocks[0].em.device, sum(s[2] for s in stats.values()))
