"""Benchmark: decisions and decoding on the model's 8 nm grid vs on each crop's annotation grid
("native"), per crop voxel size, in both eras, with crop-bootstrap intervals.

    python -m bench.studies.native_grids --seed 23,29,31,37,41 --out OUT/native_grids_cpu  # ~35 min, 2 CPU cores
    python -m bench.studies.native_grids --quick --out /tmp/ng                      # under a minute: the test's run

Steps (what `scripts/demo.sh` does, through the library):
1. `cellseg synth --preset small --seed SEED` (`--quick`: `tiny`), unless `--data` names an existing root;
2. the three demo models `configs/demo/{unet_3d,resnet_3d,unet_2d}.yaml` trained on the CPU side by side, one
   process each (`--quick`: `configs/smoke/unet_3d.yaml` and `resnet_3d.yaml`, 2 steps, 16³ patches);
3. each predicts the validation and test crops with 8× TTA (`--quick`: 1);
4. crops by role (`cellseg.decide.inputs`, as `cellseg report` plans them): decisions are made on the runs'
   *tuning* crops only; the *scored* crops are the test crops (held-out truth in `ground_truth.zarr`) and the
   runs' *report* crops, never a tuning crop (`--decide-on validation`: decisions on every validation crop, the
   test crops alone scored);
5. **decisions** (`decisions.py`) both ways, on the tuning crops in decision mode: ensemble weights fitted
   (`--weights auto`) and post-processing parameters tuned (`tune_store`) scored on the model's grid
   (`score_grid="ensemble"`, `grid="model"`) or on the annotation grids ("native", the defaults); rows:
   `model_grid` (model-grid decisions decoded on the model grid), `model_grid_native_decoding` (the same
   decisions decoded on the annotation grid: the decoding alone) and `native` (native decisions, annotation-grid
   decoding);
6. **decoding with defaults**: the uniform mean post-processed with the default parameters on both grids
   (`uniform_model`, `uniform_annotation`);
7. each row written as a submission at the truth's geometry and scored by `cellseg evaluate`'s code in both eras
   against the scored crops' truth (built as `cellseg report` builds it); pooled per crop voxel size with each
   era's official rule, with 95 % crop-bootstrap intervals and paired intervals of every change
   (`tables.py`, `cellseg.decide.bootstrap`);
8. the same decoding comparison for ideal probabilities: each truth label of the scored crops (every tested
   class it has), its area fraction on the ensemble's 8 nm grid, decoded both ways with default parameters:
   what the decoding alone changes, whatever the models' quality.
Writes `OUT.json` and `OUT.md` (the tables), and keeps the work in `OUT_work/` (reused by a re-run).
"""

from bench.studies.native_grids.cli import main

__all__ = ["main"]
