"""Throughput accounting: FLOPs per training step (counted once) and MFU against a *measured* matmul peak;
and `train.profile_steps` (`step_profiler`): a torch profiler trace of a few training steps.

The peak is a bf16 8192³ matmul on random data (all-zero inputs run faster and overstate it), measured once
per GPU model and cached in `~/.cache/cellseg/matmul_peak.json`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from cellseg.cache import cache_root
from cellseg.models import build_model
from cellseg.models.summary import count_flops

log = logging.getLogger(__name__)
CACHE = cache_root() / "matmul_peak.json"
MATMUL_N = 8192
PROFILE_WAIT, PROFILE_WARMUP = 2, 2  # steps the profiler skips, then runs without recording, before it records
PROFILE_ROWS = 30  # operators in profile/summary.txt


def measure_matmul_peak(device: torch.device, *, repeats: int = 10) -> float:
    """Dense bf16 matmul throughput in TFLOP/s on `device` (random inputs, after 3 warm-ups)."""
    a = torch.randn(MATMUL_N, MATMUL_N, device=device, dtype=torch.bfloat16)
    b = torch.randn(MATMUL_N, MATMUL_N, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - start) / repeats
    return 2 * MATMUL_N**3 / seconds / 1e12


def matmul_peak_tflops(device: torch.device) -> float | None:
    """The cached (or freshly measured) bf16 peak of this GPU model; None on CPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    cache = json.loads(CACHE.read_text()) if CACHE.is_file() else {}
    if name not in cache:
        cache[name] = measure_matmul_peak(device)
        log.info("measured bf16 matmul peak of %s: %.0f TFLOP/s", name, cache[name])
        try:
            CACHE.parent.mkdir(parents=True, exist_ok=True)
            CACHE.write_text(json.dumps(cache, indent=1))
        except OSError:  # a read-only home is fine: measure again next time
            pass
    return float(cache[name])


def train_flops_per_sample(name: str, in_channels: int, out_channels: int, patch_vox: Sequence[int], *,
                           preset: str = "default", params: dict | None = None) -> int:
    """Forward + backward FLOPs for one sample, counted on the meta device (no memory, no GPU time)."""
    with torch.device("meta"):
        model = build_model(name, in_channels, out_channels, preset=preset, **(params or {}))
    # Two samples, halved: BatchNorm in training mode refuses one sample at a 1x1 bottleneck.
    shape = (2, in_channels, *(patch_vox[1:] if model.spec.spatial_dims == 2 else patch_vox))
    return count_flops(model, shape, backward=True) // 2


@contextlib.contextmanager
def step_profiler(steps: int, run_dir: Path, device: torch.device, *, enabled: bool) -> Iterator[Callable[[], None]]:
    """A function to call after every training step: with `steps` > 0 (and `enabled`, rank 0) a torch profiler
    records `steps` steps after the first few into `run_dir/profile` (TensorBoard traces, and a summary table
    by self CUDA time in `summary.txt` when the loop ends normally); otherwise it does nothing."""
    if steps <= 0 or not enabled:
        yield lambda: None
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    out = run_dir / "profile"
    schedule = torch.profiler.schedule(wait=PROFILE_WAIT, warmup=PROFILE_WARMUP, active=steps, repeat=1)
    with torch.profiler.profile(activities=activities, schedule=schedule, record_shapes=True,
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(str(out))) as prof:
        yield prof.step
    (out / "summary.txt").write_text(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=PROFILE_ROWS))
