"""The worker of a whole-volume run: `python -m cellseg.volume.worker OUT.zarr --task TASK [--device ...]`.

It connects to the run's scheduler (daisy; where to is in `DAISY_CONTEXT`, which the driver sets), builds what
the task needs once (the ensemble on its GPU for `predict`), then takes blocks until none are left. The driver
starts one per worker slot, locally as a subprocess or through `volume.launch` (e.g. `srun`) on a cluster; the
same command run by hand with the driver's `DAISY_CONTEXT` joins the run too.

A block that raises is reported failed to the scheduler (which retries it, elsewhere if possible) and the worker
goes on with the next one, so one bad block costs no model reload. Pick the GPU with `CUDA_VISIBLE_DEVICES`
(the driver does: worker i gets GPU i mod the number of visible GPUs).
"""

from __future__ import annotations

import time

STARTED = time.time()  # the process's start: a worker's start-up (imports, models) counts from here

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

from cellseg.volume.plan import Box  # noqa: E402

log = logging.getLogger("cellseg.volume.worker")
RUN_ENV = "CELLSEG_VOLUME_RUN"  # the driver's run id: workers record their timing under it


def box_of(block: object) -> Box:
    """A daisy block's write ROI as a box in s0 voxels."""
    roi = block.write_roi  # type: ignore[attr-defined]
    return tuple(int(v) for v in roi.offset), tuple(int(v) for v in roi.shape)  # type: ignore[return-value]


def serve(store_path: str, task: str, device: str = "auto") -> int:
    """Build the task's handler and process blocks until the scheduler has none left; returns the number done.
    With `RUN_ENV` set (the driver sets it), the worker's timing is written to `timing_file` at the end."""
    import daisy.v2 as daisy

    from cellseg.volume.store import VolumeStore
    from cellseg.volume.tasks import handler

    store = VolumeStore.open(store_path)
    client = daisy.Client()
    if not client.connected:
        return 0
    handle = handler(store, task, device)
    timing = {"task": task, "blocks": 0, "ready_s": time.time() - STARTED, "busy_s": 0.0, "first": None, "last": None}
    try:
        while True:
            box: Box | None = None
            try:
                with client.acquire_block() as block:
                    if block is None:
                        return int(timing["blocks"])  # type: ignore[arg-type]
                    box = box_of(block)
                    began = time.time()
                    handle(box)
                    timing["busy_s"] += time.time() - began  # type: ignore[operator]
                    timing["first"] = timing["first"] or began
                    timing["last"] = time.time()
                    timing["blocks"] += 1  # type: ignore[operator]
            except Exception as err:  # reported to the scheduler by acquire_block; go on with the next block
                log.error("%s: block at %s vox failed: %s", task, list(box[0]) if box else "?", err)
    finally:
        run = os.environ.get(RUN_ENV)
        if run:
            path = timing_file(store.path, task, run)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(timing))


def timing_file(store: Path, task: str, run: str) -> Path:
    """Where a worker of `task` in run `run` records its timing (blocks, start-up, busy seconds, first and last
    block in epoch seconds)."""
    return store / ".blocks" / "logs" / task / f"timing-{run}-{os.getpid()}.json"


def main(argv: Sequence[str] | None = None) -> int:
    """The worker's command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m cellseg.volume.worker",
                                     description="a worker of `cellseg predict-volume` (started by it)")
    parser.add_argument("store", help="the run's OUT.zarr")
    parser.add_argument("--task", required=True, help="the task whose blocks to process (e.g. predict)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    done = serve(args.store, args.task, args.device)
    log.info("%s: %d blocks done", args.task, done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
