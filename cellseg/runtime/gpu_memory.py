"""GPU memory a training job plans with: the peak of one eager step, and what training leaves free for data.

A job measures, before it trains, what one eager forward + backward at its micro-batch needs beyond what is
allocated (`step_bytes`); the room it then leaves for data held on the GPU (`data.resident`) is the free memory
minus that step and minus the optimizer and EMA state that training allocates later (`data_room`,
`STATE_COPIES`). Under DDP every rank takes the smallest value of all ranks (`min_over_ranks`), so that every
rank places its data alike. A compiling child process beside the job (`cellseg.train.background`) gets what the
job leaves (`background_room`). The set-up (`cellseg.train.setup`) decides with these; they run on CUDA only.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch

from cellseg.runtime.hardware import Dist, Precision, autocast

STATE_COPIES = 3  # fp32 copies of the weights that training adds after set-up: two AdamW moments and the EMA
FP32_BYTES = 4
# Bytes either process (a job and its background compile) may need beyond its measured tensors: a CUDA context
# (~0.5 GiB on an H200), cuDNN and cuBLAS workspaces, inductor's autotuning buffers, the caching allocator's rounding.
MARGIN = 2 << 30


def free_memory() -> None:
    """Drop cached blocks (after an OOM, or after a probe)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def free_bytes(device: torch.device) -> int:
    """Free bytes on the CUDA `device` now (what the driver reports, other processes' use excluded)."""
    return torch.cuda.mem_get_info(device)[0]


def min_over_ranks(value: int, d: Dist) -> int:
    """The smallest `value` of all ranks (itself in a single process), so that every rank decides alike."""
    if not d.distributed:
        return value
    t = torch.tensor(value, device=d.device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
    return int(t)


def step_bytes(model: torch.nn.Module, make_input: Callable[[], torch.Tensor], device: torch.device,
               precision: Precision) -> int | None:
    """Peak GPU bytes of one eager forward + backward on `make_input()` beyond what is allocated now (None: it
    does not fit). The model's weights and batch-norm statistics are left as they were, and the probe's random
    draws (input, dropout) leave no trace."""
    buffers = {k: v.clone() for k, v in model.state_dict().items() if not v.dtype.is_floating_point or "running" in k}
    free_memory()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    try:
        with torch.random.fork_rng(devices=[device]):
            with autocast(device, precision):
                out = model(make_input())
            (out[0] if isinstance(out, (list, tuple)) else out).float().square().mean().backward()
        peak: int | None = torch.cuda.max_memory_allocated(device) - base
    except torch.OutOfMemoryError:
        peak = None  # the step alone does not fit: no room for data
    finally:
        model.zero_grad(set_to_none=True)
        model.load_state_dict(buffers, strict=False)  # the probe's batch-norm statistics are not kept
        free_memory()
    return peak


def data_room(model: torch.nn.Module, step: int | None, device: torch.device) -> int:
    """GPU bytes left for resident data once one step (`step`, None: it does not fit) and the optimizer/EMA
    state (`STATE_COPIES` fp32 copies of the weights) are counted; 0 when nothing is left."""
    if step is None:
        return 0
    state = STATE_COPIES * FP32_BYTES * sum(p.numel() for p in model.parameters())
    return max(0, free_bytes(device) - step - state)


def background_budget(*, free: int, step: int, loss: int, params: int, state_copies: int) -> int | None:
    """GPU bytes the child may use, or None when the GPU lacks room for it beside the job.

    `free`: free GPU bytes now (the job's weights and resident data placed); `step`: peak bytes of one eager
    forward + backward at the batch; `loss`: peak bytes of the eager loss's forward + backward; `params`: the
    weights' bytes; `state_copies`: weight-sized buffers training still allocates (optimizer state, EMA). The
    job keeps its step, eager loss, gradients, state and `MARGIN`; the child gets the rest if that holds its own
    weights and gradients, the step (compiled, it needs no more than eager) and `MARGIN` (its loss is compiled:
    a few fused reductions, not the eager loss's float32 copies).
    """
    budget = free - (step + loss + (1 + state_copies) * params + MARGIN)
    return budget if budget >= step + 2 * params + MARGIN else None


def background_room(model: torch.nn.Module, step: int | None, loss: int | None, device: torch.device
                    ) -> tuple[int | None, str]:
    """GPU bytes a background compile may use beside this job (`background_budget`) and, when it may not start
    (None), why. `step` and `loss`: the job's eager step and eager loss peaks (None: they did not fit)."""
    free_memory()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    free = free_bytes(device)
    room = None if step is None or loss is None else background_budget(free=free, step=step, loss=loss, params=params,
                                                                       state_copies=STATE_COPIES)
    if room is not None:
        return room, ""
    needs = "out of memory" if step is None or loss is None else \
        f"{step / 2**30:.1f} GiB, its eager loss {loss / 2**30:.1f} GiB"
    return None, (f"not started: {free / 2**30:.1f} GiB free on the GPU is too little for a compiling process "
                  f"beside this job's eager step ({needs})")
