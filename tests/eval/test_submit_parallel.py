"""`write_submission` on a thread pool: the same zip as the sequential run, bounded, errors named; `map_bounded`."""

import os
import threading
import time
import zipfile
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import pytest
from eval_helpers import THREE_BALLS, balls

from cellseg.data.crops import Crop, Geometry
from cellseg.data.write import write_array, write_multiscale
from cellseg.eval import write_submission
from cellseg.eval.submit import map_bounded

LABELS = ("mito", "nuc", "er", "ld_lum", "pm", "ves")  # ves: never predicted (missing)


def _geometry(i):
    return Geometry(voxel_size_nm=(8.0, 8.0, 8.0), translation_nm=(100.0 * i, 200.0, 300.0 + 8 * i),
                    shape_vox=(48, 48, 40 + 4 * i))


def _predictions(root, n_crops=3):
    """Crops 1..n, each with instance ids from a 4 nm grid (nearest), float16 probabilities at 4 nm (area),
    float32 probabilities shifted by 3 nm (linear), a binary multiscale group and a missing label."""
    crops, rng = {}, np.random.default_rng(0)
    for i in range(1, n_crops + 1):
        g = _geometry(i)
        ids = balls(g.shape_vox, THREE_BALLS).astype(np.uint32) * 300 * i
        fine = ids.repeat(2, 0).repeat(2, 1).repeat(2, 2)
        t4 = [t - 2.0 for t in g.translation_nm]  # the first 4 nm voxel's centre
        write_array(root / f"crop{i}" / "mito", fine, attrs={"voxel_size": [4, 4, 4], "translation": t4})
        write_array(root / f"crop{i}" / "nuc", ids.astype(np.float32), attrs={
            "voxel_size": list(g.voxel_size_nm), "translation": list(g.translation_nm)})
        probs = np.clip((fine > 0) * 0.7 + rng.normal(0, 0.2, fine.shape), 0, 1).astype(np.float16)
        write_array(root / f"crop{i}" / "er", probs, attrs={"voxel_size": [4, 4, 4], "translation": t4})
        shifted = np.clip((ids > 0) * 0.6 + rng.normal(0, 0.2, ids.shape), 0, 1).astype(np.float32)
        write_array(root / f"crop{i}" / "ld_lum", shifted, attrs={
            "voxel_size": list(g.voxel_size_nm), "translation": [t + 3.0 for t in g.translation_nm]})
        write_multiscale(root / f"crop{i}" / "pm", (ids > 0).astype(np.uint8), voxel_size_nm=g.voxel_size_nm,
                         translation_nm=g.translation_nm, kind="labels", num_levels=2)
        crops[i] = Crop(id=i, dataset="synthetic", labels=dict.fromkeys(LABELS, g))
    return crops


def _members(path):
    """Every member's name, header fields and bytes, in archive order (all but the file times)."""
    with zipfile.ZipFile(path) as archive:
        return [(i.filename, i.compress_type, i.file_size, i.CRC, i.external_attr, archive.read(i))
                for i in archive.infolist()]


def test_workers_write_the_same_zip_and_report(tmp_path, capsys):
    preds = tmp_path / "pred.zarr"
    crops = _predictions(preds)
    one = write_submission(preds, crops, tmp_path / "one.zip", workers=1)
    four = write_submission(preds, crops, tmp_path / "four.zip", workers=4, progress=True)
    assert f"{3 * len(LABELS)}/{3 * len(LABELS)}" in capsys.readouterr().err  # the bar counts every label
    assert one == four
    assert one.missing == ["crop1/ves", "crop2/ves", "crop3/ves"]
    assert one.written == [f"crop{i}/{label}" for i in (1, 2, 3) for label in sorted(LABELS) if label != "ves"]
    members = _members(tmp_path / "one.zip")
    assert members == _members(tmp_path / "four.zip")
    assert {"crop3/mito/.zarray", "crop3/er/.zarray", "crop3/ld_lum/.zarray"} <= {m[0] for m in members}


def test_an_error_in_a_worker_names_the_array_and_writes_nothing(tmp_path):
    preds = tmp_path / "pred.zarr"
    crops = _predictions(preds)
    bad = -np.ones(_geometry(2).shape_vox, np.int32)
    write_array(preds / "crop2" / "nuc", bad, attrs={"voxel_size": [8, 8, 8], "translation":
                                                     list(_geometry(2).translation_nm)}, overwrite=True)
    with pytest.raises(ValueError, match="non-negative") as err:
        write_submission(preds, crops, tmp_path / "s.zip", workers=4)
    assert "crop2/nuc" in str(err.value)
    assert any("crop2/nuc" in note for note in err.value.__notes__)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pred.zarr"]  # no zip, no temporary directory


def test_map_bounded_keeps_order_and_at_most_workers_in_flight():
    lock, started, consumed, window = threading.Lock(), [0], [0], []

    def slow(i):
        with lock:
            started[0] += 1
            window.append(started[0] - consumed[0])
        time.sleep(0.001 * (7 - i % 7))  # later items often finish first
        return i * i

    def done():
        consumed[0] += 1

    assert map_bounded(slow, range(30), 4, done=done) == [i * i for i in range(30)]
    assert consumed == [30] and max(window) <= 4


def test_map_bounded_stops_at_the_first_error():
    started = []

    def fail_at_3(i):
        started.append(i)
        if i == 3:
            raise RuntimeError("item 3")
        time.sleep(0.01)
        return i

    with pytest.raises(RuntimeError, match="item 3"):
        map_bounded(fail_at_3, range(100), 4)
    assert len(started) < 10
    with pytest.raises(ValueError, match="at least 1"):
        map_bounded(fail_at_3, range(3), 0)


def test_map_bounded_keeps_the_bytes_budget():
    """With `cost`, the largest items start first and the costs in flight stay within the budget; an item over
    the budget runs alone."""
    lock, flight, seen = threading.Lock(), [], []

    def work(size):
        with lock:
            flight.append(size)
            seen.append(list(flight))
        time.sleep(0.002 * size)
        with lock:
            flight.remove(size)
        return -size

    sizes = [5, 1, 3, 8, 2, 2, 12, 1, 4]
    assert map_bounded(work, sizes, 3, cost=lambda s: s, budget=8) == [-s for s in sizes]
    assert seen[:2] == [[12], [8]] and all(len(f) <= 3 and sum(f) <= 8 for f in seen[1:])
    assert max(len(f) for f in seen) >= 2  # the small ones do run together


def _square_unless_3(i):
    if i == 3:
        os._exit(1)  # the process dies, as when the kernel kills it for memory
    return i * i


def test_map_bounded_processes_survive_a_dead_worker():
    """A dead process fails the item it ran (`died`); the items then in flight run again and succeed."""
    results = map_bounded(_square_unless_3, range(6), 2, processes=True, died=lambda i: f"item {i} died")
    assert results == [0, 1, 4, "item 3 died", 16, 25]
    with pytest.raises(BrokenProcessPool):
        map_bounded(_square_unless_3, [1, 3], 2, processes=True)



PINNED = """
import os, sys
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # as `taskset` or a SLURM allocation of one core
from cellseg.pool import usable_cores
from cellseg.report.results import ReportOptions
opts = ReportOptions(runs=("a", "b"), out="r")
print(usable_cores(), opts.scoring_workers, os.cpu_count())
"""


def test_worker_counts_follow_the_cores_this_process_may_use():
    # A job pinned to one core of a larger machine gets one scoring process, not one per core of the machine.
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", PINNED], capture_output=True, text=True, env=env, check=True).stdout
    cores, workers, machine = map(int, out.split())
    assert (cores, workers) == (1, 1) and machine >= 1


def _threads_after_numpy(_: int) -> tuple[str | None, int]:
    """In a pool process: OPENBLAS_NUM_THREADS, and this process's threads once numpy has started its BLAS."""
    import numpy

    numpy.ones((64, 64)) @ numpy.ones((64, 64))
    return os.environ.get("OPENBLAS_NUM_THREADS"), len(os.listdir("/proc/self/task"))


def test_pool_processes_start_no_thread_per_core(monkeypatch):
    # Each of `workers` processes is one job: numpy's BLAS starts one thread there, not one per core (thread
    # limits of a shared host; the processes are spawned before they import numpy), whatever they inherit.
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "8")
    for variable, threads in map_bounded(_threads_after_numpy, range(2), 2, processes=True):
        assert variable == "1" and threads <= 4  # the main thread and a few of Python's own
