"""A SIGTERM to the whole process group while validation workers score (`val.workers`): they outlive it like
the loader workers, the validation finishes, the run stops with its checkpoint, and nothing is left running."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from faultkit import REPO, finish, sigterm_driver, start

from cellseg.runtime.checkpoint import load
from cellseg.train.stop import EXIT_RESUMABLE

DRIVER = sigterm_driver("cellseg.train.validate", "gather", "SIGTERM_AT_GATHER", "as validation N waits for its workers")


def _alive_in_group(pgid: int) -> list[str]:
    """Processes of group `pgid` that are not zombies (a container's init may never reap an orphan)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(stat.parent.name)
    return alive


def test_sigterm_to_the_group_while_validation_workers_score(tiny_synth_root: Path, tmp_path: Path) -> None:
    driver, run = tmp_path / "driver.py", tmp_path / "run"
    driver.write_text(DRIVER)
    # Validations at steps 2 and 4 on one tuning crop, in 2 workers (loader.num_workers): the signal comes as
    # the second one waits for its scores (the workers started at the first, their signal rules in place).
    proc = start([str(driver), "-q", "train", str(REPO / "configs" / "smoke" / "unet_3d.yaml"),
                  f"data.root={tiny_synth_root}", f"run_dir={run}", "train.max_steps=6", "train.log_every=1",
                  "train.val_every=2", "loader.num_workers=2", "data.patch_shape_vox=[16,16,16]"],
                 log=tmp_path / "log", extra_env={"SIGTERM_AT_GATHER": "2"})
    assert finish(proc) == EXIT_RESUMABLE
    text = (tmp_path / "log").read_text()
    assert "Traceback" not in text and "exited unexpectedly" not in text, text[-3000:]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val" in r] == [2, 4]  # the interrupted validation finished
    assert load(run / "checkpoints" / "last.pt")["step"] == 4
    assert f"stopped early at step 4 on SIGTERM; {run}/checkpoints/last.pt" in text
    deadline = time.monotonic() + 10
    while _alive_in_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive_in_group(proc.pid) == []
    assert os.getpgid(0) != proc.pid  # (the test itself is not in that group)
