"""What training and inference share about running models: the hardware (`hardware`: device, torchrun/DDP,
precision, TF32, channels-last, autocast), torch.compile with an eager fallback (`compile`) and checkpoint
files (`checkpoint`). Model code (`cellseg.models`) never touches any of it.

The hardware functions are re-exported here, so `from cellseg import runtime; runtime.autocast(...)` reads as
the call it is.
"""

from cellseg.runtime.hardware import (
    DTYPES,
    Dist,
    Precision,
    all_reduce_mean,
    autocast,
    barrier,
    broadcast_object,
    configure_allocator,
    configure_backends,
    init_distributed,
    make_scaler,
    memory_format,
    no_sync,
    resolve_precision,
    restart_count,
    shutdown_distributed,
    unwrap,
    wrap_ddp,
)

__all__ = ["DTYPES", "Dist", "Precision", "all_reduce_mean", "autocast", "barrier", "broadcast_object",
           "configure_allocator", "configure_backends", "init_distributed", "make_scaler", "memory_format", "no_sync",
           "resolve_precision", "restart_count", "shutdown_distributed", "unwrap", "wrap_ddp"]
