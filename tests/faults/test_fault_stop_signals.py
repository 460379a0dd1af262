"""Every command, not only `train`, ends with exit status 75 ("stopped early, resumable") on SIGTERM or SIGUSR1,
in one line; the same command run again then finishes."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from faultkit import finish, start, wait_for

from cellseg.train.stop import EXIT_RESUMABLE


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_stops_synth_with_status_75_and_the_same_command_finishes(tmp_path: Path, sig: int) -> None:
    out = tmp_path / "root"
    command = ["-m", "cellseg", "synth", "--out", str(out), "--preset", "tiny", "--workers", "1"]
    proc = start(command, log=tmp_path / "stopped.log")
    wait_for(lambda: any(tmp_path.glob(".root.tmp-*")), proc=proc)  # it is writing
    proc.send_signal(sig)
    assert finish(proc) == EXIT_RESUMABLE
    text = (tmp_path / "stopped.log").read_text()
    assert f"cellseg synth: stopped early on {signal.Signals(sig).name}" in text and "Traceback" not in text
    assert not out.exists()  # nothing half-written under the name asked for
    if sig != signal.SIGTERM:
        return  # the same command again: once is enough
    again = start(command, log=tmp_path / "again.log")
    assert finish(again) == 0, (tmp_path / "again.log").read_text()
    assert (out / "synth.json").is_file() and not any(tmp_path.glob(".root.tmp-*"))
