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

The training process only copies: `WindowSpecs` (the sampling rule: about 150 µs a sample, the cost of its seeded
generators) runs in up to `SPEC_WORKERS` DataLoader workers, which hand over one row of `WINDOW_FIELDS` per
sample (batches of at most `SPEC_IN_PROCESS_MAX_BATCH` samples compute their windows in the training process
instead: no worker to start), and `ResidentLoader` cuts the batch from the blocks: with a few gathers for the
whole batch where the blocks are in GPU memory (`cellseg.data.gather`), with a few slice copies per sample in host
memory.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from cellseg.config.schema import DataConfig
from cellseg.data.blocks import Block, BlockStore, Layout, block_grid, block_nbytes, fill_block, window_start
from cellseg.data.dataset import PatchDataset
from cellseg.data.gather import GATHER_VOXELS, WindowGather
from cellseg.data.grid import Grid
from cellseg.data.targets import CropSource
from cellseg.data.threads import read_threads
from cellseg.pool import map_bounded

log = logging.getLogger(__name__)
Placement = Literal["gpu", "host", "off"]
HOST_AVAILABLE_SHARE = 0.5  # never take more than this share of the host memory available now
SPEC_WORKERS = 2  # worker processes computing windows: each gives several thousand samples/s
# Up to this batch size the windows are computed in the training process: 8 samples take about 1.2 ms (150 µs each)
# against 30 ms or more of a 3D step, where starting workers delays the first batch (1.1 s on the 2-core CPU for
# the smoke unet_3d, docs/hpc.md).
SPEC_IN_PROCESS_MAX_BATCH = 8
WINDOW_FIELDS = ("crop", "seed", "rotate", "slice_axis", "z", "y", "x")  # a `WindowSpecs` row; z, y, x: the start


def spec_workers(num_workers: int, batch_size: int) -> int:
    """Worker processes for `WindowSpecs` given `loader.num_workers` and the batch size (module docstring)."""
    return 0 if batch_size <= SPEC_IN_PROCESS_MAX_BATCH else min(num_workers, SPEC_WORKERS)


@dataclass
class ResidentData:
    """The training crops' blocks (in crop order), where they live, and how long reading them took."""

    store: BlockStore
    placement: Placement
    setup_s: float

    @property
    def blocks(self) -> list[Block]:
        """One block per crop."""
        return self.store.blocks

    @property
    def nbytes(self) -> int:
        """Bytes held by the blocks."""
        return self.store.nbytes

    @property
    def grids(self) -> list[Grid]:
        """The blocks' grids."""
        return [b.grid for b in self.blocks]


class WindowSpecs(torch.utils.data.Dataset):
    """Global sample index → the sample's window in its crop's block: one int64 row of `WINDOW_FIELDS`.

    The streaming loader's rule, without reading anything: `PatchSampler(i)` → `PatchSpec`, `rotates` (rotated
    samples take the read shape, the others the patch), `grid_for`; `slice_axis` is the axis that a 2D window
    cut across y or x moves first (0 otherwise).
    """

    def __init__(self, dataset: PatchDataset, grids: Sequence[Grid]):
        self.dataset: PatchDataset | None = dataset  # the training process's (`ResidentLoader`)
        self.rule, self.num_samples, self.grids = dataset.rule, len(dataset), list(grids)

    def __getstate__(self) -> dict[str, object]:
        """Workers get the dataset's `WindowRule` only, not its crops: a pickle of a few kB (see `WindowRule`)."""
        return {**self.__dict__, "dataset": None}

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> torch.Tensor:
        rule = self.rule
        spec = rule.sampler(int(i))
        rotate = rule.rotates(spec)
        window = rule.grid_for(spec, None if rotate else rule.patch_shape_vox)
        moved = spec.slice_axis if spec.slice_axis != 0 and window.shape_vox[spec.slice_axis] == 1 else 0
        return torch.tensor([spec.crop, spec.seed, int(rotate), moved, *window_start(self.grids[spec.crop], window)])


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
    """Batches cut from resident blocks: an iterable in place of the streaming DataLoader, with the same batch dict
    and the same `EpochSampler` contract (`sampler.set_epoch(epoch, start_batch=...)`, then `iter(loader)`).

    Args:
        data: the blocks.
        windows: a DataLoader of `WindowSpecs` batches over the rank's `EpochSampler`.
        device: where batches are delivered; blocks elsewhere (host memory) are cut there and copied in one transfer.
        gather: cut a batch with a few gathers (`WindowGather`) rather than sample by sample; default: where the
            blocks are in GPU memory and one gather takes several samples (2D patches, small 3D ones). On the CPU
            copying each sample's slices is faster, and a large 3D sample is a few copies against a long step.

    Example:
        >>> loader = ResidentLoader(read_resident(dataset, cfg, device=gpu), windows, device=gpu)
        >>> image, target, known = augment(next(iter(loader)), step=0)
    """

    def __init__(self, data: ResidentData, windows: torch.utils.data.DataLoader, *, device: torch.device,
                 gather: bool | None = None):
        self.data, self.windows, self.device = data, windows, device
        self.dataset: PatchDataset = windows.dataset.dataset
        self.layout = Layout.of(self.dataset)
        read, patch = self.dataset.read_shape_vox, self.dataset.patch_shape_vox
        self._centre, self._frame = _centre_and_frame(read, patch)
        self._gather = None
        if gather or (gather is None and data.store.em.is_cuda and GATHER_VOXELS >= 2 * math.prod(read)):
            self._gather = WindowGather(data.store, self.layout, read_shape_vox=read, patch_shape_vox=patch)
        self._luts = None
        if self.layout.ids:  # (crops, 2, Kb, 256): target and known tables per crop
            tables = [np.stack(c.lookup_tables) for c in self.dataset.crops]
            self._luts = torch.from_numpy(np.stack(tables)).to(device)

    @property
    def placement(self) -> Placement:
        """"gpu" or "host"."""
        return self.data.placement

    @property
    def worker_init_fn(self) -> Callable[[int], None] | None:
        """The window workers' `worker_init_fn` (the trainer installs its stop-signal handling there)."""
        return self.windows.worker_init_fn

    @worker_init_fn.setter
    def worker_init_fn(self, fn: Callable[[int], None] | None) -> None:
        self.windows.worker_init_fn = fn

    def __len__(self) -> int:
        return len(self.windows)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        windows = iter(self.windows)  # workers start here, where a DataLoader's would (the trainer shields them)
        return map(self.cut, windows)

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """The batch of these global sample indices, its windows computed in this process."""
        return self.cut(torch.stack([self.windows.dataset[i] for i in indices]))

    def cut(self, windows: torch.Tensor) -> dict[str, torch.Tensor]:
        """The batch of `(B, len(WINDOW_FIELDS))` windows, on `self.device`."""
        if self._gather is not None:
            windows = _to_device(windows, self.data.store.em.device)
            cut = self._gather(windows)
        else:
            cut = self._cut_each(windows)
        cut, meta = _to_device(cut, self.device), _to_device(windows, self.device)
        batch = {**self.layout.batch(cut), "crop": meta[:, 0], "seed": meta[:, 1], "rotate": meta[:, 2].bool()}
        if self._luts is not None:
            luts = self._luts[meta[:, 0]]
            batch.update(target_lut=luts[:, 0], known_lut=luts[:, 1])
        return batch

    def _cut_each(self, windows: torch.Tensor) -> torch.Tensor:
        """The `(B, W, *read)` batch, sample by sample, where the blocks are (pinned for a GPU if they are not)."""
        source = self.data.store.em.device
        pin = source.type == "cpu" and self.device.type == "cuda"
        zeroed = source.type == "cuda"  # there one memset of the batch costs less than zeroing frames one by one
        shape = (len(windows), self.layout.width, *self.dataset.read_shape_vox)
        cut = (torch.zeros if zeroed else torch.empty)(shape, dtype=torch.uint8, device=source, pin_memory=pin)
        for b, (crop, _, rotate, moved, *start) in enumerate(windows.tolist()):
            self._cut(cut[b], self.data.blocks[crop], start, rotate=bool(rotate), moved=moved, zeroed=zeroed)
        return cut

    def _cut(self, out: torch.Tensor, block: Block, start: Sequence[int], *, rotate: bool, moved: int,
             zeroed: bool) -> None:
        """One sample into `out` `(W, *read)` (zero already if `zeroed`)."""
        if not rotate:  # the patch centred in a zero frame of the read shape, as the streaming loader pads it
            for region in [] if zeroed else self._frame:
                out[region].zero_()
            out = out[self._centre]
        if moved:  # a 2D window across y or x: the batch has its slicing axis first, the block world orientation
            out = out.movedim(1, 1 + moved)
        block.cut(out, start, zeroed=zeroed)


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


def read_resident(dataset: PatchDataset, cfg: DataConfig, *, device: torch.device, gpu_room_bytes: int | None = None,
                  progress: bool = False) -> ResidentData | None:
    """Read the training crops into blocks where `data.resident` and the budgets allow; None means streaming.

    Args:
        dataset: the streaming dataset (its crops, sampler and target encoding define the blocks).
        cfg: `data.resident`, `resident_host_gb` and `resident_gpu_share`.
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
    store = _allocate(grids, dataset, layout, device if placement == "gpu" else torch.device("cpu"), placement)
    if store is None and placement == "gpu":  # the estimate was wrong: never an out-of-memory error from here
        placement, why = choose_placement("host", nbytes, cuda=cuda, gpu_room_bytes=0, gpu_share=0.0,
                                          host_budget_bytes=host_budget)
        why = f"the GPU allocation failed; {why}"
        store = _allocate(grids, dataset, layout, torch.device("cpu"), placement)
    if store is None:
        if cfg.resident != "off":
            log.warning("training data streams from zarr through loader workers (%s)", why)
        return None
    if cfg.resident in ("auto", placement):
        log.info("resident training data in %s memory (%s)", placement, why)
    else:
        log.warning("data.resident=%s: the training data goes to %s memory instead (%s)", cfg.resident, placement, why)
    _fill(store.blocks, dataset, layout, progress=progress)
    return ResidentData(store=store, placement=placement, setup_s=time.perf_counter() - start)


def _allocate(grids: Sequence[Grid], dataset: PatchDataset, layout: Layout, device: torch.device,
              placement: Placement) -> BlockStore | None:
    """Empty blocks on `device`; None when `placement` is "off" or the memory is not there (logged)."""
    if placement == "off":
        return None
    try:
        return BlockStore(grids, dataset.crops, layout=layout, device=device)
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
    total, start = sum(b.nbytes for b in blocks), time.perf_counter()
    with tqdm(total=total, unit="B", unit_scale=True, desc="resident training data", disable=not progress,
              leave=False) as bar:
        def fill(pair: tuple[Block, CropSource]) -> float:
            began = time.perf_counter()
            fill_block(*pair, dataset, layout, bar)
            return time.perf_counter() - began

        seconds = map_bounded(fill, list(zip(blocks, dataset.crops, strict=True)), read_threads())  # in threads
    for block, s in zip(blocks, seconds, strict=True):
        crops, nbytes, busy = stats.get(block.dataset, (0, 0, 0.0))
        stats[block.dataset] = (crops + 1, nbytes + block.nbytes, busy + s)
    for name, (crops, nbytes, busy) in sorted(stats.items()):
        log.info("resident training data, %s: %d crops, %s, %.1f s of reading", name, crops, _gb(nbytes), busy)
    log.info("resident training data: %d crops, %s on %s, read in %.1f s (%d threads)", len(blocks), _gb(total),
             blocks[0].em.device, time.perf_counter() - start, read_threads())
