#!/usr/bin/env bash
# The quality benchmark (bench/studies/quality, docs/quality.md) as resumable steps, each within a job time limit
# (`--step-limit-min`, sized for 10-minute jobs): run the next step when one returns; a step stopped by the limit or by
# preemption exits 75 and resumes from WORK when run again. On two GPUs (the plan whose whole run fits a 30-minute
# GPU budget: both waves in one step, ~7 min):
#   OUT=OUT bash bench/gpu/quality.sh setup --gpus 2 --mps  # the `quality` data root, 16 processes (~2.5 min)
#   OUT=OUT bash bench/gpu/quality.sh train report    # all eight jobs, then the report in the minutes left; exit
#                                                     # 75: `train report` again while jobs were stopped, else report
#   OUT=OUT bash bench/gpu/quality.sh report          # cellseg report over the 8 runs + the result files; exit 75:
#                                                     # again (it resumes: stores, tuned classes, evaluations)
#   OUT=OUT bash bench/gpu/quality.sh product         # the report's decisions.json through predict-ensemble
#                                                     # --decisions, postprocess --decisions, submit, evaluate on the
#                                                     # same test crops: quality_product.json (equal to stage 5?)
# On one GPU: setup, then `train` (first wave: resnet_3d, unet_3d, swin_2d, unet_2d), `train report` (second wave:
# swin_3d, vit_3d, resnet_2d, vit_2d; then the report's start), then `report`.
# Extra arguments go to `python -m bench.studies.quality` (at setup: e.g. --budget-min 5, --set unet_3d:optim.name=sgd,
# --mps: the jobs sharing a GPU run as CUDA MPS clients, --data-from ROOT: link an existing data root of the same
# preset and seed, e.g. a probe with WORK=/tmp/probe after the benchmark; at report: --predict-jobs N).
# WORK (default /tmp/quality) keeps data, runs and checkpoints between steps; a `train` that finds nothing there
# starts with setup. Only result files reach OUT: quality_<step>.json and .log (train: quality_train_gpu.csv, the
# GPU's utilisation); the report step writes quality.md, quality.json and the PNGs. Needs the wheels the image lacks in .whl (docs/quality.md says which).
set -uo pipefail
STEP="${1:?usage: bash bench/gpu/quality.sh setup|train|report|product [bench.studies.quality options]}"; shift
OUT="${OUT:-bench_out}"; WORK="${WORK:-/tmp/quality}"
export CELLSEG_CACHE="${CELLSEG_CACHE:-/tmp/cellseg_cache}"  # compiled kernels, boundary caches: shared by the jobs
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ -d .whl ] && [ ! -f /tmp/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.installed || exit 1
fi
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
mkdir -p "$OUT"
if [ "$STEP" = train ]; then  # how busy the shared GPU is: one sample every 5 s
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$OUT/quality_train_gpu.csv" 2>&1 &
  sampler=$!
fi
python3 -m bench.studies.quality "$STEP" --work "$WORK" --out "$OUT" "$@" 2>&1 | tee "$OUT/quality_$STEP.log"
code="${PIPESTATUS[0]}"
[ -n "${sampler:-}" ] && kill "$sampler" 2>/dev/null
exit "$code"
