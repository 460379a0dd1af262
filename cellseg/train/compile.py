"""`train.compile`: "on", "off" or "auto" — and never a crash because of the compiler.

"auto" (CUDA only; CPU stays eager) compiles, runs a few probe steps of forward + backward on random input
after warm-up, times eager and compiled the same way, and keeps the faster: compile is not always a win
(a 2D UNet was slower compiled, performance.md §7.4). Probe steps leave the weights untouched (no
optimizer step; BatchNorm buffers restored). Any compiler error becomes a warning and eager execution.
`CELLSEG_COMPILE_BACKEND` picks the backend (default "inductor"). Compiled graphs and kernels are cached in
`$CELLSEG_CACHE/inductor` (`cellseg.cache`), so a second job compiling the same shapes mostly loads them.

`train.compile_mode` is torch.compile's mode for the model ("default", "reduce-overhead" = CUDA graphs,
"max-autotune", "max-autotune-no-cudagraphs"); the loss always compiles in "default" mode. Both go through
`compile_module`, which bench/ddp_scaling.py uses too. A mode the backend rejects is a compile error (eager).

The loss is compiled on its own by the same rule (`maybe_compile_loss`): eager, the masked BCE + Dice of
48 channels over 8 × 128³ voxels makes a dozen float32 passes over 3 GB tensors and cost as much as a
third of a unet_3d step on an H200; compiled, it is a few fused reductions (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from cellseg import runtime
from cellseg.config.schema import RunConfig
from cellseg.runtime.compile import compile_backend, compile_module

log = logging.getLogger(__name__)


def _probe(model: torch.nn.Module, image: torch.Tensor, steps: int, precision: runtime.Precision) -> float:
    """Seconds per forward + backward step after one warm-up step (which triggers compilation)."""
    def step() -> None:
        with runtime.autocast(image.device, precision):
            out = model(image)
            out = out[0] if isinstance(out, (list, tuple)) else out
        out.float().square().mean().backward()
        model.zero_grad(set_to_none=True)

    return _timed(step, steps, image.device)


def _timed(step: Any, steps: int, device: torch.device) -> float:
    """Seconds per call of `step` after one warm-up call (which triggers compilation)."""
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / steps


def maybe_compile_loss(criterion: torch.nn.Module, cfg: RunConfig, device: torch.device, *,
                       precision: runtime.Precision, batch: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The loss to train with (compiled or not; same policy as the model) and a record for meta.json."""
    mode = cfg.train.compile
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return criterion, {"mode": mode, "compiled": False, "reason": "off" if mode == "off" else "CPU: eager"}
    patch = cfg.data.patch_shape_vox[1:] if cfg.data.is_2d else cfg.data.patch_shape_vox
    shape = (batch, cfg.data.num_target_channels, *patch)
    dtype = runtime.DTYPES[precision]
    logits = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    target = torch.rand(shape, device=device) > 0.9
    known = torch.rand(shape, device=device) > 0.1

    def step(fn: torch.nn.Module) -> Any:
        def run() -> None:
            fn(logits, target, known).backward()
            logits.grad = None
        return run

    try:
        compiled = compile_module(criterion)
        start = time.perf_counter()
        record: dict[str, Any] = {"mode": mode, "compiled_step_s": _timed(step(compiled), 3, device)}
        record["compile_s"] = time.perf_counter() - start
    except Exception as err:
        log.warning("torch.compile of the loss failed (%s: %s); eager loss", type(err).__name__,
                    str(err).splitlines()[0])
        return criterion, {"mode": mode, "compiled": False, "reason": f"compile error: {type(err).__name__}"}
    if mode == "auto":
        record["eager_step_s"] = _timed(step(criterion), 3, device)
    record["compiled"] = mode == "on" or record["compiled_step_s"] < record["eager_step_s"]
    log.info("loss compile %s: %s", mode, ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                                    for k, v in record.items()))
    return (compiled if record["compiled"] else criterion), record


def maybe_compile(model: torch.nn.Module, cfg: RunConfig, device: torch.device, *, precision: runtime.Precision,
                  fmt: torch.memory_format, batch: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The module to train (compiled or not, in `train.compile_mode`) and a record of the decision for meta.json."""
    mode, compile_mode = cfg.train.compile, cfg.train.compile_mode
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return model, {"mode": mode, "compile_mode": compile_mode, "compiled": False,
                       "reason": "off" if mode == "off" else "CPU: eager"}
    patch = cfg.data.patch_shape_vox[1:] if cfg.data.is_2d else cfg.data.patch_shape_vox
    image = torch.randn((batch, 1, *patch), device=device).contiguous(memory_format=fmt)
    buffers = {k: v.clone() for k, v in model.state_dict().items() if not v.dtype.is_floating_point or "running" in k}
    try:
        compiled = compile_module(model, mode=compile_mode)
        start = time.perf_counter()
        t_compiled = _probe(compiled, image, cfg.train.compile_probe_steps, precision)
        record = {"mode": mode, "compile_mode": compile_mode, "backend": compile_backend(),
                  "compile_s": time.perf_counter() - start, "compiled_step_s": t_compiled}
    except Exception as err:
        log.warning("torch.compile failed (%s: %s); training eagerly", type(err).__name__, str(err).splitlines()[0])
        model.zero_grad(set_to_none=True)
        model.load_state_dict(buffers, strict=False)
        return model, {"mode": mode, "compile_mode": compile_mode, "compiled": False,
                       "reason": f"compile error: {type(err).__name__}"}
    if mode == "auto":
        record["eager_step_s"] = _probe(model, image, cfg.train.compile_probe_steps, precision)
    model.load_state_dict(buffers, strict=False)
    use = mode == "on" or record["compiled_step_s"] < record["eager_step_s"]
    record["compiled"] = use
    log.info("compile %s: %s", mode, ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in record.items()))
    return (compiled if use else model), record
