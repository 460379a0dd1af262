"""bench/step_layouts.py runs on the CPU (``--quick``): both head layouts train, and the 8-byte-row decode equals
the trainer's (the bench asserts it before timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_run_times_every_variant(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.step_layouts", "--quick", "--out", str(tmp_path / "sl")],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "sl.json").read_text())
    head = {f"{layout}_{how}_ms" for layout in ("as_is", "padded") for how in ("eager", "compiled")}
    assert set(result["head"]) == head
    assert set(result["decode"]) == {"one_byte_rows_ms", "eight_byte_rows_ms", "eight_byte_rows_contiguous_ms"}
    assert all(ms > 0 for part in ("head", "decode") for ms in result[part].values())
    assert "| padded to 64, sliced back |" in (tmp_path / "sl.md").read_text()
