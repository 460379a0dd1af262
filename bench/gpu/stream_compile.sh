#!/usr/bin/env bash
# One batched job on a 2-GPU host (32 cores; 16 per GPU) for the streaming engine and the compiled forward:
#   GPU 0  python -m bench.studies.test_set --predict-only for the 3D models (the 8-model × 8-TTA ensemble over the synthetic
#          mirror of the 16 test crops, with the steady-state probe per model), then --downstream-from both
#          halves: ensemble of all 8 stores, post-processing, submission, validation, the projection;
#   GPU 1  the same for the 2D models; then the CUDA tests (pytest -m gpu) and bench/inference.py per
#          architecture in $MODELS (ours TTA 8 eager; TTA 1/8 compiled; TTA 8 compiled keeping 26 channels,
#          crop 983's scored set; MONAI) while time is left, each under its own timeout, merged.
#   OUT=DIR bash bench/gpu/stream_compile.sh
set -uo pipefail
OUT="${OUT:-bench_out}"; BUDGET_S="${BUDGET_S:-560}"; WORK="${WORK:-/tmp/cellseg_test_set}"
MODELS="${MODELS:-unet_3d resnet_3d vit_3d swin_3d unet_2d resnet_2d vit_2d swin_2d}"
mkdir -p "$OUT/inference"
start=$SECONDS
half() {  # GPU, cores, name, models
  CUDA_VISIBLE_DEVICES=$1 timeout "$(( BUDGET_S - 90 ))" taskset -c "$2" python3 -m bench.studies.test_set --predict-only \
    --models "$4" --work "$WORK/$3" --out "$OUT/test_set_$3" --workers 16 > "$OUT/test_set_$3.log" 2>&1
}
infer() {  # GPU, cores, models...
  local gpu=$1 cores=$2; shift 2
  for m in "$@"; do
    left=$(( BUDGET_S - 15 - (SECONDS - start) )); [ "$left" -gt 40 ] || { echo "$m: skipped (budget)"; continue; }
    CUDA_VISIBLE_DEVICES=$gpu timeout "$(( left < 200 ? left : 200 ))" taskset -c "$cores" python3 -m bench.inference \
      --models "$m" --size 256 --tta 8 --compile --keep 26 --out "$OUT/inference/$m.json" || echo "$m: failed or timed out"
  done
}
half 0 0-15 3d unet_3d,resnet_3d,swin_3d,vit_3d &
first=$!
(
  half 1 16-31 2d unet_2d,resnet_2d,swin_2d,vit_2d
  CUDA_VISIBLE_DEVICES=1 timeout 200 taskset -c 16-31 python3 -m pytest -m gpu -q -p no:cacheprovider tests \
    > "$OUT/pytest_gpu.log" 2>&1
  read -r -a models <<< "$MODELS"
  infer 1 16-31 "${models[@]}" > "$OUT/inference.log" 2>&1
) &
wait "$first"
while [ ! -f "$OUT/test_set_2d.json" ] || pgrep -f "bench.studies.test_set --predict-only" > /dev/null; do sleep 2; done
CUDA_VISIBLE_DEVICES=0 timeout "$(( BUDGET_S - (SECONDS - start) ))" taskset -c 0-15 python3 -m bench.studies.test_set \
  --downstream-from "$OUT/test_set_3d.json" "$OUT/test_set_2d.json" --work "$WORK/all" --out "$OUT/test_set" \
  > "$OUT/test_set.log" 2>&1
wait
python3 -m bench.inference --merge "$OUT"/inference/*.json --out "$OUT/inference.json" > "$OUT/inference_merge.log" 2>&1
tail -n 12 "$OUT"/inference_merge.log "$OUT"/pytest_gpu.log
grep -v pow_by_natural "$OUT/test_set.log" | tail -n 30
