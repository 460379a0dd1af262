"""Compiling in a process of its own while the job already trains, eagerly.

A cold `torch.compile` of a large network is minutes of single-threaded Python in inductor, with the GPU idle
(swin_3d on an H200 host: 100 s, most of it inductor's code generation; docs/benchmarks.md). With
`train.background_compile` a child process (`python -m cellseg.train.background`) builds the same model and loss
from the job's resolved config (`cellseg.train.build`), compiles them for the same batch, memory format and
precision and runs each once (`cellseg.train.compile_choice.warm_compile_cache`): their graphs and kernels land
in the shared compile cache (`$CELLSEG_CACHE/inductor`). Meanwhile the job trains on the eager model. When the
child has exited, the job compiles the model and the loss itself, now loading them from the cache in seconds,
decides as `train.compile` says ("auto" times both) and trains compiled from that step on
(`Setup.finish_compile`).

It applies (`cellseg.runtime.gpu_memory.background_budget`) to `train.compile` "on"/"auto" in one CUDA process,
when no earlier job of the same start-up key compiled (`cellseg.train.warm_start`: then the cache is warm and
compiling first costs seconds) and when the GPU has room for both: the child may use what is left once the job's
own step, eager loss, gradients and optimizer state are counted, and is capped at that
(`torch.cuda.set_per_process_memory_fraction`), so that an estimate short by more than `MARGIN` fails the child
(the job then compiles itself), not the job. DDP jobs compile before their first step: every rank would have to
switch at the same step.

The child writes its log to `run_dir/compile.log`; it ends with the job (terminated by `close`, or with the
whole process group by a scheduler's SIGTERM) and writes nothing but the compile cache.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from cellseg import runtime
from cellseg.config.load import dump, from_dict
from cellseg.config.schema import RunConfig
from cellseg.train.build import make_criterion, make_model
from cellseg.train.compile_choice import warm_compile_cache

log = logging.getLogger(__name__)
LOG_FILE = "compile.log"
_PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # where `import cellseg` resolves


class BackgroundCompile:
    """The compiling child process of a job (see the module docstring)."""

    def __init__(self, process: subprocess.Popen, log_path: Path) -> None:
        self.process, self.log_path = process, log_path
        self.started = time.perf_counter()
        self.seconds: float | None = None  # wall seconds from start to exit, once it exited

    @classmethod
    def start(cls, cfg: RunConfig, *, device: torch.device, batch: int, precision: runtime.Precision,
              max_bytes: int, log_path: Path) -> BackgroundCompile:
        """Start the child for `cfg` at micro-batch `batch`, allowed `max_bytes` of GPU memory on `device`."""
        path = os.pathsep.join(filter(None, [str(_PACKAGE_PARENT), os.environ.get("PYTHONPATH")]))
        command = [sys.executable, "-m", __name__, "--device", str(device), "--batch", str(batch),
                   "--precision", precision, "--max-bytes", str(max_bytes)]
        with log_path.open("wb") as out:
            process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                       env={**os.environ, "PYTHONPATH": path})
        job = cls(process, log_path)
        try:
            assert process.stdin is not None
            process.stdin.write(dump(cfg).encode())
            process.stdin.close()
        except BrokenPipeError:  # it ended before reading its config: `failure` reports its log
            pass
        log.info("compiling %s in the background (pid %d, log %s); training eagerly until it is done",
                 cfg.model.name, process.pid, log_path)
        return job

    def done(self) -> bool:
        """Whether the child has exited (a non-blocking check)."""
        if self.process.poll() is None:
            return False
        if self.seconds is None:
            self.seconds = time.perf_counter() - self.started
        return True

    def wait(self) -> None:
        """Block until the child has exited."""
        self.process.wait()
        self.done()

    def failure(self) -> str | None:
        """None when the child compiled everything; else its exit status and the end of its log."""
        if self.process.returncode == 0:
            return None
        try:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-3:]
        except OSError as err:
            tail = [f"(log unreadable: {err})"]
        return f"exit status {self.process.returncode}: " + " | ".join(tail)

    def close(self) -> None:
        """End the child if it still runs (the job ends or compiles itself)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def main(argv: list[str] | None = None) -> int:
    """The child: read the job's resolved config (YAML) on stdin, compile, run once, exit 0."""
    parser = argparse.ArgumentParser(
        prog="python -m cellseg.train.background",
        description="Compile a training job's model and loss into the compile cache (started by `cellseg train` "
                    "with train.background_compile; reads the job's resolved config as YAML on stdin).")
    parser.add_argument("--device", required=True, help="CUDA device, e.g. cuda:0")
    parser.add_argument("--batch", type=int, required=True, help="the job's micro-batch")
    parser.add_argument("--precision", required=True, choices=sorted(runtime.DTYPES), help="the job's precision")
    parser.add_argument("--max-bytes", type=int, required=True, help="GPU memory this process may allocate")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = from_dict(RunConfig, yaml.safe_load(sys.stdin.read()))
    device = torch.device(args.device)
    if device.type == "cuda":  # (a CPU device, which the trainer never asks for, has no cap)
        torch.cuda.set_device(device)
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.max_bytes / total), device)
    runtime.configure_backends(tf32=cfg.train.tf32, cudnn_benchmark=cfg.train.cudnn_benchmark)
    fmt = runtime.memory_format(2 if cfg.data.is_2d else 3, cfg.train.channels_last)
    start = time.perf_counter()
    warm_compile_cache(make_model(cfg, device, fmt), make_criterion(cfg, device), cfg, device,
                       precision=args.precision, fmt=fmt, batch=args.batch)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    log.info("compiled %s and its loss for micro-batch %d in %.1f s (%.1f GiB of GPU memory at most)",
             cfg.model.name, args.batch, time.perf_counter() - start, peak)
    return 0


if __name__ == "__main__":
    sys.exit(main())
