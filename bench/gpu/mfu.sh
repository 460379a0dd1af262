#!/usr/bin/env bash
# MFU matrix of the 3D UNet trainer step on ONE GPU (unet_3d 32 -> 320 at 128³; target >= 30 % MFU).
#
# How to reproduce the MFU matrix
#   OUT=DIR bash bench/gpu/mfu.sh       # one H100/H200; about 8 minutes wall at most (BUDGET_S=450 s of runs)
#   CPU check of the script itself (seconds per row, numbers meaningless):
#   OUT=/tmp/mfu PYTHON=.venv/bin/python BENCH_ARGS="--device cpu --preset tiny" STEPS=2 WARMUP=2 BUDGET_S=900 \
#     bash bench/gpu/mfu.sh      # about 4 minutes on 2 cores
#
# Each row is one process of bench/ddp_scaling.py (no torchrun): unet_3d, 128³, 48 output channels, bf16 autocast,
# TF32, channels-last, in-memory random batch, fused AdamW, the model compiled through the trainer's
# cellseg.runtime.compile.compile_module with the row's mode (train.compile_mode), the loss compiled in "default".
# Rows, most informative first (cap = hard `timeout` of the row):
#   b8_default    baseline (docs/benchmarks.md: 124.2 ms, 23.3 %), then --profile: time per kernel group
#                 (conv fwd / dgrad / wgrad / norm / elementwise / optimizer / other / idle)          cap 150 s
#   b16_default   larger batch                                                                           cap 120 s
#   b8_ro         reduce-overhead = CUDA graphs (removes launch gaps, the profile's "idle" row)        cap 150 s
#   b8_mano       max-autotune-no-cudagraphs (Triton templates + coordinate descent; long compile)   cap 200 s
#   b16_ro, b16_mano                                                                                   150 / 200 s
#   extras, while time is left: b8_cudnn_all (cudnn.benchmark_limit=0: cuDNN times every algorithm, not
#   10), b8_group / b8_instance (GroupNorm / InstanceNorm instead of BatchNorm: what nnU-Net's norm costs)
# A row's timeout is min(cap, what is left of BUDGET_S); a row that would get < MIN_RUN_S is skipped (listed).
# `timeout` signals the whole process group, so inductor's compile workers die with their row.
#
# Outputs ($OUT, 4 entries): mfu.md + mfu.json (table: status, ms/step, samples/s, MFU, peak GB, warm-up s,
# CUDA-graph skips; the baseline's kernel-group profile), mfu.log (console), runs/ (per row: ddp_<row>.json,
# <row>.log; profile_b8_default.json + .md; status.tsv). MFU is against the bf16 matmul peak measured on the GPU.
# Expected: a default-mode row 40-60 s (model + loss compile about 20 s on an H200, docs/benchmarks.md), a
# max-autotune row minutes (it may hit its cap: the table says "timed out").
# Reading it: MFU = model FLOPs / step time / peak. In the profile, "idle" is what CUDA graphs can win; the three
# conv rows against their FLOP shares (fwd : dgrad : wgrad ~ 1 : 1 : 1) show which pass cuDNN runs slowly; norm +
# elementwise is memory traffic that only fusion (or fewer passes) removes.
# Knobs: BUDGET_S (450), MIN_RUN_S (45), STEPS (20 timed), WARMUP (5 untimed: compile, cuDNN autotuning, CUDA-graph
# recording), PYTHON (python3), BENCH_ARGS (appended to every row).
set -uo pipefail
OUT="$(realpath -m "${OUT:-bench_out/mfu}")"; RUNS="$OUT/runs"  # before the cd: relative to the caller
cd "$(dirname "$0")/../.."
BUDGET_S="${BUDGET_S:-450}"; MIN_RUN_S="${MIN_RUN_S:-45}"; STEPS="${STEPS:-20}"; WARMUP="${WARMUP:-5}"
PYTHON="${PYTHON:-python3}"; read -r -a EXTRA <<< "${BENCH_ARGS:-}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$RUNS"; : > "$RUNS/status.tsv"; : > "$OUT/mfu.log"
log() { echo "$*" | tee -a "$OUT/mfu.log"; }
log "$("$PYTHON" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'cuDNN',
  torch.backends.cudnn.version(), torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')" 2>&1)"
start=$SECONDS

row() {  # row NAME CAP_S ARGS... : one bench process under a hard timeout; appends to runs/status.tsv
  local name=$1 cap=$2; shift 2
  local left=$((BUDGET_S - (SECONDS - start))) t0=$SECONDS rc
  local limit=$((cap < left ? cap : left))
  if ((limit < MIN_RUN_S)); then
    printf '%s\tskip\t0\t0\t%s\n' "$name" "$*" >> "$RUNS/status.tsv"; log "$name: skipped (${left} s left)"; return
  fi
  timeout -k 10 "$limit" "$PYTHON" -m bench.ddp_scaling --out "$RUNS" --tag "$name" --model unet_3d \
    --channels 48 --compile-loss on --steps "$STEPS" --warmup "$WARMUP" "$@" "${EXTRA[@]}" > "$RUNS/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" $((SECONDS - t0)) "$limit" "$*" >> "$RUNS/status.tsv"
  log "$name: exit $rc after $((SECONDS - t0)) s (limit $limit s): $(grep -h '^{' "$RUNS/$name.log" | tail -1)"
}

row b8_default   150 --batch 8  --compile-mode default --profile
row b16_default  120 --batch 16 --compile-mode default
row b8_ro        150 --batch 8  --compile-mode reduce-overhead
row b8_mano      200 --batch 8  --compile-mode max-autotune-no-cudagraphs
row b16_ro       150 --batch 16 --compile-mode reduce-overhead
row b16_mano     200 --batch 16 --compile-mode max-autotune-no-cudagraphs
row b8_cudnn_all 120 --batch 8  --compile-mode default --cudnn-benchmark-limit 0
row b8_group     120 --batch 8  --compile-mode default --norm group
row b8_instance  120 --batch 8  --compile-mode default --norm instance

"$PYTHON" -m bench.ddp_scaling --mfu-report "$RUNS" --out "$OUT" > /dev/null && cat "$OUT/mfu.md"
log "total $((SECONDS - start)) s"
