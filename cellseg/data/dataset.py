"""The training `Dataset`: index → `PatchSpec` → EM, packed targets and packed known-mask, read on the CPU.

Each sample reads a patch enlarged by the augmentation context (so rotation/zoom on the GPU never pads
in) at the training voxel size: EM with area/linear resampling when no level matches (kept uint8,
rounded explicitly; normalisation happens on the GPU), labels with nearest neighbour. EM padding (no data:
outside the volume or its black border, `cellseg.data.padding`) is unknown for every channel.

Targets of K classes travel bit-packed along the class axis (`numpy.packbits(..., bitorder="little")`:
class k is bit k % 8 of byte k // 8), so 48 classes cost 6 + 6 bytes per voxel instead of 96; the GPU
augmentation moves the packed bytes with the same nearest-neighbour transform and unpacks them there.

Two target encodings (`PatchDataset.target_mode`). "ids", when every crop has its `all` array: the atom
ids travel (1 byte per voxel) with the crop's lookup tables, and only the boundary channels travel as
bits; the GPU looks the class bits up. "bits" otherwise: every channel travels bit-packed.

Sample dict (3D; 2D patches have a z extent of 1 after the slicing axis is moved first). C = K classes +
A boundary channels:
    image        uint8  (1, Z, Y, X)
    ids          uint8  (1, Z, Y, X)                     "ids" mode: `all` ids, 255 = unknown everywhere
    target_lut   uint8  (ceil(C / 8), 256)               "ids" mode: class bits per id
    known_lut    uint8  (ceil(C / 8), 256)
    target_bits  uint8  (ceil(C / 8) or ceil(A / 8), Z, Y, X)   all channels ("bits") or boundaries ("ids")
    known_bits   uint8  (same)
    crop, seed, rotate   crop index, per-sample seed, whether the GPU rotates this sample
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from cellseg.data.grid import Grid
from cellseg.data.padding import EdgeRegion, PaddingMode, edge_seeds, padding_mask, padding_mode
from cellseg.data.sampling import PatchSampler, PatchSpec
from cellseg.data.targets import ALL_OUTSIDE, CropSource


def context_shape(patch_shape_vox: Sequence[int], factor: float, *, is_2d: bool) -> tuple[int, int, int]:
    """Patch shape enlarged by `factor` on the rotating axes, by an even number of voxels (centred crops)."""
    out = []
    for axis, n in enumerate(patch_shape_vox):
        if n == 1 or factor <= 1.0 or (is_2d and axis == 0):
            out.append(int(n))
        else:
            margin = int(np.ceil(n * (factor - 1) / 2))
            out.append(int(n) + 2 * margin)
    return tuple(out)  # type: ignore[return-value]


def oriented_shape(shape_vox: Sequence[int], slice_axis: int) -> tuple[int, int, int]:
    """A patch shape (z, y, x) in world orientation: a 2D patch `(1, H, W)` cut across y or x moves its 1 to that
    axis (`(H, 1, W)`, `(H, W, 1)`); 3D shapes and patches cut across z stay as they are."""
    shape = [int(n) for n in shape_vox]
    if shape[0] == 1 and slice_axis != 0:
        shape.insert(slice_axis, shape.pop(0))
    return tuple(shape)  # type: ignore[return-value]


class EpochSampler(torch.utils.data.Sampler[int]):
    """The global sample indices of one rank, epoch by epoch; resumable mid-epoch.

    An epoch has `num_samples // (batch_size · world_size)` global batches; global batch t of epoch e is
    the samples `e · num_samples + t · B · W + [0, B · W)`, and rank r takes its slice `r · B + [0, B)`.
    So the samples of a step do not depend on how they are spread over ranks: 2 ranks × batch 1 see what
    1 rank × batch 2 sees. The epoch travels inside the index, so persistent DataLoader workers (with
    their own copy of the dataset) need no notification when it changes.
    """

    def __init__(self, num_samples: int, *, batch_size: int, rank: int = 0, world_size: int = 1):
        self.num_samples, self.batch_size, self.rank, self.world_size = num_samples, batch_size, rank, world_size
        self.batches_per_epoch = num_samples // (batch_size * world_size)
        if self.batches_per_epoch < 1:
            raise ValueError(f"loader.samples_per_epoch={num_samples} is smaller than one global batch "
                             f"({batch_size} x {world_size} ranks)")
        self.epoch, self.start_batch = 0, 0

    def set_epoch(self, epoch: int, *, start_batch: int = 0) -> None:
        """Select the epoch and the first batch of the next iteration (for a resumed run)."""
        self.epoch, self.start_batch = int(epoch), int(start_batch)

    def __iter__(self):
        first, self.start_batch = self.start_batch, 0
        base, global_batch = self.epoch * self.num_samples, self.batch_size * self.world_size
        for t in range(first, self.batches_per_epoch):
            start = base + t * global_batch + self.rank * self.batch_size
            yield from range(start, start + self.batch_size)

    def __len__(self) -> int:
        return (self.batches_per_epoch - self.start_batch) * self.batch_size


@dataclass(frozen=True, kw_only=True)
class WindowRule:
    """Where sample i lies, without reading anything: the sampler, the rotation draw and the sample's grid.

    It holds no array handles, and the foreground index travels as shared memory, so it pickles to a few kB: the
    resident loader's window workers (`cellseg.data.resident.WindowSpecs`) all start at once.
    """

    sampler: PatchSampler
    voxel_size_nm: tuple[float, ...]  # (z, y, x)
    read_shape_vox: tuple[int, ...]
    patch_shape_vox: tuple[int, ...]
    rotate_p: float
    lattices: tuple[tuple[float, ...] | None, ...]  # per crop: `em_lattice`

    def rotates(self, spec: PatchSpec) -> bool:
        """Whether the GPU will rotate this sample (drawn from the sample's own seed)."""
        return self.read_shape_vox != self.patch_shape_vox and np.random.default_rng(spec.seed).random() < self.rotate_p

    def grid_for(self, spec: PatchSpec, shape_vox: Sequence[int] | None = None) -> Grid:
        """The world grid of a sample (default: the read shape), oriented by the slicing axis, centred on the spec.

        The origin snaps to the lattice of the EM level at the training voxel size when there is one, so
        EM reads are plain slices (no interpolation) and EM and labels share voxel centres.
        """
        shape = oriented_shape(shape_vox or self.read_shape_vox, spec.slice_axis)
        vs = self.voxel_size_nm
        origin = [c - (n - 1) / 2 * v for c, n, v in zip(spec.centre_nm, shape, vs, strict=True)]
        lattice = self.lattices[spec.crop]
        if lattice is not None:
            origin = [t + round((o - t) / v) * v for o, t, v in zip(origin, lattice, vs, strict=True)]
        return Grid(translation_nm=tuple(origin), shape_vox=tuple(shape), voxel_size_nm=vs)  # type: ignore[arg-type]


def em_lattice(crop: CropSource, voxel_size_nm: Sequence[float]) -> tuple[float, ...] | None:
    """Origin (nm) of the crop's EM level at `voxel_size_nm` (within 1 %), None where no level has that size."""
    level = crop.em().choose_level(voxel_size_nm)
    same = all(abs(lv - v) <= 0.01 * v for lv, v in zip(level.voxel_size_nm, voxel_size_nm, strict=True))
    return tuple(float(t) for t in level.translation_nm) if same else None


class PatchDataset(torch.utils.data.Dataset):
    """Map-style dataset indexed by a *global* sample index; sample i is a pure function of (seed, rank, i).

    Args:
        crops: training crops (their array handles open lazily in each worker).
        sampler: index → `PatchSpec`.
        voxel_size_nm: training grid voxel size (z, y, x).
        read_shape_vox: patch shape including augmentation context (z, y, x); `(1, H, W)` for 2D.
        num_samples: samples per epoch (the `EpochSampler` turns epochs into global indices).
        em_pad_value: EM value of "no data" (outside the imaged volume, its black border).
        padding_mask: which voxels at `em_pad_value` become unknown for every channel: "edge" (those connected to
            the volume's edge), "value" (all) or "off" (none); see `cellseg.data.padding`.
        padding_mask_by_dataset: `padding_mask` per dataset name, overriding it.
        patch_shape_vox: the patch the model sees; default `read_shape_vox`.
        rotate_p: share of samples the GPU will rotate/zoom. The decision is made here from the sample's
            seed: only those samples read the enlarged context; the others read just the patch and are
            zero-padded to the read shape (the augmentation never looks outside their centre).
        use_all: read class targets from the crops' `all` arrays where they have one ("ids" encoding when
            every crop does); False reads every class array ("bits" encoding).
    """

    def __init__(self, crops: Sequence[CropSource], sampler: PatchSampler, *, voxel_size_nm: Sequence[float],
                 read_shape_vox: Sequence[int], num_samples: int, em_pad_value: int = 0,
                 patch_shape_vox: Sequence[int] | None = None, rotate_p: float = 0.0, use_all: bool = True,
                 padding_mask: PaddingMode = "edge", padding_mask_by_dataset: Mapping[str, PaddingMode] | None = None):
        self.crops = list(crops)
        vs = tuple(float(v) for v in voxel_size_nm)
        self.rule = WindowRule(sampler=sampler, voxel_size_nm=vs, read_shape_vox=tuple(int(n) for n in read_shape_vox),
                               patch_shape_vox=tuple(int(n) for n in (patch_shape_vox or read_shape_vox)),
                               rotate_p=rotate_p, lattices=tuple(em_lattice(c, vs) for c in self.crops))
        self.num_samples = int(num_samples)
        self.em_pad_value = em_pad_value
        self.padding_mask, self.padding_mask_by_dataset = padding_mask, dict(padding_mask_by_dataset or {})
        self.use_all = use_all

    # The sampling rule's fields, read through (`rule` holds them once).
    sampler = property(lambda self: self.rule.sampler)
    voxel_size_nm = property(lambda self: self.rule.voxel_size_nm)
    read_shape_vox = property(lambda self: self.rule.read_shape_vox)
    patch_shape_vox = property(lambda self: self.rule.patch_shape_vox)
    rotate_p = property(lambda self: self.rule.rotate_p)

    def __len__(self) -> int:
        return self.num_samples

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Pickled as one byte tensor beside the sampling rule (its foreground index a tensor too): a spawned
        DataLoader worker receives both as shared memory, so its start waits for nothing (a payload beyond a
        pipe's buffer would hold the parent until the worker has imported torch, one worker after another; the
        crops alone pickle to about 12 kB each). The bytes are made once and kept: the workers map them (a
        dataset does not change once built)."""
        blob = self.__dict__.get("_pickled")
        if blob is None:
            state = {k: v for k, v in self.__dict__.items() if k not in _SHIPPED_APART}
            data = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
            blob = self.__dict__["_pickled"] = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())
        return _restore_dataset, (blob, self.rule)

    def rotates(self, spec: PatchSpec) -> bool:
        """Whether the GPU will rotate this sample (`WindowRule.rotates`)."""
        return self.rule.rotates(spec)

    def grid_for(self, spec: PatchSpec, shape_vox: Sequence[int] | None = None) -> Grid:
        """The world grid of a sample (`WindowRule.grid_for`)."""
        return self.rule.grid_for(spec, shape_vox)

    @property
    def target_mode(self) -> str:
        """"ids" when `use_all` is on and every crop has an `all` array (1 byte per voxel travels; the GPU
        looks classes up), else "bits" (bit-packed targets and known masks of every channel)."""
        return "ids" if self.use_all and all(c.ids_exact for c in self.crops) else "bits"

    def padding(self, crop: CropSource, grid: Grid, em: np.ndarray, inside: np.ndarray) -> np.ndarray:
        """The padding voxels of an EM read on `grid` (`inside`: within the EM volume), by the crop's dataset's rule.

        The "edge" rule's per-crop region is computed on first use in each process, over the crop's box grown by
        the farthest a sample reads: a read patch's longest edge on every axis (centres lie within a quarter
        patch of the box, reads within half a read patch of their centre).
        """
        mode = padding_mode(crop.dataset, default=self.padding_mask, by_dataset=self.padding_mask_by_dataset)
        if mode != "edge":
            return padding_mask(em, pad_value=self.em_pad_value, mode=mode)
        region = crop.arrays.get(("edge_region", self.em_pad_value, self.voxel_size_nm, self.read_shape_vox),
                                 lambda: self._edge_region(crop))
        return padding_mask(em, pad_value=self.em_pad_value, mode="edge",
                            seeds=edge_seeds(grid, inside=inside, region=region))

    def _edge_region(self, crop: CropSource) -> EdgeRegion:
        margin = np.asarray(self.voxel_size_nm) * max(self.read_shape_vox)
        return EdgeRegion.compute(crop.em(), np.asarray(crop.start_nm) - margin, np.asarray(crop.stop_nm) + margin,
                                  pad_value=self.em_pad_value)

    def __getitem__(self, i: int) -> dict[str, object]:
        spec = self.sampler(int(i))
        crop = self.crops[spec.crop]
        rotate = self.rotates(spec)
        grid = self.grid_for(spec, None if rotate else self.patch_shape_vox)
        em, inside = crop.em().read(**grid.read_kwargs(), interpolation="area", pad_value=self.em_pad_value,
                                    dtype=np.uint8, return_mask=True)
        padding = self.padding(crop, grid, em, inside)  # no data: unknown for every channel
        if self.target_mode == "ids":
            ids, tbits, kbits = crop.read_ids_and_boundaries(grid)
            ids[padding] = ALL_OUTSIDE
            volumes = {"image": em[None], "ids": ids[None], "target_bits": tbits, "known_bits": kbits}
        else:
            tbits, kbits = crop.read_targets_packed(grid, use_all=self.use_all)
            volumes = {"image": em[None], "target_bits": tbits, "known_bits": kbits}
        volumes["known_bits"] &= np.where(padding, np.uint8(0), np.uint8(255))[None]
        for key, a in volumes.items():
            if spec.slice_axis != 0 and grid.shape_vox[spec.slice_axis] == 1:  # 2D across y or x: slice axis first
                a = np.moveaxis(a, 1 + spec.slice_axis, 1)
            if not rotate:  # centre the patch in a zero read-shaped frame that the GPU crops away again
                a = _centre_pad(a, self.read_shape_vox)
            volumes[key] = torch.from_numpy(np.ascontiguousarray(a))
        sample: dict[str, object] = {**volumes, "crop": spec.crop, "seed": spec.seed, "rotate": rotate}
        if self.target_mode == "ids":
            t_lut, k_lut = crop.lookup_tables
            sample.update(target_lut=torch.from_numpy(t_lut), known_lut=torch.from_numpy(k_lut))
        return sample


_SHIPPED_APART = ("_pickled", "rule")  # `PatchDataset.__reduce__`: what is not in its bytes


def _restore_dataset(state: torch.Tensor, rule: WindowRule) -> PatchDataset:
    """A `PatchDataset` from the pieces of `PatchDataset.__reduce__`."""
    dataset = PatchDataset.__new__(PatchDataset)
    dataset.__dict__.update(pickle.loads(state.numpy().tobytes()), rule=rule)  # the parent's bytes
    return dataset


def _centre_pad(a: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Zero-pad the last three axes of `a` symmetrically to `shape` (differences are even by construction)."""
    pad = [(0, 0)] * (a.ndim - 3) + [((n - m) // 2, (n - m) - (n - m) // 2) for m, n in zip(a.shape[-3:], shape,
                                                                                             strict=True)]
    return np.pad(a, pad) if any(p for pair in pad for p in pair) else a
