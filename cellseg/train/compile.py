"""`train.compile`: "on", "off" or "auto" — and never a crash because of the compiler.

"auto" (CUDA only; CPU stays eager) compiles, runs a few probe steps of forward + backward on random input
after warm-up, times eager and compiled the same way, and keeps the faster: compile is not always a win
(a 2D UNet was slower compiled, performance.md §7.4). Probe steps leave the weights untouched (no
optimizer step; BatchNorm buffers restored). Any compiler error becomes a warning and eager execution.
`CELLSEG_COMPILE_BACKEND` picks the backend (default "inductor").
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch

from cellseg.config.schema import RunConfig
from cellseg.train import runtime

log = logging.getLogger(__name__)


def _probe(model: torch.nn.Module, image: torch.Tensor, steps: int, precision: runtime.Precision) -> float:
    """Seconds per forward + backward step after one warm-up step (which triggers compilation)."""
    def step() -> None:
        with runtime.autocast(image.device, precision):
            out = model(image)
            out = out[0] if isinstance(out, (list, tuple)) else out
        out.float().square().mean().backward()
        model.zero_grad(set_to_none=True)

    step()
    if image.device.type == "cuda":
        torch.cuda.synchronize(image.device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if image.device.type == "cuda":
        torch.cuda.synchronize(image.device)
    return (time.perf_counter() - start) / steps


def maybe_compile(model: torch.nn.Module, cfg: RunConfig, device: torch.device, *, precision: runtime.Precision,
                  fmt: torch.memory_format, batch: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The module to train (compiled or not) and a record of the decision for meta.json."""
    mode = cfg.train.compile
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return model, {"mode": mode, "compiled": False, "reason": "off" if mode == "off" else "CPU: eager"}
    patch = cfg.data.patch_shape_vox[1:] if cfg.data.is_2d else cfg.data.patch_shape_vox
    image = torch.randn((batch, 1, *patch), device=device).contiguous(memory_format=fmt)
    buffers = {k: v.clone() for k, v in model.state_dict().items() if not v.dtype.is_floating_point or "running" in k}
    backend = os.environ.get("CELLSEG_COMPILE_BACKEND", "inductor")
    try:
        compiled = torch.compile(model, backend=backend)
        start = time.perf_counter()
        t_compiled = _probe(compiled, image, cfg.train.compile_probe_steps, precision)
        record = {"mode": mode, "backend": backend, "compile_s": time.perf_counter() - start,
                  "compiled_step_s": t_compiled}
    except Exception as err:
        log.warning("torch.compile failed (%s: %s); training eagerly", type(err).__name__, str(err).splitlines()[0])
        model.zero_grad(set_to_none=True)
        model.load_state_dict(buffers, strict=False)
        return model, {"mode": mode, "compiled": False, "reason": f"compile error: {type(err).__name__}"}
    if mode == "auto":
        record["eager_step_s"] = _probe(model, image, cfg.train.compile_probe_steps, precision)
    model.load_state_dict(buffers, strict=False)
    use = mode == "on" or record["compiled_step_s"] < record["eager_step_s"]
    record["compiled"] = use
    log.info("compile %s: %s", mode, ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in record.items()))
    return (compiled if use else model), record
