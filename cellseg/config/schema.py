"""Typed configuration: one frozen, keyword-only dataclass per concern.

Values are validated in `__post_init__`; a user mistake raises `ValueError` naming the key and the valid
choices. YAML files under `configs/` set these fields (see `cellseg.config.load`); `docs/config.md` is
generated from this module. The sections of what training reads (data, augmentation, loader) are in
`cellseg.config.training_data` and importable from here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from cellseg.config.fields import AXIS_NAMES, DEFAULT_ERA, Shape3, Vec3, _check, check_era_name, era_field
from cellseg.config.training_data import AugmentConfig, DataConfig, LoaderConfig

__all__ = ["AXIS_NAMES", "COMPILE_MODES", "DEFAULT_ERA", "AugmentConfig", "CompileMode", "DataConfig", "LoaderConfig",
           "LossConfig", "ModelConfig", "OptimConfig", "RunConfig", "Shape3", "TrainConfig", "ValidationConfig",
           "Vec3", "_check", "replace"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]  # torch.compile's
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)


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
        metric: scoring era: a registered one (`cellseg.eval.eras`; default 2026-07, the leaderboard's
            reconstructed; 2026 the official code at 6b9ad68; 2025 the challenge era's).
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

    metric: str = era_field()
    overlap: float = 0.25
    batch_size: int = 4
    threshold: float = 0.5
    max_crops: int | None = None
    grid: Literal["annotation", "model"] = "annotation"
    report_crops: bool = False
    workers: int | None = None

    def __post_init__(self) -> None:
        check_era_name(self.metric, "val.metric")
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
