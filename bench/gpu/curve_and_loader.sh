#!/usr/bin/env bash
# One batched GPU job on a 4-GPU host (64 cores): training curves and the loader with boundary channels:
#   GPU 0      the longest training curve the job time limit allows (CURVE_S): unet_3d on `medium`, all 48 classes + boundary
#              channels (cached), 1 GPU, 16 cores, validation with the 2026 metric every VAL_EVERY steps,
#              SIGTERM after CURVE_S seconds (checkpoint + exit 0);
#   GPUs 1, 2  the same training under DDP on 2 GPUs (what a second GPU buys in the same wall time);
#   GPU 3      the loader with cached boundary channels (bench/loader.py, 16 workers), then the clean 1-GPU
#              real-loader run with boundary channels (60 steps) against the in-memory rate.
#   OUT=DIR ROOT=/tmp/medium CURVE_S=480 bash bench/gpu/curve_and_loader.sh
set -uo pipefail
OUT="${OUT:-bench_out}"; ROOT="${ROOT:-/tmp/medium}"; CURVE_S="${CURVE_S:-480}"; VAL_EVERY="${VAL_EVERY:-300}"
export CELLSEG_CACHE="${CELLSEG_CACHE:-/tmp/cellseg_cache}"
mkdir -p "$OUT"
[ -f "$ROOT/datasplit.csv" ] || python3 -m cellseg -q synth --out "$ROOT" --preset medium --workers "$(nproc)"
curve=(configs/experiments/unet_3d.yaml "data.root=$ROOT" train.max_steps=100000 train.log_every=25
       "train.val_every=$VAL_EVERY" "train.checkpoint_every=$VAL_EVERY" optim.warmup_steps=100 loader.num_workers=15)
CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 timeout -s TERM "$CURVE_S" python3 -m cellseg -q train "${curve[@]}" \
  "run_dir=$OUT/curve_w1" > "$OUT/curve_w1.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1,2 taskset -c 16-47 timeout -s TERM "$CURVE_S" torchrun --standalone --nproc-per-node 2 \
  -m cellseg -q train "${curve[@]}" "run_dir=$OUT/curve_w2" > "$OUT/curve_w2.log" 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=3
  taskset -c 48-63 python3 -m bench.loader --root "$ROOT" --out "$OUT/loader" --workers 16 --shapes 3d --seconds 8 \
    --boundaries on --boundary-cache auto > "$OUT/loader.log" 2>&1
  taskset -c 48-63 timeout -s TERM 200 python3 -m cellseg -q train configs/experiments/unet_3d.yaml "data.root=$ROOT" \
    "run_dir=$OUT/e2e_w1_boundaries" train.max_steps=80 train.log_every=10 train.val_every=100000 \
    train.checkpoint_every=100000 loader.num_workers=15 > "$OUT/e2e_w1.log" 2>&1
  taskset -c 48-63 python3 -m bench.ddp_scaling --out "$OUT/inmem" --batch 8 --channels 58 --warmup 6 --steps 20 \
    > "$OUT/inmem.log" 2>&1
) &
wait
for r in "$OUT"/curve_w1 "$OUT"/curve_w2 "$OUT"/e2e_w1_boundaries; do
  [ -f "$r/metrics.jsonl" ] || { echo "$r: no metrics"; continue; }
  python3 - "$r" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
train = [r for r in rows if "train" in r]
steady = [r["train"]["samples_per_s"] for r in train if r["step"] > 20]
val = [(r["step"], round(r["val"]["overall_score"], 4)) for r in rows if "overall_score" in r.get("val", {})]
print(sys.argv[1], "steps", train[-1]["step"] if train else 0, "steady samples/s %.1f" % (sum(steady) / max(1, len(steady))),
      "mfu", train[-1]["train"].get("mfu") if train else None, "val", val)
PY
done
