"""cellseg's cache folder (`$CELLSEG_CACHE`, default `~/.cache/cellseg`) and what lives in it.

- `matmul_peak.json`: the measured bf16 matmul peak per GPU model (`cellseg.train.perf`, for MFU);
- `boundaries/`: instance-boundary targets per crop (`cellseg.data.boundary_cache`);
- `inductor/`: torch.compile's caches (`use_compile_cache`);
- `startup/`: a training job's start-up measurements (GPU-room probe, compile decisions), reused by the next job
  of the same shape (`cellseg.train.warm_start`).

Why the compile cache moves here: torch keeps it in `/tmp/torchinductor_$USER`, which a cluster's compute
node wipes between jobs, so every job compiled its models from scratch. `cellseg predict-ensemble` compiles
eight members: 117-182 s of the test-set run on an H200 with a cold cache (docs/benchmarks.md). In the
cache folder it survives the job: predicting the validation crops (to fit the ensemble weights) compiles
the same graphs that predicting the test crops then loads. Inductor keys its entries by the graph, the
input shapes, the torch/Triton versions and the GPU, and with inductor freezing by the weights' metadata
only, so a model retrained with the same shapes hits the cache too.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"  # torch's variable; a value set by the user always wins


def cache_root() -> Path:
    """`$CELLSEG_CACHE`, else `~/.cache/cellseg`."""
    return Path(os.environ.get("CELLSEG_CACHE") or Path.home() / ".cache" / "cellseg")


def use_compile_cache() -> Path | None:
    """Keep torch.compile's caches (inductor graphs, AOTAutograd, Triton kernels) in `cache_root()/inductor`
    unless `TORCHINDUCTOR_CACHE_DIR` is set; call before the first compilation. Returns the folder in use, or
    None where it cannot be created (torch's `/tmp` default then stays, with a warning).

    Importing `torch._dynamo` writes torch's default into the variable, so that value counts as unset."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get(INDUCTOR_ENV)
    if current and os.path.abspath(current) != os.path.abspath(default_cache_dir()):
        return Path(current)
    folder = cache_root() / "inductor"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as err:
        log.warning("compile cache %s is not writable (%s); torch's default in /tmp is used, so every job "
                    "compiles from scratch. Set CELLSEG_CACHE or %s to a writable folder", folder, err, INDUCTOR_ENV)
        return None
    os.environ[INDUCTOR_ENV] = str(folder)
    log.debug("torch.compile cache: %s", folder)
    return folder
