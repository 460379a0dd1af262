"""The hardware code training and inference share: device, torchrun/DDP, precision, TF32, channels-last,
wrapping.

Order of operations (as torchtitan and nanoGPT do it): set the CUDA allocator before CUDA initialises →
pick the device → move the model → channels-last → `torch.compile` (`cellseg.runtime.compile`) → DDP wrap.
Checkpoints always hold the unwrapped module (`unwrap`). Autocast wraps only forward and loss; bf16 needs no
GradScaler, fp16 gets one.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)
Precision = Literal["bf16", "fp16", "fp32"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def configure_allocator() -> None:
    """`expandable_segments` reduces fragmentation with varying shapes; it must be set before CUDA starts."""
    if not torch.cuda.is_initialized():
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


@dataclass(frozen=True)
class Dist:
    """Where this process sits in a (possibly distributed) run."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, validates and checkpoints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True under torchrun with more than one process."""
        return self.world_size > 1


def init_distributed(device: str = "auto", *, timeout_min: int = 30) -> Dist:
    """Read torchrun's environment, initialise the process group (NCCL on GPU, gloo on CPU), pick the device.

    Args:
        device: "auto" (CUDA if available), "cuda" or "cpu".
        timeout_min: collective timeout (validation on rank 0 can take minutes).
    """
    configure_allocator()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device=cuda but no CUDA device is visible")
    dev = torch.device(f"cuda:{local}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(minutes=timeout_min),
                                device_id=dev if use_cuda else None)
        log.info("rank %d/%d on %s", rank, world, dev)
    return Dist(rank=rank, local_rank=local, world_size=world, device=dev)


def shutdown_distributed() -> None:
    """Destroy the process group if one exists."""
    if dist.is_initialized():
        dist.destroy_process_group()


def configure_backends(*, tf32: bool, cudnn_benchmark: bool) -> None:
    """TF32 for fp32 matmuls/convolutions and cuDNN autotuning."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.benchmark = cudnn_benchmark


@contextlib.contextmanager
def autocast(device: torch.device, precision: Precision) -> Iterator[None]:
    """Mixed precision for forward + loss (no-op for fp32)."""
    if precision == "fp32":
        yield
        return
    with torch.autocast(device_type=device.type, dtype=DTYPES[precision]):
        yield


def resolve_precision(precision: str, device: torch.device) -> Precision:
    """"auto" → bf16 on CUDA (fp16 where bf16 is unsupported), fp32 on CPU; anything else as given."""
    if precision != "auto":
        if precision not in DTYPES:
            raise ValueError(f"precision {precision!r}: choose 'auto' or one of {sorted(DTYPES)}")
        return precision  # type: ignore[return-value]
    if device.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def make_scaler(precision: Precision, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler that is active only for fp16 (bf16 has fp32's exponent range)."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def memory_format(spatial_dims: int, channels_last: bool) -> torch.memory_format:
    """channels_last(_3d) or contiguous."""
    if not channels_last:
        return torch.contiguous_format
    return torch.channels_last_3d if spatial_dims == 3 else torch.channels_last


def wrap_ddp(model: torch.nn.Module, d: Dist, *, broadcast_buffers: bool = True) -> torch.nn.Module:
    """DDP with gradient-as-bucket-view (no extra gradient copies); identity when not distributed.
    `broadcast_buffers`: rank 0's buffers (BatchNorm statistics) are sent to every rank before each forward."""
    if not d.distributed:
        return model
    ids = [d.device.index] if d.device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True,
                                                     broadcast_buffers=broadcast_buffers)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module under DDP and/or torch.compile wrappers."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def no_sync(model: torch.nn.Module, skip: bool) -> contextlib.AbstractContextManager:
    """DDP's `no_sync` on gradient-accumulation micro-steps (skip the all-reduce)."""
    if skip and isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def all_reduce_mean(value: torch.Tensor, d: Dist) -> torch.Tensor:
    """Mean of a tensor over ranks (a copy; identity when not distributed)."""
    if not d.distributed:
        return value
    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / d.world_size


def barrier(d: Dist) -> None:
    """Wait for every rank."""
    if d.distributed:
        dist.barrier()


def broadcast_object(obj: object, d: Dist) -> object:
    """Rank 0's object on every rank."""
    if not d.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def restart_count() -> int:
    """How often torchrun's elastic agent restarted this job (0 for a first start)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
