"""torch.compile for training and inference alike: the backend, the persistent cache, and a compiled model that
falls back to eager execution instead of crashing.

- `compile_module`: `torch.compile` with static shapes, the backend of `CELLSEG_COMPILE_BACKEND` (default
  "inductor") and the compile cache in `$CELLSEG_CACHE/inductor` (`cellseg.cache`), so a second job compiling
  the same shapes mostly loads them;
- `CompiledModel`: an inference model under torch.compile (static shapes, inductor freezing) that runs eagerly,
  with one warning, when compilation fails. Training decides between compiled and eager by timing both
  (`cellseg.train.compile_choice`);
- `release_compile_workers`: shut inductor's compile-worker pool down once compiling is over.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings

import torch

from cellseg.cache import use_compile_cache
from cellseg.config.schema import CompileMode

log = logging.getLogger(__name__)


def compile_backend() -> str:
    """The torch.compile backend: `CELLSEG_COMPILE_BACKEND`, default "inductor"."""
    return os.environ.get("CELLSEG_COMPILE_BACKEND", "inductor")


def compile_module(module: torch.nn.Module, *, mode: CompileMode = "default") -> torch.nn.Module:
    """`torch.compile(module)` with `compile_backend()` and `mode`, static shapes: one graph per input shape.

    Static, not torch's default: training and inference run fixed shapes, and dynamo keeps one cache per code
    object. Every architecture shares `SegModel.forward`, so once it ran compiled for another shape in the
    process (a notebook that predicts then trains, the test suite), torch's automatic dynamic shapes would trace
    the next compile with symbolic sizes: other kernels, and none in the cache a background compile filled.

    Compilation is lazy: errors (an unknown backend aside) surface at the first call. The compiler's caches
    go to cellseg's cache folder unless `TORCHINDUCTOR_CACHE_DIR` is set (`cellseg.cache.use_compile_cache`).
    """
    use_compile_cache()
    # mode=None is torch's "default"; None also keeps backends without a `mode` argument working
    return torch.compile(module, backend=compile_backend(), mode=None if mode == "default" else mode, dynamic=False)



# Inductor's freezing: at the first call the weights become constants, so BatchNorm folds into the convolutions
# and inductor may pick channels-last layouts for the whole graph. Inference only: the model must not change after
# the first call. Measured on an H200 (bench/forward_probe.py), unet_3d forward 6.85 -> 5.60 ms per tile when the
# config is patched around the calls, as here; passed as torch.compile(options=...) it changed nothing (6.84 ms).
FREEZE = {"freezing": True}


# Dynamo keeps the compiled graphs of a function in one cache per code object, and every model shares
# `SegModel.forward`: each architecture and input shape compiled adds an entry. Past torch's limit (8 entries)
# dynamo warns once and runs every further call *eagerly*: a member of `cellseg predict-ensemble` did (seen on
# an H200, 8 members: "hit config.recompile_limit (8) ... rank mismatch"). Each `CompiledModel` raises the
# limit by this many entries (one per batch shape: a 2D model along z, y and x sees up to three).
SHAPES_PER_MODEL = 4


class CompiledModel:
    """A model under torch.compile (static shapes, inductor freezing: `FREEZE`) that falls back to eager, with one
    warning, when its first call (where compilation happens) fails. Calls keep one input shape (`make_forward`
    pads the last batch), so it compiles once per shape."""

    def __init__(self, model: torch.nn.Module) -> None:
        import torch._dynamo.config as dynamo_config

        self.eager = model
        self.compiled_ok = False
        dynamo_config.recompile_limit += SHAPES_PER_MODEL  # this model's entries in the shared cache
        try:
            # tiles always have the patch's shape and batches are padded to one size: one graph
            self.module: torch.nn.Module | None = compile_module(model)
        except Exception as err:  # e.g. an unknown CELLSEG_COMPILE_BACKEND, refused at once
            log.warning("torch.compile failed (%s: %s); predicting eagerly", type(err).__name__, err)
            self.module = None

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self.module is None:
            return self.eager(*inputs)
        if self.compiled_ok:
            with _frozen():
                return self.module(*inputs)
        try:
            with _frozen(), warnings.catch_warnings():  # freezing goes through torch.jit, deprecated in torch 2.11
                warnings.filterwarnings("ignore", message=".*torch.jit", category=DeprecationWarning)
                out = self.module(*inputs)
        except Exception as err:  # any compiler failure: eager instead, as in training
            log.warning("torch.compile failed (%s: %s); predicting eagerly", type(err).__name__, err)
            self.module = None
            return self.eager(*inputs)
        self.compiled_ok = True
        return out


def _frozen() -> contextlib.AbstractContextManager:
    """Inductor's config with `FREEZE` (inductor backend only)."""
    if compile_backend() != "inductor" or not FREEZE:
        return contextlib.nullcontext()
    import torch._inductor.config as inductor_config

    return inductor_config.patch(FREEZE)


def release_compile_workers() -> bool:
    """Shut inductor's compile-worker pool down; returns whether this process had one.

    Inductor keeps the pool's parent process for the process's lifetime once it has compiled anything (idle, it
    only stops the pool's workers): ≈ 0.6 GiB of host memory per training job on an H200 with torch 2.11
    (docs/benchmarks.md, host memory). A job calls this once its graphs are all compiled; should anything compile
    again, inductor starts a new pool then.
    """
    async_compile = sys.modules.get("torch._inductor.async_compile")  # absent: nothing was ever compiled here
    shutdown = getattr(async_compile, "shutdown_compile_workers", None)
    if shutdown is None or not getattr(async_compile, "_pool_set", None):
        return False
    shutdown()
    return True
