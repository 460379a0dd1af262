"""Typed configuration of what training reads: the data (`DataConfig`), its augmentation (`AugmentConfig`) and
the loader (`LoaderConfig`); sections of `cellseg.config.schema.RunConfig`, same rules (frozen, keyword-only,
validated in `__post_init__`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from cellseg.config.fields import AXIS_NAMES, Shape3, Vec3, _check


@dataclass(frozen=True, kw_only=True)
class AugmentConfig:
    """Batched GPU augmentation (`cellseg.data.augment`); probabilities are per sample.

    Spatial transforms are applied identically to image, target and known-mask.
    """

    enabled: bool = True  # false: no augmentation at all (normalisation only)
    flip_p: float = 0.5  # per allowed axis
    transpose: bool = True  # permute axes of equal voxel size (in-plane only for 2D)
    rotate_p: float = 0.3  # per sample; a rotated sample is also zoomed by `scale_range`
    rotate_max_deg: float = 15.0  # around z (in-plane); 3D patches also tilt by up to a third of this
    scale_range: tuple[float, float] = (0.9, 1.1)  # isotropic zoom with rotation
    gamma_range: tuple[float, float] = (0.7, 1.5)  # image ** gamma, gamma drawn uniformly from the range
    contrast_range: tuple[float, float] = (0.75, 1.25)  # factor applied about the sample's mean intensity
    brightness_max: float = 0.1  # additive, image in [0, 1]
    intensity_p: float = 0.5  # probability of each of gamma / contrast / brightness
    noise_p: float = 0.2  # probability of additive Gaussian noise
    noise_std_max: float = 0.05  # its standard deviation is drawn from [0, this] (image in [0, 1])
    blur_p: float = 0.1  # probability of a Gaussian blur
    blur_sigma_max_vox: float = 1.0  # blur sigma = 0.75 x this, in voxels (one sigma per batch)
    missing_section_p: float = 0.05  # 3D: a z-section replaced by the one before it (duplicated section)
    dim_section_p: float = 0.05  # 3D: a z-section's intensity scaled by a factor in [0.6, 1.4]
    misalign_p: float = 0.05  # 3D: sections from a random z on shifted in y/x (labels too)
    misalign_max_vox: int = 4  # largest misalignment shift per axis, in voxels

    def __post_init__(self) -> None:
        for name in ("flip_p", "rotate_p", "intensity_p", "noise_p", "blur_p", "missing_section_p", "dim_section_p",
                     "misalign_p"):
            _check(0.0 <= getattr(self, name) <= 1.0, f"augment.{name}={getattr(self, name)} must be in [0, 1]")
        for name in ("scale_range", "gamma_range", "contrast_range"):
            lo, hi = getattr(self, name)
            _check(0 < lo <= hi, f"augment.{name}={getattr(self, name)} must satisfy 0 < low <= high")
        _check(0 <= self.rotate_max_deg <= 45, "augment.rotate_max_deg must be in [0, 45] (small rotations only)")

    @property
    def context_factor(self) -> float:
        """How much larger than the patch the read must be so that rotation/zoom never pads in."""
        if not self.enabled or self.rotate_p == 0:
            return 1.0
        import math

        theta = math.radians(self.rotate_max_deg)
        return (math.cos(theta) + math.sin(theta)) * max(1.0, 1.0 / self.scale_range[0])


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """What to train on: data root, classes, grid, split and sampling.

    Attributes:
        root: a data root (`cellseg synth` output or a `cellseg fetch` download) with its manifests.
        classes: CellMap class names to predict (atoms or groups), one output channel each.
        voxel_size_nm: training grid (z, y, x).
        patch_shape_vox: patch (z, y, x); `(1, H, W)` makes 2D patches.
        slice_axes: 2D only: axes a 2D patch may be cut across (`["z"]`; all three for isotropic data).
        max_annotation_voxel_size_nm: keep crops annotated at this voxel size or finer on every axis;
            default (null): the training voxel size (an 8 nm model trains on crops annotated at ≤ 8 nm).
        datasplit: which crops train and which validate: null (default) = the data root's `datasplit.csv` when it
            has one (the user's own or the official one), else the automatic split; "auto" = always the automatic
            split (stratified by where each class has foreground, crops grouped by space, each validation role
            with a crop: see cellseg/data/split.py); or the path of an official `datasplit.csv` (5- or
            3-column). Crops annotated coarser than `max_annotation_voxel_size_nm` are left out either way
            (logged).
        validation_fraction: share of crops held out by the automatic split.
        split_seed: seed of that split.
        split_margin_nm: crops of one dataset closer than this (nm) stay on the same side of the split
            (null: one patch edge, the largest of `patch_shape_vox` × `voxel_size_nm`).
        split_overlap: a given split's training and validation crops whose boxes overlap: "warn" (named in a
            warning, kept), "train" or "validate" (each group of overlapping crops moves wholly to that side).
        report_fraction: share of the validation crops kept for the *report* part that no decision touches (the
            rest, the *tuning* part, selects checkpoints, fits ensemble weights, tunes post-processing).
        sampler: "class_balanced" (every class, rare ones included, is seen regularly) or "uniform".
        em_pad_value: EM value of "no data" (outside the imaged volume, its black border); training masks such voxels
            by `padding_mask`.
        padding_mask: which EM voxels at `em_pad_value` are unknown for every class: "edge" (those connected to the
            volume's edge: padding; dark voxels inside cells stay data), "value" (every one) or "off" (none). See
            cellseg/data/padding.py.
        padding_mask_by_dataset: `padding_mask` per dataset name (e.g. `{jrc_hela-2: value}`), overriding it.
        intensity_stats: optional per-dataset (mean, std) of the EM in uint8 units; default scales 0-255 to 0-1.
        instance_boundaries: add one "touching-objects boundary" target channel per instance-scored class
            (after the class channels), for the watershed to split touching objects.
        boundary_cache: where the instance-boundary channels of each crop are computed once and kept
            (null: computed per sample, 5x slower; "auto": `$CELLSEG_CACHE/boundaries` or
            `~/.cache/cellseg/boundaries`; or a folder). See cellseg/data/boundary_cache.py.
        backend: array backend for reads.
        cache_bytes: tensorstore chunk cache per process, shared by every opened array (bounded host memory).
        resident: where the training crops' data lives (`cellseg.data.resident`): "auto" (default) reads every
            training crop once, with the margin its patches reach, into GPU memory when it fits
            `resident_gpu_share` of what the model and a training step leave free, else into host memory when it
            fits `resident_host_gb`, else streams patches from zarr through loader workers (a notice says so);
            "gpu" or "host" ask for that place (a GPU without room falls back to host, host memory without room
            to streaming); "off" always streams. Resident batches equal the streamed ones (docs/hpc.md, "Training
            data in memory"); at most 2 loader workers run then, computing where each sample lies.
        resident_host_gb: host memory (GB) the resident data of one machine may take, shared by its training
            processes (each DDP rank holds its own copy).
        resident_gpu_share: share of the GPU memory left free by the model, its optimizer state and one training
            step at the batch size that `resident: auto` may fill.
    """

    root: str
    classes: tuple[str, ...]
    voxel_size_nm: Vec3 = (8.0, 8.0, 8.0)
    patch_shape_vox: Shape3 = (128, 128, 128)
    slice_axes: tuple[str, ...] = ("z",)
    max_annotation_voxel_size_nm: float | None = None
    datasplit: str | None = None
    validation_fraction: float = 0.15
    split_seed: int = 0
    split_margin_nm: float | None = None
    split_overlap: Literal["warn", "train", "validate"] = "warn"
    report_fraction: float = 0.5
    sampler: Literal["class_balanced", "uniform"] = "class_balanced"
    em_pad_value: int = 0
    padding_mask: Literal["edge", "value", "off"] = "edge"
    padding_mask_by_dataset: dict[str, Literal["edge", "value", "off"]] = field(default_factory=dict)
    intensity_stats: dict[str, tuple[float, float]] = field(default_factory=dict)
    instance_boundaries: bool = True
    boundary_cache: str | None = None
    backend: Literal["tensorstore", "zarr"] = "tensorstore"
    cache_bytes: int = 256 * 2**20
    resident: Literal["auto", "host", "gpu", "off"] = "auto"
    resident_host_gb: float = 32.0
    resident_gpu_share: float = 0.5

    def __post_init__(self) -> None:
        from cellseg.classes import get_class

        _check(len(self.classes) > 0, "data.classes must list at least one class")
        for name in self.classes:
            get_class(name)  # raises with close matches
        _check(len(set(self.classes)) == len(self.classes), f"data.classes has duplicates: {self.classes}")
        _check(min(self.voxel_size_nm) > 0, f"data.voxel_size_nm={self.voxel_size_nm} must be positive")
        _check(min(self.patch_shape_vox) >= 1, f"data.patch_shape_vox={self.patch_shape_vox} must be positive")
        bad_axes = set(self.slice_axes) - set(AXIS_NAMES)
        _check(not bad_axes and bool(self.slice_axes), f"data.slice_axes={self.slice_axes}: choose from {AXIS_NAMES}")
        _check(0 < self.validation_fraction < 1, "data.validation_fraction must be in (0, 1)")
        _check(0 <= self.report_fraction < 1, "data.report_fraction must be in [0, 1)")
        _check(self.split_margin_nm is None or self.split_margin_nm >= 0, "data.split_margin_nm must be >= 0 or null")
        _check(self.split_overlap in ("warn", "train", "validate"),
               f"data.split_overlap={self.split_overlap!r}: choose one of ['warn', 'train', 'validate']")
        _check(0 <= self.em_pad_value <= 255, f"data.em_pad_value={self.em_pad_value}: EM is uint8, choose 0-255")
        modes = ("edge", "value", "off")
        for where, mode in [("padding_mask", self.padding_mask), *(
                (f"padding_mask_by_dataset.{d}", m) for d, m in self.padding_mask_by_dataset.items())]:
            _check(mode in modes, f"data.{where}={mode!r}: choose one of {list(modes)}")
        _check(self.resident_host_gb >= 0, f"data.resident_host_gb={self.resident_host_gb} must be >= 0")
        _check(0 <= self.resident_gpu_share <= 1, f"data.resident_gpu_share={self.resident_gpu_share} must be in [0, 1]")

    @property
    def boundary_classes(self) -> tuple[str, ...]:
        """Classes with an auxiliary boundary channel, in channel order."""
        from cellseg.classes import is_instance

        return tuple(c for c in self.classes if is_instance(c)) if self.instance_boundaries else ()

    @property
    def split_margin(self) -> float:
        """`split_margin_nm`, or one patch edge (nm) when it is null."""
        if self.split_margin_nm is not None:
            return self.split_margin_nm
        return max(n * v for n, v in zip(self.patch_shape_vox, self.voxel_size_nm, strict=True))

    @property
    def num_target_channels(self) -> int:
        """K class channels plus the boundary channels: the model's output channels."""
        return len(self.classes) + len(self.boundary_classes)

    @property
    def is_2d(self) -> bool:
        """True when patches are single slices (`patch_shape_vox[0] == 1`)."""
        return self.patch_shape_vox[0] == 1

    @property
    def model_patch_vox(self) -> tuple[int, ...]:
        """The model's spatial input: (y, x) for a 2D model, (z, y, x) otherwise."""
        return tuple(self.patch_shape_vox[1:] if self.is_2d else self.patch_shape_vox)


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """torch DataLoader settings (`cellseg.data.loader`); the batch size is `train.batch_size`.

    Attributes:
        num_workers: loader processes per GPU (started with "spawn"); 0 reads in the training process.
        prefetch_factor: batches each worker prepares ahead (with workers only).
        pin_memory: page-locked host batches for faster, asynchronous copies to the GPU (CUDA only).
        persistent_workers: keep the workers (and their open arrays) alive from epoch to epoch.
        samples_per_epoch: length of an epoch of the global sample stream; at least one global batch
            (`train.batch_size` × GPUs).
    """

    num_workers: int = 8
    prefetch_factor: int = 4
    pin_memory: bool = True
    persistent_workers: bool = True
    samples_per_epoch: int = 2000

    def __post_init__(self) -> None:
        _check(self.num_workers >= 0, "loader.num_workers must be >= 0")
        _check(self.prefetch_factor >= 1, "loader.prefetch_factor must be >= 1")
        _check(self.samples_per_epoch >= 1, "loader.samples_per_epoch must be >= 1")
