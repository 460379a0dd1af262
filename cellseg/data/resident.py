"""Resident training data: each training crop read once into memory, every batch cut from it with slices.

The streaming loader (`dataset.py`, `loader.py`) reads every patch from zarr in DataLoader workers: chunk
decoding, resampling and target packing, sample after sample. The annotated data at one voxel size is small,
so this module reads each training crop once instead, into its *block*: the crop's box plus the margin any
patch centred in it can reach (class-balanced centres lie within the box ± `CENTRE_JITTER` of a patch, a
window reaches half its read shape around its centre), on the EM lattice at the training voxel size (the
lattice `PatchDataset.grid_for` snaps samples to), in the compact form the workers ship. Blocks live in GPU
memory when they fit, else in host memory; a batch is then cut on the GPU (or on the CPU into one pinned
buffer, copied to the GPU in one transfer).

Same samples as streaming: sample i is `PatchSampler(i)` → `PatchSpec` → `grid_for` (rotated samples take the
context-enlarged window, the others the patch centred in a zero frame), and the `EpochSampler` decides which
indices form a batch, so seeds, epochs and resumed runs behave the same. Where the EM has a level at the
training voxel size, windows are plain slices and a batch equals the streaming loader's bit for bit: EM, ids,
class bits and known masks, and the boundary channels whenever the streaming loader takes them from
`data.boundary_cache` (blocks compute them over the whole crop, as the cache does; per patch the streaming
loader misses touching voxels at the patch's faces). Where no EM level has the training voxel size, a block
is resampled once, on the lattice of the closest level, and samples snap to that lattice: a sample moves by
less than half a voxel from where the streaming loader would read it, and its EM is the block's resampling.

Block layout, uint8 `(W, z, y, x)`: the EM byte, the `all` id byte ("ids" encoding only), then the packed target
bytes and the packed known bytes (boundary channels in "ids", every channel in "bits"). A batch is one `(B, W,
*read)` tensor whose channel slices form the batch dict `GpuAugment` takes (`cellseg.data.dataset`).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from cellseg.config.schema import DataConfig
from cellseg.data.boundary_cache import lattice_grid
from cellseg.data.dataset import EpochSampler, PatchDataset, oriented_shape
from cellseg.data.grid import Grid
from cellseg.data.sampling import CENTRE_JITTER
from cellseg.data.targets import ALL_OUTSIDE, CropSource

log = logging.getLogger(__name__)
Placement = Literal["gpu", "host", "off"]
SLACK_VOX = 2  # extra voxels around every block: a window's origin snaps by up to half a voxel
HALO_VOX = 1  # label planes read above and below each slab: boundary channels compare 6-neighbours
SLAB_VOXELS = 2**22  # voxels read per slab while filling a block (bounds the reading's host memory)
HOST_AVAILABLE_SHARE = 0.5  # never take more than this share of the host memory available now


def outside_imaged(em: np.ndarray, pad_value: int) -> np.ndarray:
    """Voxels "outside the imaged volume" (unknown for every channel): the streaming loader's black-padding rule."""
    return em == pad_value


@dataclass(frozen=True)
class Layout:
    """The channels of a block: EM, the `all` id ("ids" encoding), `nbits` packed target then known bytes."""

    ids: bool
    nbits: int

    @classmethod
    def of(cls, dataset: PatchDataset) -> Layout:
        """The layout of the dataset's target encoding (`PatchDataset.target_mode`)."""
        crop = dataset.crops[0]
        ids = dataset.target_mode == "ids"
        return cls(ids=ids, nbits=-(-(len(crop.aux_classes) if ids else crop.num_channels) // 8))

    @property
    def width(self) -> int:
        """W, bytes per voxel."""
        return 1 + int(self.ids) + 2 * self.nbits

    def batch(self, cut: torch.Tensor) -> dict[str, torch.Tensor]:
        """`(B, W, *S)` → the volumes of the batch dict (views of `cut`)."""
        first = 1 + int(self.ids)
        out = {"image": cut[:, :1]}
        if self.ids:
            out["ids"] = cut[:, 1:2]
        out["target_bits"] = cut[:, first:first + self.nbits]
        out["known_bits"] = cut[:, first + self.nbits:]
        return out


@dataclass
class Block:
    """One crop's resident data: `data` `(W, z, y, x)` uint8 on `grid` (the EM lattice at the training voxel size)."""

    grid: Grid
    data: torch.Tensor
    dataset: str  # the CellMap dataset it comes from (for the log)

    def window(self, grid: Grid) -> torch.Tensor:
        """The `(W, *grid.shape_vox)` view of this block under `grid` (snapped to the block's lattice)."""
        start = [round((t - b) / v) for t, b, v in zip(grid.translation_nm, self.grid.translation_nm,
                                                        self.grid.voxel_size_nm, strict=True)]
        if any(s < 0 or s + n > m for s, n, m in zip(start, grid.shape_vox, self.grid.shape_vox, strict=True)):
            raise RuntimeError(f"window {grid} leaves its resident block {self.grid}: the block margin is wrong")
        return self.data[(slice(None), *(slice(s, s + n) for s, n in zip(start, grid.shape_vox, strict=True)))]


def block_grid(crop: CropSource, points: Sequence[np.ndarray], dataset: PatchDataset) -> Grid:
    """The lattice grid holding every window a sample of `crop` can read (see the module docstring).

    Args:
        points: the crop's foreground points per class (nm), the centres of class-balanced samples.
    """
    vs = np.asarray(dataset.voxel_size_nm)
    lo, hi = np.asarray(crop.start_nm), np.asarray(crop.stop_nm)  # uniform centres lie in the box
    found = [p for p in points if len(p)]
    if found:
        lo, hi = np.minimum(lo, np.min([p.min(0) for p in found], 0)), np.maximum(hi, np.max([p.max(0) for p in found], 0))
    shapes = [oriented_shape(dataset.read_shape_vox, a) for a in dataset.sampler.slice_axes]
    half = (np.max(shapes, axis=0) - 1) / 2 * vs
    margin = CENTRE_JITTER * dataset.sampler.extent + half + SLACK_VOX * vs
    level = crop.em().choose_level(vs)
    return lattice_grid(lo - margin, hi + margin, lattice_translation_nm=level.translation_nm, voxel_size_nm=vs)


def _planes(grid: Grid, z0: int, z1: int) -> Grid:
    """Planes `z0 <= z < z1` of `grid` (they may reach beyond it)."""
    (tz, ty, tx), (vz, _, _) = grid.translation_nm, grid.voxel_size_nm
    return Grid(translation_nm=(tz + z0 * vz, ty, tx), shape_vox=(z1 - z0, *grid.shape_vox[1:]),
                voxel_size_nm=grid.voxel_size_nm)


def read_slab(crop: CropSource, grid: Grid, dataset: PatchDataset, layout: Layout) -> np.ndarray:
    """`(W, *grid.shape_vox)` uint8: EM and targets of `grid`, read as the streaming loader reads a window."""
    em = crop.em().read(**grid.read_kwargs(), interpolation="area", pad_value=dataset.em_pad_value, dtype=np.uint8)
    halo = _planes(grid, -HALO_VOX, grid.shape_vox[0] + HALO_VOX)
    inner = (slice(None), slice(HALO_VOX, HALO_VOX + grid.shape_vox[0]))
    black = outside_imaged(em, dataset.em_pad_value)
    if layout.ids:
        ids, tbits, kbits = crop.read_ids_and_boundaries(halo)
        ids = ids[inner[1:]]
        ids[black] = ALL_OUTSIDE
        parts = [em[None], ids[None]]
    else:
        tbits, kbits = crop.read_targets_packed(halo, use_all=dataset.use_all)
        parts = [em[None]]
    kbits = kbits[inner] & np.where(black, np.uint8(0), np.uint8(255))[None]
    return np.concatenate([*parts, tbits[inner], kbits])


def fill_block(block: Block, crop: CropSource, dataset: PatchDataset, layout: Layout, progress) -> None:
    """Read the block's grid slab by slab (bounded memory) into `block.data`."""
    z_total, plane = block.grid.shape_vox[0], math.prod(block.grid.shape_vox[1:])
    step = max(1, SLAB_VOXELS // plane)
    for z0 in range(0, z_total, step):
        z1 = min(z_total, z0 + step)
        block.data[:, z0:z1].copy_(torch.from_numpy(read_slab(crop, _planes(block.grid, z0, z1), dataset, layout)))
        progress.update((z1 - z0) * plane * layout.width)


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


def _dataset_name(em_url: str) -> str:
    """`jrc_hela-2` from `.../jrc_hela-2/jrc_hela-2.zarr/recon-1/em/fibsem-uint8`."""
    parts = [p for p in em_url.replace("\\", "/").split("/") if p.endswith(".zarr")]
    return parts[-1][: -len(".zarr")] if parts else em_url


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
        self.nbytes = sum(b.data.numel() for b in self.blocks)
        read, patch = dataset.read_shape_vox, dataset.patch_shape_vox
        self._centre = (slice(None), *(slice((n - m) // 2, (n - m) // 2 + m) for m, n in zip(patch, read, strict=True)))
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
        source = self.blocks[0].data.device
        pin = source.type == "cpu" and self.device.type == "cuda"
        cut = torch.empty((len(indices), self.layout.width, *self.dataset.read_shape_vox), dtype=torch.uint8,
                          device=source, pin_memory=pin)
        meta = torch.tensor([self._cut(cut[b], i) for b, i in enumerate(indices)], dtype=torch.int64)
        cut, meta = _to_device(cut, self.device), _to_device(meta, self.device)
        batch: dict[str, torch.Tensor] = {**self.layout.batch(cut), "crop": meta[:, 0], "seed": meta[:, 1],
                                          "rotate": meta[:, 2].bool()}
        if self._luts is not None:
            luts = self._luts[meta[:, 0]]
            batch.update(target_lut=luts[:, 0], known_lut=luts[:, 1])
        return batch

    def _cut(self, out: torch.Tensor, i: int) -> tuple[int, int, int]:
        """Copy sample i into `out` `(W, *read)`; returns (crop, seed, rotate)."""
        ds = self.dataset
        spec = ds.sampler(int(i))
        rotate = ds.rotates(spec)
        grid = ds.grid_for(spec, None if rotate else ds.patch_shape_vox)
        window = self.blocks[spec.crop].window(grid)
        if spec.slice_axis != 0 and grid.shape_vox[spec.slice_axis] == 1:  # 2D across y or x: slice axis first
            window = window.movedim(1 + spec.slice_axis, 1)
        if rotate:
            out.copy_(window)
        else:  # the patch centred in a zero frame of the read shape, as the streaming loader pads it
            out.zero_()
            out[self._centre].copy_(window)
        return spec.crop, spec.seed, int(rotate)


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
    nbytes = sum(math.prod(g.shape_vox) * layout.width for g in grids)
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
        return [Block(grid=g, data=torch.empty((layout.width, *g.shape_vox), dtype=torch.uint8, device=device),
                      dataset=_dataset_name(c.entry.em_url)) for g, c in zip(grids, dataset.crops, strict=True)]
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
    total = sum(b.data.numel() for b in blocks)
    with tqdm(total=total, unit="B", unit_scale=True, desc="resident training data", disable=not progress,
              leave=False) as bar:
        for block, crop in zip(blocks, dataset.crops, strict=True):
            start = time.perf_counter()
            fill_block(block, crop, dataset, layout, bar)
            crops, nbytes, seconds = stats.get(block.dataset, (0, 0, 0.0))
            stats[block.dataset] = (crops + 1, nbytes + block.data.numel(), seconds + time.perf_counter() - start)
    for name, (crops, nbytes, seconds) in sorted(stats.items()):
        log.info("resident training data, %s: %d crops, %s, read in %.1f s", name, crops, _gb(nbytes), seconds)
    log.info("resident training data: %d crops, %s on %s, read in %.1f s", len(blocks), _gb(total),
             blocks[0].data.device, sum(s[2] for s in stats.values()))
