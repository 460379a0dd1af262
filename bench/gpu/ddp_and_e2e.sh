#!/usr/bin/env bash
# One batched GPU job (4 GPUs of one host): DDP scaling with in-memory input on 1, 2 and 4 GPUs, the kernel
# profile of the 1-GPU step, then `cellseg train` with the real loader on 1 GPU (16 cores) and on 4 GPUs.
#   OUT=DIR bash bench/gpu/ddp_and_e2e.sh            (needs the synthetic `medium` root at $ROOT)
set -uo pipefail
OUT="${OUT:-bench_out}"; ROOT="${ROOT:-/tmp/medium}"; STEPS="${STEPS:-60}"
mkdir -p "$OUT"
[ -f "$ROOT/datasplit.csv" ] || python3 -m cellseg -q synth --out "$ROOT" --preset medium --workers "$(nproc)"
ngpu=$(nvidia-smi -L | wc -l)
for n in 1 2 4; do
  [ "$n" -le "$ngpu" ] || continue
  extra=(); [ "$n" = 1 ] && extra=(--profile)
  torchrun --standalone --nproc-per-node "$n" bench/ddp_scaling.py --out "$OUT/ddp" --batch 8 --channels 48 "${extra[@]}"
done
torchrun --standalone --nproc-per-node 1 bench/ddp_scaling.py --out "$OUT/ddp58" --batch 8 --channels 58
python3 bench/ddp_scaling.py --summarize "$OUT/ddp" | tee "$OUT/ddp.md"
common=(configs/experiments/unet_3d.yaml "data.root=$ROOT" "train.max_steps=$STEPS" train.log_every=10
        train.val_every=100000 train.checkpoint_every=100000 val.max_crops=1 loader.num_workers=15
        data.instance_boundaries=false)
taskset -c 0-15 torchrun --standalone --nproc-per-node 1 -m cellseg -q train "${common[@]}" "run_dir=$OUT/e2e_w1"
[ "$ngpu" -ge 4 ] && torchrun --standalone --nproc-per-node 4 -m cellseg -q train "${common[@]}" "run_dir=$OUT/e2e_w4"
for r in "$OUT"/e2e_w*; do
  python3 - "$r" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if '"train"' in l]
steady = [r["train"]["samples_per_s"] for r in rows if r["step"] > 20]
print(sys.argv[1], "steady samples/s", sum(steady) / max(1, len(steady)), "mfu", rows[-1]["train"].get("mfu"))
PY
done
