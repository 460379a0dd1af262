#!/usr/bin/env bash
# One batched GPU job on 4 GPUs of one host (64 cores):
#   1. DDP scaling with in-memory input on 1, 2 and 4 GPUs (bench/ddp_scaling.py, compiled model and loss);
#   2. `cellseg train` with the real loader on 4 GPUs (16 cores each);
#   3. at the same time on two single GPUs with 16 cores each: the real loader on 1 GPU (60 steps) and a
#      short training curve (unet_3d on `medium`, all 48 classes + boundary channels, validation every 250 steps).
#   OUT=DIR ROOT=/tmp/medium bash bench/gpu/ddp_and_e2e.sh
set -uo pipefail
OUT="${OUT:-bench_out}"; ROOT="${ROOT:-/tmp/medium}"; STEPS="${STEPS:-60}"; CURVE_S="${CURVE_S:-240}"
mkdir -p "$OUT"
[ -f "$ROOT/datasplit.csv" ] || python3 -m cellseg -q synth --out "$ROOT" --preset medium --workers "$(nproc)"
ngpu=$(nvidia-smi -L | wc -l)
for n in 1 2 4; do
  [ "$n" -le "$ngpu" ] || continue
  torchrun --standalone --nproc-per-node "$n" -m bench.ddp_scaling --out "$OUT/ddp" --batch 8 --channels 48 \
    --warmup 6 --steps 20 2>&1 | grep world_size
done
python3 -m bench.ddp_scaling --summarize "$OUT/ddp" | tee "$OUT/ddp.md"
common=(configs/experiments/unet_3d.yaml "data.root=$ROOT" "train.max_steps=$STEPS" train.log_every=10
        train.val_every=100000 train.checkpoint_every=100000 val.max_crops=1 loader.num_workers=15
        data.instance_boundaries=false)
[ "$ngpu" -ge 4 ] && torchrun --standalone --nproc-per-node 4 -m cellseg -q train "${common[@]}" "run_dir=$OUT/e2e_w4"
CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 torchrun --standalone --nproc-per-node 1 -m cellseg -q train "${common[@]}" \
  "run_dir=$OUT/e2e_w1" > "$OUT/e2e_w1.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 taskset -c 16-31 timeout -s TERM "$CURVE_S" python3 -m cellseg -q train \
  configs/experiments/unet_3d.yaml "data.root=$ROOT" "run_dir=$OUT/curve" train.max_steps=2000 train.log_every=25 \
  train.val_every=250 train.checkpoint_every=250 optim.warmup_steps=100 loader.num_workers=15 > "$OUT/curve.log" 2>&1 &
wait
for r in "$OUT"/e2e_w* "$OUT/curve"; do
  python3 - "$r" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
train = [r for r in rows if "train" in r]
steady = [r["train"]["samples_per_s"] for r in train if r["step"] > 20]
val = [(r["step"], round(r["val"]["overall_score"], 4)) for r in rows if "overall_score" in r.get("val", {})]
print(sys.argv[1], "steady samples/s %.1f" % (sum(steady) / max(1, len(steady))), "mfu", train[-1]["train"].get("mfu"), "val", val)
PY
done
