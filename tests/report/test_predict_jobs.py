"""`cellseg report --predict-jobs`: the members predict in parallel processes into the same stores (to float16
rounding: a worker's CPU threads, cores // jobs, may sum a convolution in another order than this process's),
a store left unfinished is completed, a failing member is named, and the option is checked; the processes
spread over the GPUs; the stores thresholded side by side equal those thresholded one by one.

Both smoke runs predict both test crops of `tiny_synth_root` and the runs' tuning crop (no TTA, no overlap).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import zarr

from cellseg.cli import main as cli
from cellseg.config.inference import InferConfig
from cellseg.data.prediction_store import PredictionStore
from cellseg.data.write import process_alive
from cellseg.decide.inputs import CropPlan, RunInfo, check_runs, checkpoint_file, plan_crops
from cellseg.decide.options import Layout
from cellseg.decide.predictions import (
    BackgroundPredictions,
    _init_worker,
    auto_jobs,
    next_gpu,
    predict_all,
    predict_jobs,
    visible_gpus,
)
from cellseg.decide.scoring import plain_segmentation, plain_segmentations
from cellseg.infer.predict import predict_run
from cellseg.report import ReportOptions

REPO = Path(__file__).resolve().parents[2]


def _options(runs, out: Path, jobs: int | str) -> ReportOptions:
    return ReportOptions(runs=tuple(str(r) for r in runs), out=str(out), crops="test", tune_crops="val",
                         overlap=0.0, device="cpu", progress=False, predict_jobs=jobs)


def _arrays(store: Path) -> dict[str, np.ndarray]:
    """Every array in a zarr store, by its path inside it."""
    return {str(a.parent.relative_to(store)): zarr.open_array(str(a.parent), mode="r")[...]
            for a in sorted(store.rglob(".zarray"))}


@pytest.fixture(scope="module")
def sequential(report_runs, tiny_synth_root, tmp_path_factory) -> tuple[list[RunInfo], CropPlan, list[Path]]:
    """The runs, their crops and their stores predicted one after the other in this process (`--predict-jobs 1`)."""
    runs = check_runs(report_runs)
    plan = plan_crops(runs, tiny_synth_root, crops="test", tune_crops="val")
    out = tmp_path_factory.mktemp("sequential")
    return runs, plan, predict_all(runs, Layout(out), plan, _options(report_runs, out, 1), tta=1)


def _assert_same_stores(expected: list[Path], got: list[Path], crops: int) -> None:
    assert [p.name for p in got] == [p.name for p in expected]
    for a, b in zip(expected, got, strict=True):
        arrays_a, arrays_b = _arrays(a), _arrays(b)
        assert sorted(arrays_a) == sorted(arrays_b) and len(arrays_a) >= crops
        for key, data in arrays_a.items():  # float16 probabilities: 2^-11 apart near 1, one step of rounding
            assert data.dtype == arrays_b[key].dtype, (a.name, key)
            np.testing.assert_allclose(arrays_b[key], data, rtol=0, atol=2**-10, err_msg=f"{a.name} {key}")


def test_members_in_two_processes_write_the_same_stores_and_finish_a_partial_one(report_runs, sequential, tmp_path,
                                                                                caplog, capfd):
    runs, plan, one = sequential
    assert len(plan.predicted) >= 3 and [p.name for p in one] == [f"{r.name}.zarr" for r in runs]
    layout = Layout(tmp_path / "two")
    partial = layout.predictions(runs[0], 1)  # as a stopped report leaves it: one crop of the first member done
    partial.parent.mkdir(parents=True)
    predict_run(runs[0].run_dir, plan.predicted[0], partial, InferConfig(tta=1, overlap=0.0, device="cpu",
                                                                        progress=False))
    capfd.readouterr()
    caplog.set_level(logging.INFO, logger="cellseg")
    two = predict_all(runs, layout, plan, _options(report_runs, tmp_path / "two", 2), tta=1)

    _assert_same_stores(one, two, len(plan.predicted))
    assert "predicted 2 members (tta=1) in 2 processes" in caplog.text
    out, err = capfd.readouterr()  # the workers log at the report's level and print each crop's line
    assert all(f"from {r.run_dir}" in err for r in runs), err
    assert f"{partial}: 1 of {len(plan.predicted)} crops already complete, skipped" in out


def test_finished_stores_need_no_process_until_their_checkpoint_changes(report_runs, sequential, tmp_path, caplog,
                                                                         capfd):
    # A resumed report: stores complete from the current checkpoints are not loaded again (no worker, no model);
    # a checkpoint written after its store sends that member back to `predict_run`, which checks the store itself.
    runs, plan, one = sequential
    layout = Layout(tmp_path / "again")
    for store in one:
        shutil.copytree(store, layout.predictions(runs[0], 1).parent / store.name)  # mtimes kept
    caplog.set_level(logging.INFO, logger="cellseg")
    assert predict_all(runs, layout, plan, _options(report_runs, tmp_path / "again", 2), tta=1) == \
        [layout.predictions(r, 1).resolve() for r in runs]
    assert "2 of 2 members' stores (tta=1) hold every crop from their current checkpoint: not loaded" in caplog.text
    assert "predicted 0 members" in caplog.text
    checkpoint = checkpoint_file(runs[0].run_dir, "best")
    before = checkpoint.stat()
    caplog.clear()
    capfd.readouterr()
    try:
        os.utime(checkpoint, (before.st_atime, time.time() + 60))  # as if written after the store
        predict_all(runs, layout, plan, _options(report_runs, tmp_path / "again", 2), tta=1)
    finally:
        os.utime(checkpoint, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert "1 of 2 members' stores" in caplog.text and "predicted 1 members (tta=1) in this process" in caplog.text
    assert f"{len(plan.predicted)} of {len(plan.predicted)} crops already complete, skipped" in capfd.readouterr().out
    _assert_same_stores(one, [layout.predictions(r, 1) for r in runs], len(plan.predicted))


REPORT_PROCESS = """
import logging, sys
from pathlib import Path
from cellseg.decide.inputs import check_runs, plan_crops
from cellseg.decide.predictions import predict_all
from cellseg.decide.options import Layout
from cellseg.report.results import ReportOptions

logging.basicConfig(level=logging.INFO)
runs_dirs, root, out = sys.argv[1:3], Path(sys.argv[3]), Path(sys.argv[4])
runs = check_runs(runs_dirs)
plan = plan_crops(runs, root, crops="test", tune_crops="val")
opts = ReportOptions(runs=tuple(runs_dirs), out=str(out), crops="test", tune_crops="val", overlap=0.0,
                     device="cpu", progress=False, predict_jobs=2)
predict_all(runs, Layout(out), plan, opts, tta=1)
"""


def test_workers_of_a_killed_report_exit_and_the_next_run_completes_the_stores(report_runs, sequential,
                                                                              tiny_synth_root, tmp_path):
    runs, plan, one = sequential
    out, log = tmp_path / "report", tmp_path / "report.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with log.open("w") as stderr:
        report = subprocess.Popen([sys.executable, "-c", REPORT_PROCESS, *map(str, report_runs),
                                   str(tiny_synth_root), str(out)], stderr=stderr, env=env)
    deadline = time.monotonic() + 120
    while "loaded " not in log.read_text() and report.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # until a worker has loaded its model
    assert report.poll() is None, log.read_text()
    children = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat") if _parent(p) == report.pid]
    report.kill()  # as a step limit kills the report outright
    report.wait()
    assert children
    try:
        deadline = time.monotonic() + 30
        while any(process_alive(socket.gethostname(), pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(process_alive(socket.gethostname(), pid) for pid in children)  # the workers noticed and left
    finally:  # none left behind should they not have
        for pid in [p for p in children if process_alive(socket.gethostname(), p)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    again = predict_all(runs, Layout(out), plan, _options(report_runs, out, 1), tta=1)  # resumes what they left
    _assert_same_stores(one, again, len(plan.predicted))


def _parent(stat: Path) -> int:
    try:
        return int(stat.read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def test_background_predictions_skip_the_runs_left_out_before_their_turn(report_runs, sequential, tmp_path,
                                                                        caplog):
    """A report's stage 4 begins beside stages 2-3 (`BackgroundPredictions`): two processes take the first two
    members at once, `keep` drops the third before its turn, and the stores are those predicted one by one."""
    _, plan, one = sequential
    third = tmp_path / "third_run"
    shutil.copytree(report_runs[1], third)
    every = check_runs([*report_runs, third])
    layout = Layout(tmp_path / "background")
    caplog.set_level(logging.INFO, logger="cellseg")
    background = BackgroundPredictions(every, layout, plan, _options(report_runs, tmp_path / "background", 2), tta=1)
    background.keep(every[:2])  # the first two are running or about to: the third's turn comes after one ends
    stores = background.result()
    assert stores == [layout.predictions(r, 1).resolve() for r in every]
    _assert_same_stores(one, stores[:2], len(plan.predicted))
    assert not stores[2].exists()
    assert "third_run (tta=1): not predicted, no longer needed" in caplog.text
    assert "predicted 2 members (tta=1) in 2 processes" in caplog.text


def test_background_predictions_raise_a_members_failure_on_result(report_runs, tiny_synth_root, tmp_path):
    broken = tmp_path / "broken_run"
    shutil.copytree(report_runs[1], broken)
    runs = check_runs([report_runs[0], broken])
    checkpoint_file(runs[1].run_dir, "best").write_bytes(b"not a checkpoint")
    plan = plan_crops(runs, tiny_synth_root, crops="test", tune_crops="val")
    background = BackgroundPredictions(runs, Layout(tmp_path / "r"), plan, _options(runs, tmp_path / "r", 1), tta=1)
    with pytest.raises(ValueError, match="not a readable checkpoint") as err:  # on the thread that waits
        background.result()
    assert str(broken) in str(err.value)


def test_a_failing_member_is_named_and_the_other_finishes(report_runs, tiny_synth_root, tmp_path):
    broken = tmp_path / "broken_run"
    shutil.copytree(report_runs[1], broken)
    runs = check_runs([report_runs[0], broken])
    plan = plan_crops(runs, tiny_synth_root, crops="test", tune_crops="val")
    checkpoint_file(runs[1].run_dir, "best").write_bytes(b"not a checkpoint")
    layout = Layout(tmp_path / "report")
    with pytest.raises(Exception, match="member ") as err:
        predict_all(runs, layout, plan, _options(report_runs, tmp_path / "report", 2), tta=1)
    assert str(runs[1].run_dir) in str(err.value) and err.value.__cause__ is not None
    assert not layout.predictions(runs[1], 1).exists()
    # both members started at once: the healthy one was running when the other failed and finished its store
    assert sorted(PredictionStore.open(layout.predictions(runs[0], 1)).completed()) == sorted(plan.predicted)


def test_the_option_is_checked_and_listed(report_runs, tmp_path, capsys):
    for bad in (0, -2):
        with pytest.raises(ValueError, match=rf"--predict-jobs {bad}: must be ≥ 1"):
            _options(report_runs, tmp_path, bad)
    with pytest.raises(ValueError, match="--predict-jobs 'two': must be 'auto' or a number"):
        _options(report_runs, tmp_path, "two")
    assert predict_jobs("auto", 8, "cpu") == 1  # the cores are the bottleneck on the CPU
    assert predict_jobs(4, 2, "cpu") == 2  # never more processes than members
    assert _options(report_runs, tmp_path, "auto").predict_jobs == "auto"

    with pytest.raises(SystemExit) as done:
        cli(["report", "--help"])
    assert done.value.code == 0 and "--predict-jobs N|auto" in capsys.readouterr().out
    args = ["report", "--runs", *map(str, report_runs), "--out", str(tmp_path / "r"), "--device", "cpu"]
    assert cli([*args, "--predict-jobs", "0"]) == 2
    assert "--predict-jobs 0: must be ≥ 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        cli([*args, "--predict-jobs", "two"])
    assert done.value.code == 2 and "--predict-jobs: 'two': must be 'auto'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_workers_are_spread_over_the_gpus_round_robin():
    # Each new worker takes the next GPU of the list, in the order the workers start, and sees only it (set before
    # torch touches CUDA); on the CPU no GPU is listed and the variable is left alone.
    context = multiprocessing.get_context("spawn")
    started = context.Value("i", 0)
    assert [next_gpu(["3", "5"], started) for _ in range(3)] == ["3", "5", "3"]
    assert next_gpu([], started) is None and visible_gpus("cpu") == []
    with ProcessPoolExecutor(1, mp_context=context, initializer=_init_worker,
                             initargs=(logging.WARNING, 1, os.getpid(), ["3", "5"], started)) as pool:
        assert pool.submit(os.getenv, "CUDA_VISIBLE_DEVICES").result() == "3"  # the fifth to start: index 4


def test_thresholding_in_processes_writes_the_stores_of_the_sequential_path(sequential, tmp_path):
    # The report's plain segmentations of several stores side by side (`plain_segmentations`) equal each store
    # segmented on its own, bit for bit (the same computation per crop, in another process).
    _, plan, stores = sequential
    jobs = [(p, tmp_path / "two" / p.name, plan.predicted) for p in stores]
    plain_segmentations(jobs, processes=2)
    for prob, out, crops in jobs:
        alone = plain_segmentation(PredictionStore.open(prob), tmp_path / "one" / prob.name, crops)
        assert sorted(PredictionStore.open(out).completed()) == sorted(crops)
        arrays_one, arrays_two = _arrays(alone.path), _arrays(out)
        assert sorted(arrays_one) == sorted(arrays_two) and arrays_one
        for key, data in arrays_one.items():
            np.testing.assert_array_equal(arrays_two[key], data, err_msg=f"{prob.name} {key}")


OUT_OF_MEMORY_ONCE = '''"""Fault injection for the spawned prediction workers (imported at their start-up, as `sitecustomize`): the
member whose run directory is $CELLSEG_TEST_OOM_RUN writes its first crop, then runs out of GPU memory, once;
every call records the TTA fold it was given in $CELLSEG_TEST_OOM_LOG."""
import os
import sys

if os.environ.get("CELLSEG_TEST_OOM_RUN"):
    sys.path.insert(0, {repo!r})
    import torch

    import cellseg.infer.predict as target

    real = target.predict_run

    def predict_run(run_dir, crops, out, opts=None):
        log = os.environ["CELLSEG_TEST_OOM_LOG"]
        first = not os.path.exists(log)
        with open(log, "a") as f:
            f.write(f"{{run_dir}} {{opts.tta_fold}}\\n")
        if first and str(run_dir) == os.environ["CELLSEG_TEST_OOM_RUN"]:
            real(run_dir, crops.split(",")[0], out, opts)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB (injected)")
        return real(run_dir, crops, out, opts)

    target.predict_run = predict_run
'''


def test_a_member_out_of_gpu_memory_is_predicted_again_alone(report_runs, sequential, tmp_path, monkeypatch,
                                                             caplog):
    # As on 2x H100 with four 3D members per GPU and 8x TTA: one member runs out of GPU memory after its first
    # crop; the other finishes, then the first predicts again alone with one TTA pass per forward, resuming its
    # store: the stores are those of the sequential path and the report goes on.
    runs, plan, one = sequential
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(OUT_OF_MEMORY_ONCE.format(repo=str(REPO)))
    calls = tmp_path / "calls.log"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(inject), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("CELLSEG_TEST_OOM_RUN", str(runs[0].run_dir))
    monkeypatch.setenv("CELLSEG_TEST_OOM_LOG", str(calls))
    caplog.set_level(logging.INFO, logger="cellseg")
    out = tmp_path / "report"
    two = predict_all(runs, Layout(out), plan, _options(report_runs, out, 2), tta=1)

    _assert_same_stores(one, two, len(plan.predicted))
    attempts = calls.read_text().split("\n")[:-1]
    assert sorted(attempts[:2]) == sorted(f"{r.run_dir} None" for r in runs)  # both at once, automatic fold
    assert attempts[2:] == [f"{runs[0].run_dir} 1"]  # then the one out of memory, alone, one TTA pass per forward
    assert f"{runs[0].name} ran out of GPU memory beside the other members' processes: predicting again in 1 " \
           "process(es)" in caplog.text


def test_auto_jobs_leave_room_for_tta():
    assert auto_jobs(8, 2, 79, tta=1) == 8  # 2x H100 without TTA: 4 per GPU
    assert auto_jobs(8, 2, 79, tta=8) == 4  # with 8x TTA: 2 per GPU (four ran out of memory)
    assert auto_jobs(8, 1, 139, tta=8) == 4  # one H200: 4
    assert auto_jobs(3, 2, 139, tta=8) == 3  # never more than the members
    assert auto_jobs(8, 1, 24, tta=8) == 1  # at least one


def test_in_this_process_a_member_out_of_gpu_memory_predicts_again_with_one_tta_pass(report_runs, sequential,
                                                                                      tmp_path, monkeypatch, caplog):
    # One job (the members one after the other in the report's process): out of GPU memory under TTA, the member
    # predicts again at once with one TTA pass per forward and completes its store; without TTA there is nothing
    # left to lower and the error names the member.
    import torch

    import cellseg.infer.predict as target

    runs, plan, _ = sequential
    real, calls = target.predict_run, []

    def out_of_memory_once(run_dir, crops, out, opts=None):
        calls.append((Path(run_dir).name, opts.tta_fold))
        if len(calls) == 1:
            real(run_dir, crops.split(",")[0], out, opts)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB (injected)")
        return real(run_dir, crops, out, opts)

    monkeypatch.setattr(target, "predict_run", out_of_memory_once)
    caplog.set_level(logging.WARNING, logger="cellseg")
    out = tmp_path / "tta"
    stores = predict_all(runs[:1], Layout(out), plan, _options(report_runs, out, 1), tta=8)
    assert calls == [(runs[0].name, None), (runs[0].name, 1)]
    assert sorted(PredictionStore.open(stores[0]).completed()) == sorted(plan.predicted)
    assert f"{runs[0].name} ran out of GPU memory: predicting again with one TTA pass per forward" in caplog.text

    calls.clear()
    with pytest.raises(RuntimeError, match=f"member {runs[0].run_dir}: out of GPU memory alone on the GPU"):
        predict_all(runs[:1], Layout(tmp_path / "plain"), plan, _options(report_runs, tmp_path / "plain", 1), tta=1)
