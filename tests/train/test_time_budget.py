"""A wall-clock training budget (`train.time_budget_min`): the clock, the learning-rate schedule over it, the stop
with a final validation, validation at fixed clock times, and a resumed run continuing the clock. Deterministic:
the trainer runs on CPU with a fake time source (one minute per optimizer step) injected into its clock."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cellseg.config import load_run_config
from cellseg.config.schema import OptimConfig, TrainConfig
from cellseg.train.clock import TrainClock, crossed
from cellseg.train.optim import lr_factor
from cellseg.train.trainer import Trainer

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke" / "unet_3d.yaml"
MINUTE = 60.0


class FakeTime:
    """`now()` in seconds, moved by the test."""

    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_clock_counts_only_running_spells_and_restores():
    now = FakeTime(100.0)
    clock = TrainClock(now=now)
    now.t = 130.0
    assert clock.seconds() == 0.0 and not clock.running  # nothing counts before start (set-up, compilation)
    clock.start()
    now.t = 140.0
    assert clock.seconds() == 10.0
    with clock.paused():  # validation
        now.t = 200.0
        assert clock.seconds() == 10.0
    now.t = 205.0
    assert clock.seconds() == 15.0 and clock.running
    clock.restore(90.0)
    now.t = 300.0
    assert clock.seconds() == 90.0 and clock.shared_s == 90.0 and not clock.running
    with clock.paused():
        pass
    assert not clock.running  # a paused clock stays paused after a paused block


def test_crossed_fires_once_per_period():
    assert crossed(59.0, 61.0, 60.0) and not crossed(61.0, 119.0, 60.0) and crossed(119.0, 120.0, 60.0)
    assert not crossed(0.0, 1e9, 0.0)  # no period: never


def _time_lr(optim: OptimConfig, budget_min: float, minutes: list[float], step: int = 10_000) -> list[float]:
    t = FakeTime()
    factor = lr_factor(optim, total_steps=10, budget_s=budget_min * MINUTE, clock_s=t)
    out = []
    for m in minutes:
        t.t = m * MINUTE
        out.append(factor(step))
    return out


def test_cosine_decays_over_the_budget_not_over_max_steps():
    optim = OptimConfig(schedule="cosine", warmup_steps=0, min_lr_ratio=0.01)
    start, middle, end, after = _time_lr(optim, 10.0, [0.0, 5.0, 10.0, 12.0])
    assert start == pytest.approx(1.0) and middle == pytest.approx(0.505) and end == pytest.approx(0.01)
    assert after == pytest.approx(0.01)  # past the budget: the floor
    # max_steps=10 and step 10,000 play no part: the same factors at step 0
    assert _time_lr(optim, 10.0, [5.0], step=0) == [middle]


def test_poly_and_warmup_in_minutes():
    optim = OptimConfig(name="sgd", lr=1e-2, schedule="poly", warmup_steps=0, warmup_min=1.0, min_lr_ratio=0.0)
    ramp0, ramp_half, peak, middle, end = _time_lr(optim, 5.0, [0.0, 0.5, 1.0, 3.0, 5.0])
    assert (ramp0, ramp_half, peak) == (0.0, pytest.approx(0.5), pytest.approx(1.0))
    assert middle == pytest.approx(0.5 ** 0.9)  # half of the 4 minutes after the warm-up
    assert end == pytest.approx(0.0)


def test_warmup_steps_ramp_joins_the_time_decay_continuously():
    optim = OptimConfig(schedule="cosine", warmup_steps=9, min_lr_ratio=0.0)
    t = FakeTime(30.0)
    factor = lr_factor(optim, total_steps=10, budget_s=10 * MINUTE, clock_s=t)
    decay = 0.5 * (1 + math.cos(math.pi * 30.0 / 600.0))
    assert factor(0) == pytest.approx(0.1) and factor(8) == pytest.approx(0.9)  # ramp below the decay
    assert factor(9) == pytest.approx(decay) and factor(500) == pytest.approx(decay)


def test_step_schedule_is_unchanged_without_a_budget():
    optim = OptimConfig(schedule="cosine", warmup_steps=2, min_lr_ratio=0.0)
    factor = lr_factor(optim, total_steps=12)
    assert [factor(s) for s in (0, 1)] == [pytest.approx(1 / 3), pytest.approx(2 / 3)]
    assert factor(2) == pytest.approx(1.0) and factor(7) == pytest.approx(0.5) and factor(12) == pytest.approx(0.0)


@pytest.mark.parametrize(("overrides", "message"), [
    (["optim.warmup_min=1"], "optim.warmup_min=1.0 needs train.time_budget_min"),
    (["train.time_budget_min=2", "optim.warmup_min=2"], "must be shorter than train.time_budget_min=2.0"),
    (["train.time_budget_min=0"], "train.time_budget_min=0.0 must be > 0"),
    (["train.val_every_min=-1"], "train.val_every_min=-1.0 must be > 0"),
])
def test_budget_config_errors_name_the_key(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        load_run_config(SMOKE, [f"run_dir={tmp_path}", *overrides])
    assert TrainConfig().time_budget_min is None  # off by default: behaviour unchanged


def _budget_run(root: Path, run_dir: Path, *overrides: str, resume: bool | str = False) -> Trainer:
    """A smoke run whose training clock advances one minute per optimizer step (the fake time is the step)."""
    cfg = load_run_config(SMOKE, [f"data.root={root}", f"run_dir={run_dir}", "train.max_steps=1000",
                                  "train.log_every=1", "train.val_every=1000", "train.checkpoint_every=1000",
                                  "optim.warmup_steps=0", "optim.min_lr_ratio=0", "train.time_budget_min=5",
                                  "train.val_every_min=2", *overrides])
    holder: list[Trainer] = []
    trainer = Trainer(cfg, resume=resume, now=lambda: MINUTE * holder[0].s.state.step)
    holder.append(trainer)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return trainer


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_budget_stops_with_a_final_validation_and_resumes_the_clock(tiny_synth_root, tmp_path):
    run = tmp_path / "run"
    trainer = _budget_run(tiny_synth_root, run)
    # The clock starts after step 1 (compilation is not charged): after step n it reads n - 1 minutes.
    assert trainer.s.state.step == 6
    records = _records(run)
    val = [(r["step"], r["train_min"]) for r in records if "val" in r]
    assert val == [(3, 2.0), (5, 4.0), (6, 5.0)]  # every 2 minutes, and the final one at the budget
    assert all("job_min" in r and r["job_min"] >= 0 for r in records)
    # The cosine runs over the 5 minutes. The rate a step's end sets for the next step reads the clock as the
    # step before it left it (one step behind; under DDP up to `log_every` steps).
    lrs = {r["step"]: r["train"]["lr"] for r in records if "train" in r}
    cosine = [3e-4 * 0.5 * (1 + math.cos(math.pi * m / 5)) for m in range(6)]
    assert [lrs[s] for s in range(1, 7)] == pytest.approx([cosine[0], *cosine[:5]])
    ckpt = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 6 and ckpt["train_seconds"] == pytest.approx(5 * MINUTE)

    # A longer budget resumes from the stored 5 minutes (the resumed job's first step is not charged either).
    resumed = _budget_run(tiny_synth_root, run, "train.time_budget_min=7", resume=True)
    assert resumed.s.state.step == 9
    later = [(r["step"], r["train_min"]) for r in _records(run) if "val" in r and r["step"] > 6]
    assert later == [(8, 6.0), (9, 7.0)]


def test_ddp_ranks_agree_on_the_budget(tiny_synth_root, tmp_path):
    """Two processes with real clocks: the ranks must stop at the same step (a disagreement would hang a
    collective until the timeout) and write one final validation."""
    run = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29519",
           "-m", "cellseg", "-q", "train", str(SMOKE), f"data.root={tiny_synth_root}", f"run_dir={run}",
           "train.batch_size=1", "train.max_steps=100000", "train.val_every=100000", "train.log_every=2",
           "train.time_budget_min=0.05", "loader.samples_per_epoch=16"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    val = [r for r in _records(run) if "val" in r]
    assert len(val) == 1 and val[0]["step"] % 2 == 0 and val[0]["train_min"] >= 0.05
    assert (run / "result.json").is_file()
