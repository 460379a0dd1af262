"""bench/host_memory.py runs end to end on CPU (``--quick``): a training job's memory is sampled and summarised."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.host_memory import MIB, main, summarise, tree_rss_bytes

REPO = Path(__file__).resolve().parents[2]
BENCH = ["-m", "bench.host_memory"]  # run from the repository root (cwd=REPO)


def test_quick_run_samples_the_job_and_its_steps(tiny_synth_root: Path, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, *BENCH, "--quick", "--root", str(tiny_synth_root),
                           "--out", str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((tmp_path / "host_memory.json").read_text())
    samples = result["samples"]
    assert len(samples) >= 10 and max(s["rss_mib"] for s in samples) > 100  # torch alone holds > 100 MiB
    assert any(s["step"] for s in samples), "the job's logged steps are read while it trains"
    assert all(0 < s["trainer_mib"] <= s["rss_mib"] for s in samples if s["rss_mib"])
    summary = result["summary"]
    assert summary["rss_mib_peak"] >= summary["rss_mib_end"] > 0 and isinstance(summary["flat"], bool)
    assert "| 0.05 |" in (tmp_path / "host_memory.md").read_text()


def test_an_existing_run_directory_is_never_reused(tiny_synth_root: Path, tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    done = subprocess.run([sys.executable, *BENCH, "--quick", "--root", str(tiny_synth_root),
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert done.returncode != 0 and "exists" in done.stderr


def test_the_verdict_waits_for_the_background_compile_and_ignores_falls_and_the_last_sample() -> None:

    # 60 samples 10 s apart: a background compile's process (+6000 MiB) until step 2000, then a level of 5000 MiB
    # that grows 1 MiB a sample, and a last sample taken while the job ends (its workers gone)
    samples = [{"t_s": 10.0 * i, "rss_mib": (11000.0 if i < 20 else 5000.0 + i), "step": 100 * i} for i in range(60)]
    samples[-1]["rss_mib"] = 2500.0
    blind = summarise(samples)  # warm-up = the first fifth: the process's exit reads as a fall, not a leak
    assert blind["growth_mib"] < -5000 and blind["flat"] is True
    s = summarise(samples, switch_step=1900)
    assert s["warmup_samples"] == 20 and s["switch_step"] == 1900
    assert abs(s["slope_mib_per_min"] - 6.0) < 1e-9  # 1 MiB per 10 s: the ending sample does not tilt it
    assert 0 < s["growth_mib"] < 50 and s["flat"] is True
    assert abs(s["late_slope_mib_per_min"] - 6.0) < 1e-9 and s["trainer_growth_mib"] is None  # tree-only samples
    leaking = [{**x, "rss_mib": 5000.0 + 100 * i} for i, x in enumerate(samples)]  # 100 MiB per sample
    assert summarise(leaking, switch_step=1900)["flat"] is False


def test_growth_that_levels_off_shows_in_the_late_slope_and_the_training_process_apart() -> None:
    # after a 2-minute warm-up: 3 MiB per sample for 5 minutes, then level; the training process holds all of it
    rss = [5000.0 + 3 * min(max(i - 12, 0), 30) for i in range(84)]
    samples = [{"t_s": 10.0 * i, "rss_mib": r, "trainer_mib": r - 1000.0, "step": 100 * i}  # workers: 1000, flat
               for i, r in enumerate(rss)]
    s = summarise(samples)
    assert s["slope_mib_per_min"] > 0 and s["late_slope_mib_per_min"] == 0.0
    assert s["trainer_growth_mib"] == s["growth_mib"] > 0


def test_a_warmup_floor_in_minutes_and_summarizing_a_stored_result_again(tmp_path: Path) -> None:
    # compile workers (+6000 MiB) lived until 3 minutes, past the switch at step 1000 (sample 10)
    samples = [{"t_s": 10.0 * i, "rss_mib": (11000.0 if i < 18 else 5000.0), "step": 100 * i} for i in range(60)]
    assert summarise(samples, switch_step=1000)["warmup_samples"] == 12  # a fall: flat, but the levels mislead
    s = summarise(samples, switch_step=1000, warmup_min=3.0)
    assert s["warmup_samples"] == 18 and s["rss_mib_after_warmup"] == 5000.0 and s["growth_mib"] == 0.0
    stored = tmp_path / "host_memory.json"
    stored.write_text(json.dumps({"command": "cellseg train ...", "minutes": 10.0, "samples": samples,
                                  "env": {"date": "2026-01-01", "cpu_count": 2, "torch": "x"},
                                  "summary": summarise(samples, switch_step=1000)}))
    assert main(["--summarize", str(stored), "--warmup-min", "3"]) == 0
    again = json.loads(stored.read_text())
    assert again["summary"]["warmup_samples"] == 18 and again["summary"]["warmup_min_floor"] == 3.0
    assert again["summary_as_run"]["warmup_samples"] == 12  # what the run itself concluded stays beside it
    assert "counted in RSS" in stored.with_suffix(".md").read_text()  # samples without compile_mib


def test_compile_processes_are_counted_apart_from_the_job() -> None:
    # a job whose child's command line names inductor's compile-worker pool; the child holds 300 MiB of written
    # pages (bytes of ones: zero-filled pages may stay unmapped), its parent only the interpreter. The marker is
    # joined at run time: in the parent's own command line it would mark the parent
    child = "import time; x = b'1' * (300 << 20); time.sleep(120)"
    job = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                            f"subprocess.Popen([sys.executable, '-c', {child!r}, 'torch/_inductor/' + 'compile_worker']); "
                            "time.sleep(120)"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while (sizes := tree_rss_bytes(job.pid))[1] < 300 * MIB and time.monotonic() < deadline:
            time.sleep(0.2)
        rss, compiling, own = sizes
        assert compiling >= 300 * MIB, "the compile worker's pages are counted as compiling"
        assert 0 < rss < 200 * MIB, "and not as the job's"
        assert own == rss, "the job's own process is the only one not compiling"
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the job and its child: a session of their own
        job.wait()


def test_a_run_stopped_midway_keeps_its_samples_and_ends_its_job(tiny_synth_root: Path, tmp_path: Path) -> None:
    bench = subprocess.Popen([sys.executable, *BENCH, "--quick", "--root", str(tiny_synth_root),
                              "--out", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=REPO)
    stored, deadline = tmp_path / "host_memory.json", time.monotonic() + 120
    while time.monotonic() < deadline and bench.poll() is None:  # until the job has logged a step
        if stored.is_file() and any(s["step"] for s in json.loads(stored.read_text())["samples"]):
            break
        time.sleep(0.1)
    assert bench.poll() is None, "the quick run ended before it logged a step: " + bench.communicate()[1][-2000:]
    bench.send_signal(signal.SIGTERM)  # the bench alone, as a user's kill: its job must not be left running
    _, err = bench.communicate(timeout=60)
    assert bench.returncode != 0 and "stopped by signal" in err
    result = json.loads(stored.read_text())
    assert result["complete"] is False and result["summary"] is None and len(result["samples"]) >= 1
    job_cmdline = f"run_dir={tmp_path / 'run'}".encode()
    alive = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if job_cmdline in cmdline.read_bytes():
                alive.append(cmdline.parent.name)
        except OSError:  # exited while listing
            continue
    assert not alive, f"the training job outlived the bench: pids {alive}"
