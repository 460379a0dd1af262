#!/usr/bin/env bash
# One batched GPU job for the streaming engine and the compiled inference forward, one job per GPU
# (NGPU=4: 16 cores each; NGPU=2: 16 cores each, the inference models run one after another on GPU 1):
#   test_set  bench/test_set.py: the 8-model × 8-TTA ensemble over the synthetic mirror of the 16 test crops,
#             with the steady-state probe per model, projected to the real test set;
#   infer     bench/inference.py per architecture (ours TTA 8 eager; TTA 1/8 compiled; TTA 8 compiled keeping
#             26 channels, crop 983's scored set; MONAI), each model under its own timeout, merged;
#   gpu tests pytest -m gpu.
#   OUT=DIR NGPU=4 bash bench/gpu/stream_compile.sh       (MODELS="..." picks the inference models)
set -uo pipefail
OUT="${OUT:-bench_out}"; BUDGET_S="${BUDGET_S:-570}"; NGPU="${NGPU:-4}"
MODELS="${MODELS:-unet_3d resnet_3d vit_3d swin_3d unet_2d resnet_2d vit_2d swin_2d}"
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
gpu_tests() {  # GPU, cores
  CUDA_VISIBLE_DEVICES=$1 timeout 200 taskset -c "$2" python3 -m pytest -m gpu -q -p no:cacheprovider tests \
    > "$OUT/pytest_gpu.log" 2>&1
}
(
  export CUDA_VISIBLE_DEVICES=0
  timeout "$(( BUDGET_S - 5 ))" taskset -c 0-15 python3 bench/test_set.py --out "$OUT/test_set" --workers 16 \
    > "$OUT/test_set.log" 2>&1
) &
read -r -a models <<< "$MODELS"
if [ "$NGPU" -ge 4 ]; then
  half=$(( (${#models[@]} + 1) / 2 ))
  infer 1 16-31 "${models[@]:0:$half}" > "$OUT/inference1.log" 2>&1 &
  infer 2 32-47 "${models[@]:$half}" > "$OUT/inference2.log" 2>&1 &
  gpu_tests 3 48-63 &
else
  ( gpu_tests 1 16-31; infer 1 16-31 "${models[@]}" > "$OUT/inference1.log" 2>&1 ) &
fi
wait
python3 bench/inference.py --merge "$OUT"/inference/*.json --out "$OUT/inference.json" > "$OUT/inference_merge.log" 2>&1
tail -n 12 "$OUT"/inference_merge.log "$OUT"/pytest_gpu.log "$OUT"/test_set.log 2>/dev/null
