#!/usr/bin/env bash
# One batched GPU job on a 4-GPU host (64 cores), one job per GPU, 16 cores each, for the streaming engine and
# the compiled inference forward:
#   GPU 0, 1  bench/inference.py per architecture (ours TTA 8 eager; TTA 1/8 compiled; TTA 8 compiled keeping
#             26 channels, crop 983's scored set; MONAI), each model under its own timeout, merged;
#   GPU 2     bench/test_set.py: the 8-model × 8-TTA ensemble over the synthetic mirror of the 16 test crops,
#             with the steady-state probe per model, projected to the real test set;
#   GPU 3     the CUDA tests (pytest -m gpu).
#   OUT=DIR bash bench/gpu/stream_compile.sh
set -uo pipefail
OUT="${OUT:-bench_out}"; BUDGET_S="${BUDGET_S:-570}"
mkdir -p "$OUT/inference"
start=$SECONDS
infer() {  # GPU, cores, models...
  local gpu=$1 cores=$2; shift 2
  for m in "$@"; do
    left=$(( BUDGET_S - 15 - (SECONDS - start) )); [ "$left" -gt 30 ] || { echo "$m: skipped (budget)"; continue; }
    CUDA_VISIBLE_DEVICES=$gpu timeout "$(( left < 200 ? left : 200 ))" taskset -c "$cores" python3 bench/inference.py \
      --models "$m" --size 256 --tta 8 --compile --keep 26 --out "$OUT/inference/$m.json" || echo "$m: failed or timed out"
  done
}
infer 0 0-15 unet_3d resnet_3d vit_3d unet_2d > "$OUT/inference0.log" 2>&1 &
infer 1 16-31 swin_3d resnet_2d vit_2d swin_2d > "$OUT/inference1.log" 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=2
  timeout "$(( BUDGET_S - 5 ))" taskset -c 32-47 python3 bench/test_set.py --out "$OUT/test_set" --workers 16 \
    > "$OUT/test_set.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=3
  timeout 300 taskset -c 48-63 python3 -m pytest -m gpu -q -p no:cacheprovider tests > "$OUT/pytest_gpu.log" 2>&1
) &
wait
python3 bench/inference.py --merge "$OUT"/inference/*.json --out "$OUT/inference.json" > "$OUT/inference_merge.log" 2>&1
tail -n 12 "$OUT"/inference_merge.log "$OUT"/pytest_gpu.log "$OUT"/test_set.log 2>/dev/null
