"""The loader's batches from where a run stands, epoch after epoch.

The sample stream is a pure function of the batch index (`cellseg.data.sampling`), so a resumed run continues
with the batches it would have had: epoch and offset follow from the step and `train.grad_accum_steps`. Loader
workers start inside `StopRequest.shield_workers` (`cellseg.train.stop`), the first epoch's at once (not at
the first batch), each later epoch's as it begins unless the loader keeps them (`loader.persistent_workers`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from cellseg.train.setup import Setup
from cellseg.train.stop import StopRequest

Batch = dict[str, Any]


def start_batches(s: Setup, stop: StopRequest) -> Iterator[Batch]:
    """Loader batches of `s` from its current step on; the first epoch's workers start now."""
    sampler, loader = s.data.sampler, s.data.loader
    loader.worker_init_fn = stop.worker_init_fn
    epoch, offset = divmod(s.state.step * s.cfg.train.grad_accum_steps, sampler.batches_per_epoch)
    sampler.set_epoch(epoch, start_batch=offset)
    with stop.shield_workers():  # workers start here (and every epoch if not persistent)
        first = iter(loader)
    return _epochs(s, first, epoch, stop)


def _epochs(s: Setup, batches: Iterator[Batch], epoch: int, stop: StopRequest) -> Iterator[Batch]:
    sampler, loader = s.data.sampler, s.data.loader
    while True:
        yield from batches
        epoch += 1
        sampler.set_epoch(epoch, start_batch=0)
        with stop.shield_workers():
            batches = iter(loader)


def to_device(batch: Batch, device: torch.device) -> Batch:
    """The batch's tensors on `device` (copies that do not wait for the host); other values as they are."""
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
