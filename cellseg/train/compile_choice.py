"""`train.compile`: "on", "off" or "auto" — and never a crash because of the compiler.

"auto" (CUDA only; CPU stays eager) compiles, runs a few probe steps of forward + backward on random input
after warm-up, times eager and compiled the same way, and keeps the faster: compile is not always a win
(`resnet_2d` on one H200: 34.4 ms per step compiled, 33.4 eager; docs/benchmarks.md). Probe steps leave
the weights untouched (no optimizer step; BatchNorm buffers restored). Any compiler error becomes a warning
and eager execution.
`CELLSEG_COMPILE_BACKEND` picks the backend (default "inductor"). Compiled graphs and kernels are cached in
`$CELLSEG_CACHE/inductor` (`cellseg.cache`), so a second job compiling the same shapes mostly loads them.

`train.compile_mode` is torch.compile's mode for the model ("default", "reduce-overhead" = CUDA graphs,
"max-autotune", "max-autotune-no-cudagraphs"); the loss always compiles in "default" mode. Both go through
`compile_module`, which bench/ddp_scaling.py uses too. A mode the backend rejects is a compile error (eager).
Both compile with static shapes (`compile_module` says why).

The loss is compiled on its own by the same rule (`maybe_compile_loss`): eager, the masked BCE + Dice of
48 channels over 8 × 128³ voxels makes a dozen float32 passes over 3 GB tensors and cost as much as a
third of a unet_3d step on an H200; compiled, it is a few fused reductions (docs/benchmarks.md). Its probe calls it
as the trainer does (under autocast, on logits laid out as the compiled model's output), so the first training
step does not compile it again.

A job that finds an earlier job's start-up record (`cellseg.train.warm_start`) passes its decisions as `reuse`:
nothing eager is timed, and what was found faster eager is not compiled. `warm_compile_cache` compiles and runs
both once, timing nothing: what the background compile process does (`cellseg.train.background`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from cellseg import runtime
from cellseg.config.schema import RunConfig
from cellseg.data.augment import channels_first
from cellseg.runtime.compile import compile_backend, compile_module
from cellseg.train.build import example_input

log = logging.getLogger(__name__)


Layout = list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]  # a model output's (shape, stride, dtype)s


def _probe(model: torch.nn.Module, image: torch.Tensor, steps: int, precision: runtime.Precision,
           seen: list[Layout] | None = None) -> float:
    """Seconds per forward + backward step after one warm-up step (which triggers compilation); the output's
    layout goes to `seen` (the loss then compiles for exactly what training feeds it)."""
    def step() -> None:
        with runtime.autocast(image.device, precision):
            out = model(image)
        if seen is not None and not seen:
            seen.append([(tuple(o.shape), o.stride(), o.dtype) for o in (out if isinstance(out, (list, tuple))
                                                                         else [out])])
        out = out[0] if isinstance(out, (list, tuple)) else out
        out.float().square().mean().backward()
        model.zero_grad(set_to_none=True)

    return _timed(step, steps, image.device)


def _timed(step: Any, steps: int, device: torch.device) -> float:
    """Seconds per call of `step` after one warm-up call (which triggers compilation); 0.0 for `steps=0`."""
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if not steps:
        return 0.0
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / steps


def _logits(layout: Layout | None, shape: tuple[int, ...], dtype: torch.dtype, fmt: torch.memory_format,
            device: torch.device) -> torch.Tensor | list[torch.Tensor]:
    """Random logits laid out as the model's training output (`layout`), or as `shape` in `fmt` without one."""
    if layout is None:
        return torch.randn(shape, device=device, dtype=dtype).contiguous(memory_format=fmt).requires_grad_()
    out = [torch.empty_strided(size, stride, dtype=kind, device=device).normal_().requires_grad_()
           for size, stride, kind in layout]
    return out if len(out) > 1 else out[0]


def _decide(record: dict[str, Any], mode: str, reuse: dict[str, Any] | None, time_eager: Callable[[], float],
            what: str) -> bool:
    """Completes `record` with the eager side (an earlier job's `reuse`, else timed now under "auto") and the choice
    between compiled and eager; logs it and returns whether the compiled module is used."""
    if reuse is not None:
        record.update({k: reuse[k] for k in ("compiled_step_s", "eager_step_s") if k in reuse}, reused=True)
    elif mode == "auto":
        record["eager_step_s"] = time_eager()
    record["compiled"] = mode == "on" or reuse is not None or record["compiled_step_s"] < record["eager_step_s"]
    log.info("%s %s: %s", what, mode, ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in record.items()))
    return record["compiled"]


LossInputs = tuple[torch.Tensor | list[torch.Tensor], torch.Tensor, torch.Tensor]  # logits, target, known


def _loss_inputs(cfg: RunConfig, device: torch.device, *, precision: runtime.Precision, batch: int,
                 fmt: torch.memory_format, layout: Layout | None) -> LossInputs:
    """Random logits as the model hands them to the loss (`_logits`), boolean targets and a known-voxel mask laid
    out as the augmentation hands them over (channel-fastest: `cellseg.data.augment.channels_first`)."""
    spatial, channels = cfg.data.model_patch_vox, cfg.data.num_target_channels
    logits = _logits(layout, (batch, channels, *spatial), runtime.DTYPES[precision], fmt, device)
    voxels = (batch, math.prod(spatial), channels)
    target = channels_first(torch.rand(voxels, device=device) > 0.9, spatial)
    return logits, target, channels_first(torch.rand(voxels, device=device) > 0.1, spatial)


def _loss_step(fn: torch.nn.Module, inputs: LossInputs, precision: runtime.Precision) -> Callable[[], None]:
    """One loss forward + backward as the trainer runs it (under autocast), gradients dropped afterwards."""
    logits, target, known = inputs

    def run() -> None:
        with runtime.autocast(target.device, precision):
            loss = fn(logits, target, known)
        loss.backward()
        for tensor in logits if isinstance(logits, list) else [logits]:
            tensor.grad = None
    return run


def loss_step_bytes(criterion: torch.nn.Module, cfg: RunConfig, device: torch.device, *,
                    precision: runtime.Precision, batch: int, fmt: torch.memory_format) -> int:
    """Peak GPU bytes of one eager loss forward + backward at `batch`, its inputs included, beyond what is
    allocated now (CUDA; the caller forks the random generators if their state matters)."""
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    _loss_step(criterion, _loss_inputs(cfg, device, precision=precision, batch=batch, fmt=fmt, layout=None),
               precision)()
    return torch.cuda.max_memory_allocated(device) - base


def maybe_compile_loss(criterion: torch.nn.Module, cfg: RunConfig, device: torch.device, *,
                       precision: runtime.Precision, batch: int, fmt: torch.memory_format = torch.contiguous_format,
                       layout: Layout | None = None, reuse: dict[str, Any] | None = None
                       ) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The loss to train with (compiled or not; same policy as the model) and a record for meta.json.

    The probe calls the loss as the trainer does (under autocast, on logits with the model's output `layout`,
    boolean targets), so the first training step finds the compiled graph instead of recompiling. `reuse`: an
    earlier job's record (`cellseg.train.warm_start`): its decision stands and nothing eager is timed."""
    mode = cfg.train.compile
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return criterion, {"mode": mode, "compiled": False, "reason": "off" if mode == "off" else "CPU: eager"}
    reuse = reuse if mode == "auto" else None  # only "auto" defers to an earlier job's decision
    if reuse is not None and not reuse.get("compiled"):
        return criterion, {"mode": mode, **reuse, "reused": True}
    inputs = _loss_inputs(cfg, device, precision=precision, batch=batch, fmt=fmt, layout=layout)
    try:
        compiled = compile_module(criterion)
        start = time.perf_counter()
        record: dict[str, Any] = {"mode": mode, "compiled_step_s": _timed(_loss_step(compiled, inputs, precision),
                                                                           0 if reuse is not None else 3, device)}
        record["compile_s"] = time.perf_counter() - start
    except Exception as err:
        log.warning("torch.compile of the loss failed (%s: %s); eager loss", type(err).__name__,
                    str(err).splitlines()[0])
        return criterion, {"mode": mode, "compiled": False, "reason": f"compile error: {type(err).__name__}"}
    use = _decide(record, mode, reuse, lambda: _timed(_loss_step(criterion, inputs, precision), 3, device),
                  "loss compile")
    return (compiled if use else criterion), record


def maybe_compile(model: torch.nn.Module, cfg: RunConfig, device: torch.device, *, precision: runtime.Precision,
                  fmt: torch.memory_format, batch: int, reuse: dict[str, Any] | None = None
                  ) -> tuple[torch.nn.Module, dict[str, Any], Layout | None]:
    """The module to train (compiled or not, in `train.compile_mode`), a record of the decision for meta.json,
    and the layout of the compiled model's training output (None when it was not run).

    `reuse`: an earlier job's record for the same model, batch and software (`cellseg.train.warm_start`): under
    "auto" its decision stands, so nothing eager runs and a model found faster eager is not compiled at all;
    a compiled model runs one step here (compiling, mostly from the compile cache)."""
    mode, compile_mode = cfg.train.compile, cfg.train.compile_mode
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return model, {"mode": mode, "compile_mode": compile_mode, "compiled": False,
                       "reason": "off" if mode == "off" else "CPU: eager"}, None
    reuse = reuse if mode == "auto" else None  # only "auto" defers to an earlier job's decision
    if reuse is not None and not reuse.get("compiled"):
        return model, {"mode": mode, "compile_mode": compile_mode, **reuse, "reused": True}, None
    image = example_input(cfg, device, batch=batch, fmt=fmt)
    buffers = {k: v.clone() for k, v in model.state_dict().items() if not v.dtype.is_floating_point or "running" in k}
    seen: list[Layout] = []
    try:
        compiled = compile_module(model, mode=compile_mode)
        start = time.perf_counter()
        t_compiled = _probe(compiled, image, 0 if reuse is not None else cfg.train.compile_probe_steps, precision, seen)
        record = {"mode": mode, "compile_mode": compile_mode, "backend": compile_backend(),
                  "compile_s": time.perf_counter() - start, "compiled_step_s": t_compiled}
    except Exception as err:
        log.warning("torch.compile failed (%s: %s); training eagerly", type(err).__name__, str(err).splitlines()[0])
        model.zero_grad(set_to_none=True)
        model.load_state_dict(buffers, strict=False)
        return model, {"mode": mode, "compile_mode": compile_mode, "compiled": False,
                       "reason": f"compile error: {type(err).__name__}"}, None
    use = _decide(record, mode, reuse, lambda: _probe(model, image, cfg.train.compile_probe_steps, precision),
                  "compile")
    model.load_state_dict(buffers, strict=False)
    return (compiled if use else model), record, (seen[0] if seen else None)


def warm_compile_cache(model: torch.nn.Module, criterion: torch.nn.Module, cfg: RunConfig, device: torch.device, *,
                       precision: runtime.Precision, fmt: torch.memory_format, batch: int) -> None:
    """Compile the model and the loss exactly as `maybe_compile` and `maybe_compile_loss` do, and run each once
    (forward + backward, nothing timed): their graphs and kernels land in the compile cache, from which the
    training process then loads them in seconds (`cellseg.train.background`). Compiler errors propagate."""
    seen: list[Layout] = []
    _probe(compile_module(model, mode=cfg.train.compile_mode), example_input(cfg, device, batch=batch, fmt=fmt), 0,
           precision, seen)
    inputs = _loss_inputs(cfg, device, precision=precision, batch=batch, fmt=fmt, layout=seen[0] if seen else None)
    _timed(_loss_step(compile_module(criterion), inputs, precision), 0, device)
