"""Optimizer and learning-rate schedule from `OptimConfig`.

AdamW is fused on CUDA (one kernel for all parameters); SGD uses Nesterov momentum (nnU-Net's choice).
Weight decay skips biases and norm parameters. Schedules: linear warm-up, then cosine decay to `min_lr_ratio`,
polynomial decay (nnU-Net's poly, power 0.9), one-cycle (warm-up to the peak then cosine), or constant.

The decay runs over one of two lengths:

- steps (default): progress = (step − warm-up steps) / (`train.max_steps` − warm-up steps);
- a wall-clock budget (`train.time_budget_min`): progress = training seconds / budget seconds, read from the
  run's `TrainClock` (`cellseg.train.clock`), so that a run stopped by its budget ends its decay, which a cosine
  over 100,000 steps stopped at 2,000 never does. Warm-up then lasts `optim.warmup_min` minutes of that clock
  (the decay starting after it) and/or `optim.warmup_steps` steps (the factor is the smaller of the ramp and
  the decay, so both end continuously).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from cellseg.config.schema import OptimConfig


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices and kernels; never biases or norm scales (1-D parameters)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim > 1 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW (fused on CUDA) or SGD-Nesterov."""
    groups = param_groups(model, cfg.weight_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=device.type == "cuda")
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=True)


def decay_factor(cfg: OptimConfig, progress: float) -> float:
    """The schedule's multiplier after warm-up at `progress` in [0, 1] of the decay."""
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "poly":
        return max(cfg.min_lr_ratio, (1 - progress) ** cfg.poly_power)
    # cosine and one-cycle decay the same way after the warm-up
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def lr_factor(cfg: OptimConfig, total_steps: int, *, budget_s: float | None = None,
              clock_s: Callable[[], float] | None = None) -> Callable[[int], float]:
    """Multiplier of `cfg.lr` at optimizer step `s` (0-based); over a time budget when `budget_s` is given, with
    `clock_s()` the training seconds so far (module docstring)."""
    if budget_s is not None:
        if clock_s is None:
            raise ValueError("lr_factor: a time budget needs the training clock (clock_s)")
        return _time_factor(cfg, budget_s, clock_s)
    warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return decay_factor(cfg, min(1.0, (step - warmup) / max(1, total_steps - warmup)))

    return factor


def _time_factor(cfg: OptimConfig, budget_s: float, clock_s: Callable[[], float]) -> Callable[[int], float]:
    warmup_s = 60.0 * (cfg.warmup_min or 0.0)
    if warmup_s >= budget_s:
        raise ValueError(f"optim.warmup_min={cfg.warmup_min} must be shorter than the time budget "
                         f"({budget_s / 60:g} min)")

    def factor(step: int) -> float:
        t = clock_s()
        ramp = 1.0
        if cfg.warmup_steps:
            ramp = min(ramp, (step + 1) / (cfg.warmup_steps + 1))
        if warmup_s:
            ramp = min(ramp, t / warmup_s)
        progress = min(1.0, max(0.0, (t - warmup_s) / (budget_s - warmup_s)))
        return min(ramp, decay_factor(cfg, progress))

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int, *,
                    budget_s: float | None = None, clock_s: Callable[[], float] | None = None
                    ) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR stepping once per optimizer step (over steps, or over a time budget: `lr_factor`)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, total_steps, budget_s=budget_s,
                                                                  clock_s=clock_s))


class EMA:
    """Exponential moving average of the weights (kept in fp32 on the model's device).

    The decay warms up: update n (counted from 0) uses min(decay, (1 + n) / (10 + n)), so that the average
    follows the fast-moving early weights instead of the random initialisation. Without it a 0.999 average still
    holds 37 % of the initial weights after 1,000 steps, a whole short run (the warm-up of TensorFlow's
    ExponentialMovingAverage with num_updates).
    """

    WARMUP_OFFSET = 10  # (1 + n) / (10 + n): 0.1 at the first update, 0.9 at the 80th, 0.99 at the 890th

    def __init__(self, model: torch.nn.Module, decay: float, *, updates: int = 0):
        self.decay = decay
        self.updates = updates  # updates so far; a resumed run sets it from the checkpoint's step
        self.shadow = {k: v.detach().clone().float() for k, v in model.state_dict().items()}

    def decay_at(self, n: int) -> float:
        """The decay of update `n` (0-based)."""
        return min(self.decay, (1 + n) / (self.WARMUP_OFFSET + n))

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """shadow = d · shadow + (1 − d) · weights with d = `decay_at(updates)`; buffers are copied."""
        weight = 1 - self.decay_at(self.updates)
        shadow, live = [], []
        for k, v in model.state_dict().items():
            if v.dtype.is_floating_point:
                shadow.append(self.shadow[k])
                live.append(v.float())
            else:
                self.shadow[k].copy_(v)
        if shadow:
            torch._foreach_lerp_(shadow, live, weight)
        self.updates += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The averaged weights, loadable into the model."""
        return self.shadow

    def load_state_dict(self, state: dict[str, torch.Tensor], *, updates: int) -> None:
        """Restore from a checkpoint written after `updates` updates (its optimizer step)."""
        self.shadow = {k: v.clone() for k, v in state.items()}
        self.updates = updates
