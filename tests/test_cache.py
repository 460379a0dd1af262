"""cellseg's cache folder: torch.compile's caches live there, so a second process loads what the first compiled."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from cellseg.cache import INDUCTOR_ENV, cache_root, use_compile_cache

# A tiny model compiled on the CPU through cellseg's compile_module; prints inductor's cache counters.
COMPILE_ONCE = """
import json, torch
from torch._dynamo.utils import counters
from cellseg.runtime.compile import compile_module
net = compile_module(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()))
net(torch.ones(2, 8))
print(json.dumps({k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}))
"""


@pytest.fixture
def no_user_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """CELLSEG_CACHE in tmp_path; TORCHINDUCTOR_CACHE_DIR at torch's default, as importing torch._dynamo leaves
    it (restored afterwards)."""
    monkeypatch.setenv("CELLSEG_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(INDUCTOR_ENV, default_cache_dir())
    return tmp_path / "cache"


def test_compile_cache_defaults_to_the_cellseg_cache_folder(no_user_setting: Path) -> None:
    assert cache_root() == no_user_setting
    assert use_compile_cache() == no_user_setting / "inductor"
    assert os.environ[INDUCTOR_ENV] == str(no_user_setting / "inductor")
    assert (no_user_setting / "inductor").is_dir()
    assert list((no_user_setting / "inductor").iterdir()) == []  # the write probe is gone


def test_compile_cache_keeps_the_users_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(INDUCTOR_ENV, str(tmp_path / "mine"))
    assert use_compile_cache() == tmp_path / "mine"
    assert os.environ[INDUCTOR_ENV] == str(tmp_path / "mine")


def test_unwritable_compile_cache_warns_and_keeps_torchs_default(no_user_setting: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    no_user_setting.parent.mkdir(parents=True, exist_ok=True)
    no_user_setting.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING, logger="cellseg.cache"):
        assert use_compile_cache() is None
    assert os.environ[INDUCTOR_ENV] == default_cache_dir()
    assert "not writable" in caplog.text and str(no_user_setting / "inductor") in caplog.text


def test_a_second_process_loads_the_compiled_graph(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != INDUCTOR_ENV}
    env["CELLSEG_CACHE"] = str(tmp_path / "cache")

    def run() -> dict[str, int]:
        done = subprocess.run([sys.executable, "-c", COMPILE_ONCE], env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    assert first.get("fxgraph_cache_miss", 0) >= 1 and first.get("fxgraph_cache_hit", 0) == 0
    assert second.get("fxgraph_cache_hit", 0) >= 1 and second.get("fxgraph_cache_miss", 0) == 0
    assert any((tmp_path / "cache" / "inductor").rglob("*.py"))  # the generated code is in our folder
