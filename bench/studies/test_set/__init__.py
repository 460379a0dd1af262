"""The full ensemble (every architecture × 8 TTA) over a synthetic test set laid out like the 16 real test crops,
timed stage by stage and projected to the real test set (target: within 60 minutes on one H200).

1. **Data** (`runs.make_data`). A synthetic CellMap root (`cellseg.synth.generate` of `mirror_preset`) whose test
   crops mirror the 16 crops of the packaged 2026 test manifest: the same 6 datasets and 16 crops, each crop's
   shape the real shape divided by `--scale` (in crop voxels). A dataset's EM s0 voxel size is its finest real
   crop's; each coarser crop sits at s0 × 1, 2 or 4 (the generator's crop scales), so real steps of 8× (e.g.
   4 → 32 nm) become 4× (4 → 16 nm): the synthetic grids keep the order of the real voxel sizes but compress the
   largest steps. Full crops (48 classes) annotate every class, coarse crops the generator's "coarse" set. One
   16³ training crop per dataset (the run builder needs training crops).
2. **Runs** (`runs.build_run`). One run directory per `configs/experiments/*.yaml`, written by the trainer's own
   `build_setup` (`config.yaml`, `meta.json`, datasplit) plus `checkpoints/last.pt` from `Setup.state_dict` as
   the trainer saves it, with randomly initialised weights: inference throughput does not depend on the weight
   values.
3. **Stages** (`predict`, `downstream`), with the functions the CLI calls: `predict_run` per run over the test
   crops (TTA 8, float16 store, the run's training micro-batch per forward), `ensemble` of all stores (uniform
   weights), `postprocess_store` (default parameters, device "auto": CUDA on a GPU), `write_submission` and
   `validate_submission` against the synthetic test manifest. With `--fused`, one `predict_ensemble` of every
   run (as `cellseg predict-ensemble`) replaces the per-run predicts and the ensemble.
4. **Projection** (`projection`) to the real 2026 test crops under three policies: every crop at the models'
   8 nm; at max(8 nm, the crop's voxel size) per axis (the 13.9–32 nm crops predicted by members trained at that
   voxel size; assumed to have the same architecture, patch and speed as the 8 nm ones); and the latter at
   overlap 0.25. Predict time per model = model load + compile (the warm-up predict) + sliding-window tiles ×
   seconds per tile in the steady state of one large box (`steady`; tiles counted per column exactly as
   `predict_run` cuts each crop, context included) + the store writes per channel-voxel. The other stages: a
   cost per crop or array (the smallest crop timed alone) plus a cost per channel-voxel (ensemble,
   post-processing) or per submitted voxel (crop grid × labels; submission and validation, measured on a probe:
   the largest crop resubmitted on a 4 nm grid). Every stage is assumed to keep its measured rates at any crop
   size (streaming block by block).

Writes OUT.json (everything) and OUT.md (the tables, `report`) and prints the tables. A model that fails (e.g.
out of memory) is recorded and left out of the ensemble. The data, runs and stores go to `--work` (default: a
temporary folder, deleted at the end).

Usage (one H200, about 6 minutes):  python -m bench.studies.test_set --out OUT/test_set --workers 16
Smoke (CPU, < 1 minute):           python -m bench.studies.test_set --quick --out /tmp/test_set
"""

# Only light modules at the top of every module of this package: the generator's forkserver workers import the
# main module (and so this package) again, and torch would cost each of them seconds. The stages import what
# they need inside their functions.
from bench.studies.test_set.cli import main
from bench.studies.test_set.layout import PROBE_LABELS, real_volumes

__all__ = ["PROBE_LABELS", "main", "real_volumes"]
