"""Typed configuration: one frozen, keyword-only dataclass per concern.

Values are validated in `__post_init__`; a user mistake raises `ValueError` naming the key and the valid
choices. YAML files under `configs/` set these fields (see `cellseg.config.load`); `docs/config.md` is
generated from this module.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Vec3 = tuple[float, float, float]
Shape3 = tuple[int, int, int]
AXIS_NAMES = ("z", "y", "x")
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]  # torch.compile's
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


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
            split (stratified by class, crops grouped by space: see cellseg/data/split.py); or the path of an
            official `datasplit.csv` (5- or 3-column). Crops annotated coarser than
            `max_annotation_voxel_size_nm` are left out either way (logged).
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


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """An architecture from the registry (`cellseg models`) and its typed parameters.

    Attributes:
        name: a registered architecture (`cellseg models` lists them), e.g. unet_3d.
        params: parameters of that architecture, overriding the preset's values (checked against its params
            dataclass; see "model.params by architecture" in docs/config.md).
        preset: "default" (full size) or "tiny" (small widths for CPU tests and smoke runs).
    """

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    preset: Literal["default", "tiny"] = "default"


def replace(cfg: Any, **changes: Any) -> Any:
    """`dataclasses.replace` that re-runs validation (frozen configs are otherwise immutable)."""
    return dataclasses.replace(cfg, **changes)


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """Optimizer and learning-rate schedule (`cellseg.train.optim`).

    Attributes:
        name: "adamw" (fused on CUDA) or "sgd" (Nesterov momentum, nnU-Net's choice).
        lr: peak learning rate.
        weight_decay: weight decay of weights and kernels (never of biases and norm parameters).
        betas, eps: AdamW's moment coefficients and epsilon.
        momentum: SGD's Nesterov momentum.
        warmup_steps: optimizer steps of linear warm-up to `lr`.
        warmup_min: with `train.time_budget_min`: minutes of the training clock of linear warm-up (from 0) to
            `lr`, the decay following over the rest of the budget; null: none (set `warmup_steps: 0` for a
            warm-up in minutes only; with both, the factor is the smaller of the two ramps).
        schedule: "cosine", "poly" (power `poly_power`), "onecycle" or "constant", after the warm-up; the decay
            runs over `train.max_steps`, or over `train.time_budget_min` when that is set.
        min_lr_ratio: floor of the decay as a fraction of `lr`.
        poly_power: exponent of the "poly" schedule, (1 − progress) ** poly_power.
        grad_clip_norm: clip the global gradient norm (null: no clipping); nnU-Net clips at 12.
        ema_decay: keep an exponential moving average of the weights (null: off), e.g. 0.999; validation and
            prediction use it. The decay warms up as min(ema_decay, (1 + n) / (10 + n)) at update n.
    """

    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = 3e-4
    weight_decay: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.99
    schedule: Literal["cosine", "poly", "onecycle", "constant"] = "cosine"
    warmup_steps: int = 500
    warmup_min: float | None = None
    min_lr_ratio: float = 0.01
    poly_power: float = 0.9
    grad_clip_norm: float | None = 12.0
    ema_decay: float | None = None

    def __post_init__(self) -> None:
        _check(self.lr > 0, f"optim.lr={self.lr} must be positive")
        _check(self.weight_decay >= 0, "optim.weight_decay must be >= 0")
        _check(self.warmup_steps >= 0, "optim.warmup_steps must be >= 0")
        _check(self.warmup_min is None or self.warmup_min > 0, "optim.warmup_min must be > 0 or null")
        _check(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio must be in [0, 1]")
        _check(self.ema_decay is None or 0 < self.ema_decay < 1, "optim.ema_decay must be in (0, 1) or null")
        _check(self.grad_clip_norm is None or self.grad_clip_norm > 0, "optim.grad_clip_norm must be > 0 or null")


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """Masked BCE + soft Dice (`cellseg.losses`); `class_weights` maps class names to channel weights.

    Attributes:
        bce_weight: weight of the masked binary cross-entropy term.
        dice_weight: weight of the masked soft Dice term.
        class_weights: class name → weight of its channel (default 1.0); names not in `data.classes` have
            no effect.
        boundary_weight: weight of each instance-boundary channel.
        dice_empty: the soft Dice of a sample whose known voxels hold no foreground of a class: "skip" (left to
            BCE; Dice only where the class is) or "count" (scored: a pull towards predicting the class nowhere,
            which kept the 2D models from learning rare classes; docs/quality.md, empty samples in the Dice).
    """

    bce_weight: float = 1.0
    dice_weight: float = 1.0
    class_weights: dict[str, float] = field(default_factory=dict)
    boundary_weight: float = 1.0
    dice_empty: Literal["count", "skip"] = "skip"

    def __post_init__(self) -> None:
        _check(self.bce_weight >= 0 and self.dice_weight >= 0 and self.bce_weight + self.dice_weight > 0,
               "loss.bce_weight and loss.dice_weight must be >= 0 and not both 0")


@dataclass(frozen=True, kw_only=True)
class ValidationConfig:
    """Periodic validation on the validation crops with the challenge metric (`cellseg.train.validate`).

    `best.pt` is chosen on the *tuning* validation crops only (`data.report_fraction` sets the others aside
    for reports), by the era's overall score in decision mode: a crop the era skips for too many predicted
    objects counts as its worst case (docs/scoring.md). With classes of one kind only, the mean of that
    kind ranks instead (metrics.jsonl names the score that ranked).

    Attributes:
        metric: scoring era, "2026" (current) or "2025" (challenge era).
        overlap: sliding-window overlap between tiles.
        batch_size: tiles per forward pass.
        threshold: probability threshold for masks.
        max_crops: validate on at most this many tuning crops (null: all).
        grid: where each class is scored: "annotation" (the grid of its truth, as the leaderboard scores:
            probabilities linearly resampled onto it and decoded there) or "model" (the training voxel size:
            cheaper when labels are much finer than the model's grid, not what the leaderboard measures).
        report_crops: also score the report crops and log them apart (`val.report`); they never rank.
        workers: processes that decode and score the classes (`cellseg.train.valpool`) while the training
            process predicts the next crop on the GPU; null: `loader.num_workers` (the loader's cores are idle
            during validation); at most the number of (crop, class) pairs; 0: in the training process. The
            scores are the same for every value.
    """

    metric: str = "2026"
    overlap: float = 0.25
    batch_size: int = 4
    threshold: float = 0.5
    max_crops: int | None = None
    grid: Literal["annotation", "model"] = "annotation"
    report_crops: bool = False
    workers: int | None = None

    def __post_init__(self) -> None:
        _check(0 <= self.overlap < 1, "val.overlap must be in [0, 1)")
        _check(self.workers is None or (isinstance(self.workers, int) and not isinstance(self.workers, bool)
                                        and self.workers >= 0),
               f"val.workers={self.workers!r} must be an integer >= 0 (0: in the training process) or null "
               "(loader.num_workers)")
        _check(0 < self.threshold < 1, "val.threshold must be in (0, 1)")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The training loop and its Hopper settings (`cellseg.train`).

    Attributes:
        seed: seeds sampling, augmentation and initialisation (each rank adds its rank to its own generators).
        max_steps: optimizer steps (with `time_budget_min`: a cap).
        time_budget_min: a wall-clock training budget in minutes of the training clock (`cellseg.train.clock`:
            counted from the end of each job's first optimizer step, so compilation and set-up are not charged,
            paused while validating and checkpointing, continued by a resumed run from its checkpoint). The run
            stops when the clock reaches it, with a final validation and checkpoint, and the learning-rate
            schedule decays over it instead of over `max_steps`; null: no budget.
        batch_size: samples per GPU per micro-step, or "auto" (largest that fits `memory_fraction`).
        grad_accum_steps: loader batches per optimizer step.
        precision: "auto" (bf16 on CUDA, fp32 on CPU), "bf16", "fp16" (with GradScaler) or "fp32".
        tf32: TF32 for fp32 matmuls and convolutions.
        cudnn_benchmark: let cuDNN time its convolution algorithms at the first steps and keep the fastest.
        channels_last: channels_last(_3d) memory format for model and inputs.
        compile: "auto" (on CUDA: time compiled vs eager after warm-up, keep the faster), "on", "off";
            any compile error falls back to eager with a warning.
        compile_mode: `torch.compile` mode of the model (the loss always compiles in "default"):
            "default"; "reduce-overhead" (CUDA graphs: fewer kernel launches, static shapes, more memory);
            "max-autotune" (also times Triton kernel variants and uses CUDA graphs; compiles for minutes);
            "max-autotune-no-cudagraphs". Modes other than "default" need the inductor backend.
        compile_probe_steps: steps timed for eager and for compiled when `compile` is "auto".
        background_compile: with `compile` "on"/"auto" in a one-GPU job whose compile cache is cold (no earlier
            job of the same start-up record compiled), a separate process compiles the model and the loss into
            the cache while training starts eagerly; the job switches to the compiled model when it is done (a
            pause of seconds to load it; `cellseg.train.background`). Needs GPU memory for both processes, else
            it compiles first. false: always compile before the first step (one graph for the whole run).
        startup_cache: reuse an earlier job's start-up measurements (the GPU-room probe and the "auto" compile
            decisions, `cellseg.train.warm_start`) when the model, batch, patch, precision, GPU, software and
            code are the same; false: measure again every time.
        device: "auto" (CUDA when available), "cuda" or "cpu".
        activation_checkpointing: recompute activations in backward (less memory); models with a
            `use_checkpoint` parameter only (the swin and vit models).
        memory_fraction: share of GPU memory that `batch_size: auto` may fill.
        max_auto_batch: the largest batch `batch_size: auto` tries.
        num_gpus: GPUs per job for the SLURM launchers (informational; torchrun decides the world size).
        val_every, checkpoint_every, log_every: periods in optimizer steps.
        val_every_min: also validate (and checkpoint) every this many minutes of the training clock, e.g. to
            record every architecture's score against minutes at the same times; null: steps only. With
            `time_budget_min` it must be shorter than the budget.
        keep_top_k: best checkpoints kept by validation score (plus `last`).
        profile_steps: write a torch.profiler trace of this many steps to run_dir/profile (0: off).
        nonfinite: what a NaN or infinite loss or gradient does: "error" stops training with an error naming
            the step (checked at every log, validation and checkpoint step, with no host sync in between);
            "skip" drops that step's update (checked every step: one host sync per step), counts it in
            metrics.jsonl (`nonfinite_skips`) and stops with the error after `max_nonfinite_skips` in a row.
            With fp16 the GradScaler already skips steps with infinite gradients; only the loss is checked.
        max_nonfinite_skips: consecutive skipped steps that end training when `nonfinite` is "skip".
    """

    seed: int = 0
    max_steps: int = 100_000
    time_budget_min: float | None = None
    batch_size: int | Literal["auto"] = 2
    grad_accum_steps: int = 1
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    tf32: bool = True
    cudnn_benchmark: bool = True
    channels_last: bool = True
    compile: Literal["auto", "on", "off"] = "auto"
    compile_mode: CompileMode = "default"
    compile_probe_steps: int = 5
    background_compile: bool = True
    startup_cache: bool = True
    device: Literal["auto", "cuda", "cpu"] = "auto"
    activation_checkpointing: bool = False
    memory_fraction: float = 0.85
    max_auto_batch: int = 256
    num_gpus: int = 1
    log_every: int = 20
    val_every: int = 1000
    val_every_min: float | None = None
    checkpoint_every: int = 1000
    keep_top_k: int = 3
    profile_steps: int = 0
    nonfinite: Literal["error", "skip"] = "error"
    max_nonfinite_skips: int = 10

    def __post_init__(self) -> None:
        _check(self.max_steps >= 1, "train.max_steps must be >= 1")
        for name in ("time_budget_min", "val_every_min"):
            value = getattr(self, name)
            _check(value is None or value > 0, f"train.{name}={value} must be > 0 or null")
        if self.time_budget_min is not None and self.val_every_min is not None:
            _check(self.val_every_min < self.time_budget_min,
                   f"train.val_every_min={self.val_every_min} must be shorter than train.time_budget_min="
                   f"{self.time_budget_min}: the budget ends before the first validation at that cadence")
        _check(self.max_nonfinite_skips >= 1, "train.max_nonfinite_skips must be >= 1")
        _check(self.compile_mode in COMPILE_MODES,
               f"train.compile_mode={self.compile_mode!r} must be one of {list(COMPILE_MODES)}")
        _check(self.batch_size == "auto" or (isinstance(self.batch_size, int) and self.batch_size >= 1),
               f"train.batch_size={self.batch_size!r} must be a positive integer or 'auto'")
        _check(self.grad_accum_steps >= 1, "train.grad_accum_steps must be >= 1")
        _check(0 < self.memory_fraction <= 1, "train.memory_fraction must be in (0, 1]")
        for name in ("log_every", "val_every", "checkpoint_every", "keep_top_k", "num_gpus"):
            _check(getattr(self, name) >= 1, f"train.{name} must be >= 1")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything one training job needs; `config.yaml` in a run directory is this, resolved.

    Attributes:
        run_dir: the run's directory: config.yaml, meta.json, datasplit.csv, metrics.jsonl, checkpoints/.
    """

    run_dir: str
    data: DataConfig
    model: ModelConfig
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    val: ValidationConfig = field(default_factory=ValidationConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.data.is_2d:
            _check(self.model.name.endswith("_2d"), f"model.name={self.model.name} is 3D but data.patch_shape_vox "
                   f"{self.data.patch_shape_vox} makes 2D patches; use a *_2d model or a 3D patch")
        else:
            _check(not self.model.name.endswith("_2d"), f"model.name={self.model.name} is 2D: set "
                   f"data.patch_shape_vox to (1, H, W)")
        budget, warmup = self.train.time_budget_min, self.optim.warmup_min
        if warmup is not None:
            _check(budget is not None, f"optim.warmup_min={warmup} needs train.time_budget_min (a warm-up in minutes "
                   "belongs to a schedule over minutes); use optim.warmup_steps without a budget")
            _check(warmup < budget, f"optim.warmup_min={warmup} must be shorter than train.time_budget_min={budget}")
