"""Batch sizes that fit: probe the largest batch for a memory fraction, and back off after an OOM.

`find_batch_size` doubles the batch while one forward + backward at that batch stays under
`memory_fraction` of the GPU (and does not OOM), then bisects between the last fit and the first miss.
The probe runs on random input, restores BatchNorm buffers and clears gradients, so the model is
untouched. Under DDP every rank probes and the minimum wins.

During training an OOM frees memory, shrinks the *micro*-batch by 20 % and re-runs the step with more
micro-steps, so the effective batch (and the result) stays the same.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch

from cellseg.runtime.gpu_memory import free_memory

log = logging.getLogger(__name__)
BACKOFF = 0.8  # micro-batch factor after an OOM


def shrink(micro_batch: int) -> int:
    """The micro-batch after an OOM (at least 1 smaller, at least 1)."""
    return max(1, min(micro_batch - 1, math.floor(micro_batch * BACKOFF)))


def _fits(step: Callable[[int], None], batch: int, device: torch.device, budget: int) -> bool:
    torch.cuda.reset_peak_memory_stats(device)
    try:
        step(batch)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) <= budget
    except torch.OutOfMemoryError:
        return False
    finally:
        free_memory()


def find_batch_size(model: torch.nn.Module, make_input: Callable[[int], torch.Tensor],
                    loss_fn: Callable[[torch.Tensor], torch.Tensor], *, device: torch.device,
                    memory_fraction: float, max_batch: int) -> int:
    """The largest batch (≤ `max_batch`) whose forward + backward peak stays under the memory fraction."""
    budget = int(torch.cuda.get_device_properties(device).total_memory * memory_fraction)
    buffers = {k: v.clone() for k, v in model.state_dict().items() if not v.dtype.is_floating_point or "running" in k}

    def step(batch: int) -> None:
        out = model(make_input(batch))
        loss_fn(out[0] if isinstance(out, (list, tuple)) else out).backward()
        model.zero_grad(set_to_none=True)

    lo, hi = 0, 1
    while hi <= max_batch and _fits(step, hi, device, budget):
        lo, hi = hi, hi * 2
    hi = min(hi, max_batch + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _fits(step, mid, device, budget) else (lo, mid)
    model.load_state_dict(buffers, strict=False)
    if lo == 0:
        raise RuntimeError(f"not even batch 1 fits in {memory_fraction:.0%} of {device}: use a smaller patch or "
                           "train.activation_checkpointing=true")
    log.info("auto batch size: %d (peak under %.0f%% of %.1f GiB)", lo, 100 * memory_fraction,
             torch.cuda.get_device_properties(device).total_memory / 2**30)
    return lo
