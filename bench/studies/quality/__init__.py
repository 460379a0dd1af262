"""The quality benchmark: do eight architectures ensembled segment better than the best one alone, each trained
for the same wall-clock budget on one shared GPU?

Steps (each resumes from what the previous one left in `--work`, and `train` finding nothing starts with `setup`):

- `check`: resolve the eight configs (`configs/quality/<arch>.yaml`) and refuse bad input before any GPU time:
  jobs predicting different classes or splitting the crops differently, a budget without room for 3 validations
  or not a whole number of validation periods (`plan.py`);
- `setup`: the synthetic `quality` data root (`cellseg.synth`, 16 processes) and `plan.json`;
- `train`: the eight jobs, 2 3D + 2 2D at a time, each on its own CPU cores, each for `train.time_budget_min`
  minutes of its training clock with validations every `train.val_every_min` (`schedule.py`); jobs still
  running at the step limit are stopped with a checkpoint and resume in the next `train` step;
- `report`: `cellseg report` over the eight runs (best single → uniform → fitted weights → + 8× TTA → +
  post-processing, both eras; test crops scored, every validation crop tuned on), and the result
  files: quality.md (tables for docs/quality.md), quality.json, quality_curves.png (score against training
  minutes, with whether each curve plateaued: `curves.py`), and the report's own figures and report.md.

The steps as resumable commands within a job time limit are bench/gpu/quality.sh; docs/quality.md has the
schedule and the results.

Usage (two GPUs):  python -m bench.studies.quality setup --gpus 2 --work /tmp/quality --out OUT   # then train, report
Usage (one GPU):   python -m bench.studies.quality setup --work /tmp/quality --out OUT   # then train, train, report
Smoke (CPU, 1-2 minutes):  python -m bench.studies.quality --quick --out /tmp/quality_out
"""

# Only light modules at the top of this package's modules: the data generator's forkserver workers import the
# main module (and so this package) again; torch and the heavy cellseg modules are imported inside functions.
from bench.studies.quality.cli import main

__all__ = ["main"]
