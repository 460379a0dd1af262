#!/usr/bin/env bash
# One batched GPU job on a 4-GPU host (64 cores), one job per GPU, 16 cores each:
#   GPU 0  bench/inference.py per architecture (ours TTA 1/8 vs MONAI), each under its own timeout, merged;
#   GPU 1  the CUDA tests (pytest -m gpu), then bench/postprocess.py at 512³ (GPU path vs scipy/scikit-image);
#   GPU 2  python -m bench.studies.test_set: the 8-model × 8-TTA ensemble over the synthetic mirror of the 16 test crops;
#   GPU 3  bench/gpu/mfu.sh: the unet_3d MFU matrix (compile modes, batch 8/16, profile).
#   OUT=DIR bash bench/gpu/inference_and_mfu.sh
set -uo pipefail
OUT="${OUT:-bench_out}"; BUDGET_S="${BUDGET_S:-540}"
mkdir -p "$OUT/inference"
start=$SECONDS
(
  export CUDA_VISIBLE_DEVICES=0
  for m in unet_3d resnet_3d swin_3d vit_3d unet_2d resnet_2d swin_2d vit_2d; do
    left=$(( BUDGET_S - 20 - (SECONDS - start) )); [ "$left" -gt 30 ] || { echo "$m: skipped (budget)"; continue; }
    timeout "$(( left < 100 ? left : 100 ))" taskset -c 0-15 python3 -m bench.inference --models "$m" --size 256 \
      --out "$OUT/inference/$m.json" || echo "$m: failed or timed out"
  done > "$OUT/inference.log" 2>&1
  python3 -m bench.inference --merge "$OUT"/inference/*.json --out "$OUT/inference.json" >> "$OUT/inference.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 170 taskset -c 16-31 python3 -m pytest -m gpu -q -p no:cacheprovider tests > "$OUT/pytest_gpu.log" 2>&1
  left=$(( BUDGET_S - 10 - (SECONDS - start) ))
  timeout "$left" taskset -c 16-31 python3 -m bench.postprocess --size 512 --repeat 1 --no-torch-cpu \
    --out "$OUT/postprocess_h200" > "$OUT/postprocess.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=2
  timeout "$(( BUDGET_S - 10 ))" taskset -c 32-47 python3 -m bench.studies.test_set --out "$OUT/test_set" --workers 16 \
    > "$OUT/test_set.log" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=3
  OUT="$OUT/mfu" BUDGET_S=$(( BUDGET_S - 60 )) taskset -c 48-63 bash bench/gpu/mfu.sh > "$OUT/mfu.log" 2>&1
) &
wait
tail -n 15 "$OUT"/inference.log "$OUT"/pytest_gpu.log "$OUT"/postprocess.log "$OUT"/test_set.log "$OUT"/mfu/mfu.md 2>/dev/null
