#!/usr/bin/env bash
# The main job end to end on the embedded synthetic data, from a fresh clone (about 5.5 minutes on 2 CPU cores):
#   set-up → synthetic `small` dataset → train 3 small models (configs/demo/) → predict the validation and test
#   crops with 8× TTA → weighted ensemble (weights fitted on the validation crops) → post-processing (parameters
#   tuned on the validation crops) → submission at the test crops' geometry → validate it → score it in both metric
#   eras against the held-out truth (leaderboard-style tables) → the ablation table (`cellseg report`).
# Re-running reuses whatever exists (data, trained runs, predictions, ensemble, ...): delete OUT_DIR to start over
# (and whenever DEMO_MODELS changes: the ensemble and the report of other models would be reused or refused).
#   bash scripts/demo.sh [OUT_DIR]          default OUT_DIR=demo_out
# Environment knobs:
#   DEMO_MODELS="unet_3d resnet_3d unet_2d"   which configs/demo/<name>.yaml to train (at least 2)
#   DEMO_DEVICE=auto                          auto (CUDA when present), cpu or cuda
#   DEMO_PARALLEL=1                           train (and predict with) the models at the same time, one process
#                                             each (0: one after another, each model's output on the console)
#   OMP_NUM_THREADS=1                         torch threads per process (see below)
set -euo pipefail
DEMO_START=$(date +%s.%N)
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh" ""  # "": no extras (a bare `source` would pass OUT_DIR on)
# One torch thread per process, and the models trained side by side to use the cores: on a 2-core machine that
# other processes share, OpenMP's spin-waiting threads made training and prediction 7-8x slower with 2 threads
# than with 1 (measured for the demo). Set OMP_NUM_THREADS to override.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
PARALLEL="${DEMO_PARALLEL:-1}"

OUT="${1:-$CELLSEG_ROOT/demo_out}"
DATA="$OUT/data"
RUNS="$OUT/runs"
PRED="$OUT/predictions"
DEVICE="${DEMO_DEVICE:-auto}"
read -r -a MODELS <<< "${DEMO_MODELS:-unet_3d resnet_3d unet_2d}"
if [ "${#MODELS[@]}" -lt 2 ]; then
  echo "DEMO_MODELS needs at least 2 models (the ensemble and the ablation compare them): got '${MODELS[*]}'" >&2
  exit 1
fi
mkdir -p "$OUT" "$RUNS" "$PRED"
TIMINGS=()

# stage NAME COMMAND...: run a stage, print its wall time and keep it for the summary.
stage() {
  local name="$1" start
  shift
  echo
  echo "==> $name"
  start=$(date +%s.%N)
  "$@"
  TIMINGS+=("$(seconds_since "$start" "$name")")
  echo "    ${TIMINGS[-1]}"
}

seconds_since() {  # seconds_since START LABEL → "   12.3 s  LABEL"
  awk -v a="$1" -v b="$(date +%s.%N)" -v n="$2" 'BEGIN { printf "%8.1f s  %s\n", b - a, n }'
}

# each_model FUNCTION: FUNCTION MODEL for every model, side by side (DEMO_PARALLEL=1, logs in OUT/logs) or in turn.
each_model() {
  local fn="$1" m i failed=0 pids=()
  if [ "$PARALLEL" != 1 ]; then
    for m in "${MODELS[@]}"; do "$fn" "$m"; done
    return
  fi
  mkdir -p "$OUT/logs"
  for m in "${MODELS[@]}"; do
    (start=$(date +%s.%N); "$fn" "$m"; seconds_since "$start" "$m" > "$OUT/logs/$fn.$m.time") \
      > "$OUT/logs/$fn.$m.log" 2>&1 &
    pids+=("$!")
    echo "$m: started (log: $OUT/logs/$fn.$m.log)"
  done
  for i in "${!pids[@]}"; do
    m="${MODELS[$i]}"
    if wait "${pids[$i]}"; then
      grep -h "validation (" "$OUT/logs/$fn.$m.log" | sed "s/^.*INFO *cellseg.train.trainer:/  $m:/" || true
      echo "  $(cat "$OUT/logs/$fn.$m.time")"
    else
      echo "$m FAILED; the end of $OUT/logs/$fn.$m.log:" >&2
      tail -n 25 "$OUT/logs/$fn.$m.log" >&2
      failed=1
    fi
  done
  return "$failed"
}
TIMINGS+=("$(seconds_since "$DEMO_START" "set-up")")

make_data() {
  if [ -f "$DATA/train_crop_manifest.csv" ]; then echo "reusing $DATA"; return; fi
  cellseg synth --out "$DATA" --preset small --seed 0
}

train_model() {  # a finished run leaves result.json; an interrupted one resumes from its last checkpoint
  local run="$RUNS/$1"
  if [ -f "$run/result.json" ]; then echo "reusing $run (already trained)"; return; fi
  cellseg train "configs/demo/$1.yaml" "data.root=$DATA" "run_dir=$run" "train.device=$DEVICE" --resume auto
}

predict_model() {  # crops already in the store are skipped; a stamp skips even loading the model on a re-run
  local store="$PRED/$1.zarr" stamp="$PRED/.$1.complete"
  if [ -d "$store" ] && [ -f "$stamp" ]; then echo "reusing $store"; return; fi
  cellseg predict "$RUNS/$1" --crops val --out "$store" --tta 8 --device "$DEVICE"
  cellseg predict "$RUNS/$1" --crops test --out "$store" --tta 8 --device "$DEVICE"
  touch "$stamp"
}

# Every validation crop of the runs (roles "tuning" and "report", comma-separated ids): the demo scores the held-out
# test crops, so the validation crops kept for an unbiased report on validation data are free for the decisions,
# and three crops decide less noisily than the one tuning crop of the `small` preset.
val_ids() {
  tail -n +2 "$RUNS/${MODELS[0]}/validation_roles.csv" | cut -d, -f1 | sed 's/^crop//' | paste -sd, -
}

make_ensemble() {
  if [ -d "$OUT/ensemble.zarr" ]; then echo "reusing $OUT/ensemble.zarr"; return; fi
  local members=()
  for m in "${MODELS[@]}"; do members+=("$PRED/$m.zarr"); done
  cellseg ensemble "${members[@]}" --out "$OUT/ensemble.zarr" --weights auto --crops "$(val_ids)" \
    --device "$DEVICE"
}

postprocess() {  # tuned on the validation crops (the store also holds the test crops: never tuned on)
  local params="$OUT/segmentation.params.json" how=()
  if [ -f "$params" ]; then how=(--params "$params")
  else how=(--tune-on "$DATA" --crops $(val_ids | tr , ' ') --params "$params"); fi
  cellseg postprocess "$OUT/ensemble.zarr" --out "$OUT/segmentation.zarr" "${how[@]}" --device "$DEVICE"
}

# The whole test manifest: `cellseg submit` writes the labels the demo models do not predict as empty arrays, which
# never score below missing ones (its --help), and the validation checks every row.
submit() {
  if [ -f "$OUT/submission.zip" ]; then echo "reusing $OUT/submission.zip"; return; fi
  cellseg submit "$OUT/segmentation.zarr" --manifest "$DATA/test_crop_manifest.csv" --out "$OUT/submission.zip"
}

validate() {
  cellseg validate-submission "$OUT/submission.zip" --manifest "$DATA/test_crop_manifest.csv"
}

leaderboard() {  # every label of the held-out truth is scored, as on the leaderboard; a re-run refreshes the files
  for era in 2025 2026; do
    echo
    cellseg evaluate "$OUT/submission.zip" "$DATA/ground_truth.zarr" --metric "$era" --json "$OUT/scores_$era.json"
  done
}

ablation() {  # stage 4 (8x TTA) reads the stores the predict stage wrote instead of predicting again
  local runs=() stores=()
  for m in "${MODELS[@]}"; do runs+=("$RUNS/$m"); stores+=("$PRED/$m.zarr"); done
  cellseg report --runs "${runs[@]}" --out "$OUT/report" --crops test --tune-crops "$(val_ids)" \
    --device "$DEVICE" --reuse "${stores[@]}"
}

stage "synthetic dataset (preset small)" make_data
stage "train ${MODELS[*]} (configs/demo/)" each_model train_model
stage "predict the validation and test crops with 8x TTA" each_model predict_model
stage "ensemble: weights fitted on the validation crops" make_ensemble
stage "post-process: parameters tuned on the validation crops" postprocess
stage "submission at the test crops' geometry" submit
stage "validate the submission" validate
stage "leaderboard: score the submission in both eras" leaderboard
stage "ablation report (test crops scored, validation crops tuned)" ablation

echo
echo "==> timings ($(getconf _NPROCESSORS_ONLN) CPU cores, OMP_NUM_THREADS=$OMP_NUM_THREADS, DEMO_PARALLEL=$PARALLEL," \
  "device $DEVICE)"
printf '%s\n' "${TIMINGS[@]}" | tee "$OUT/timings.txt"
seconds_since "$DEMO_START" "total" | tee -a "$OUT/timings.txt"
echo
echo "submission: $OUT/submission.zip; scores: $OUT/scores_2025.json, $OUT/scores_2026.json (all 48 labels of the"
echo "held-out truth; labels the demo models do not predict are submitted empty); ablation: $OUT/report/report.md"
