"""Commands end by themselves and say what is wrong: a synth worker that cannot start, out-of-range arguments,
a config value of the wrong form, an existing --json file."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from faultkit import SMOKE, finish, start

from cellseg.cli import main
from cellseg.config import load_run_config

BROKEN_INIT = textwrap.dedent('''\
    """`cellseg ARGS` whose synth workers fail in their initializer (a library missing on the worker's side)."""
    import sys


    def broken(scenes):
        raise ImportError("numcodecs cannot be imported here (simulated broken install)")


    if __name__ == "__main__":
        import importlib

        from brokeninit import broken as importable  # pickled by a module name the workers can import
        from cellseg.cli import main

        importlib.import_module("cellseg.synth.generate")._init_worker = importable
        sys.exit(main(sys.argv[1:]))
''')


def test_a_synth_worker_that_cannot_start_ends_the_command(tmp_path: Path) -> None:
    driver = tmp_path / "brokeninit.py"
    driver.write_text(BROKEN_INIT)
    out = tmp_path / "root"
    proc = start([str(driver), "synth", "--out", str(out), "--preset", "tiny", "--workers", "2"],
                 log=tmp_path / "log", extra_env={"PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[2]}"})
    assert finish(proc, timeout=120) == 1  # ended by itself, with an error status
    text = (tmp_path / "log").read_text()
    # The first worker's error, once, in one line: not a stream of replacement workers failing, nor a traceback.
    assert text.count("numcodecs cannot be imported here (simulated broken install)") == 1 and "Traceback" not in text
    assert "(in the initializer of a `cellseg synth` worker process)" in text.strip().splitlines()[-1]
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".root.")]


@pytest.mark.parametrize(("args", "message"), [
    (["--max-zip-gb", "-1"], "--max-zip-gb must be a positive number of GiB, got -1.0"),
    (["--memory-gb", "0"], "--memory-gb must be a positive number of GiB, got 0.0"),
    (["--workers", "0"], "--workers must be at least 1, got 0"),
])
def test_evaluate_refuses_out_of_range_numbers(tmp_path: Path, args: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", str(tmp_path / "sub.zip"), str(tmp_path / "truth.zarr"), "--metric", "2026",
                 *args]) == 2
    assert message in capsys.readouterr().err


def test_evaluate_keeps_an_existing_json_without_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scores = tmp_path / "scores.json"
    scores.write_text('{"precious": true}')
    assert main(["evaluate", str(tmp_path / "sub.zip"), str(tmp_path / "truth.zarr"), "--metric", "2026",
                 "--json", str(scores)]) == 2
    assert "pass --overwrite to replace it" in capsys.readouterr().err
    assert scores.read_text() == '{"precious": true}'


def test_submit_refuses_zero_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", str(tmp_path), "--out", str(tmp_path / "s.zip"), "--workers", "0"]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize(("override", "message"), [
    ("train.batch_size=big", "train.batch_size: 'big' is neither an int nor 'auto'"),
    ("train.batch_size=[2]", "train.batch_size: [2] is neither an int nor 'auto'"),
])
def test_a_union_typed_key_names_its_accepted_forms(override: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        load_run_config(SMOKE, [override])
    assert str(err.value) == message
