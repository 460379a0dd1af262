#!/usr/bin/env bash
# The main job end to end on the embedded synthetic data, from a fresh clone (about 6 minutes on 2 CPU cores):
#   set-up → synthetic `small` dataset → train 3 small models (configs/demo/) → predict the validation and test
#   crops (no TTA and 8× TTA) → `cellseg decide` on the validation crops (per class: models and weights, TTA,
#   post-processing; decisions.json) → the product path on the test crops: predict-ensemble --decisions →
#   postprocess --decisions (one segmentation per metric era) → submission at the test crops' geometry → validate it
#   → score it against the held-out truth (leaderboard-style tables) → the ablation table (`cellseg report`), whose
#   stage 5 scores what the product path submitted.
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

predict_model() {  # crops already in a store are skipped; a stamp skips even loading the model on a re-run
  local tta store
  for tta in 1 8; do
    store="$PRED/tta$tta/$1.zarr"
    if [ -d "$store" ] && [ -f "$store.complete" ]; then echo "reusing $store"; continue; fi
    cellseg predict "$RUNS/$1" --crops val --out "$store" --tta "$tta" --device "$DEVICE"
    cellseg predict "$RUNS/$1" --crops test --out "$store" --tta "$tta" --device "$DEVICE"
    touch "$store.complete"
  done
}

# Every validation crop of the runs (roles "tuning" and "report", comma-separated ids): the demo scores the held-out
# test crops, so the validation crops kept for an unbiased report on validation data are free for the decisions,
# and three crops decide less noisily than the one tuning crop of the `small` preset.
val_ids() {
  tail -n +2 "$RUNS/${MODELS[0]}/validation_roles.csv" | cut -d, -f1 | sed 's/^crop//' | paste -sd, -
}

ERAS=(2025 2026)
runs() { local m; for m in "${MODELS[@]}"; do echo "$RUNS/$m"; done; }
stores() { local m; for m in "${MODELS[@]}"; do echo "$PRED/tta1/$m.zarr" "$PRED/tta8/$m.zarr"; done; }

decide() {  # every decision on the validation crops; the member stores predicted above stand for its predictions
  if [ -f "$OUT/decide/decisions.json" ]; then echo "reusing $OUT/decide/decisions.json"; return; fi
  cellseg decide $(runs) --out "$OUT/decide" --tune-crops "$(val_ids)" --device "$DEVICE" --reuse $(stores)
}

# The product path on the test crops, as on the challenge's hidden ones: no truth is read until `leaderboard`.
predict_decided() {
  if [ -d "$OUT/ensemble.zarr" ]; then echo "reusing $OUT/ensemble.zarr"; return; fi
  cellseg predict-ensemble --decisions "$OUT/decide/decisions.json" --crops test --out "$OUT/ensemble.zarr" \
    --device "$DEVICE"
}

postprocess() {  # one segmentation per era: each era's leaderboard gets the decoding decided with its metric
  local era
  for era in "${ERAS[@]}"; do
    cellseg postprocess "$OUT/ensemble.zarr" --decisions "$OUT/decide/decisions.json" --metric "$era" \
      --out "$OUT/segmentation_$era.zarr" --device "$DEVICE"
  done
}

# The whole test manifest: `cellseg submit` writes the labels the demo models do not predict as empty arrays, which
# never score below missing ones (its --help), and the validation checks every row.
submit() {
  local era
  for era in "${ERAS[@]}"; do
    if [ -f "$OUT/submission_$era.zip" ]; then echo "reusing $OUT/submission_$era.zip"; continue; fi
    cellseg submit "$OUT/segmentation_$era.zarr" --manifest "$DATA/test_crop_manifest.csv" \
      --out "$OUT/submission_$era.zip"
  done
}

validate() {
  local era
  for era in "${ERAS[@]}"; do
    cellseg validate-submission "$OUT/submission_$era.zip" --manifest "$DATA/test_crop_manifest.csv"
  done
}

leaderboard() {  # every label of the held-out truth is scored, as on the leaderboard; a re-run refreshes the files
  local era
  for era in "${ERAS[@]}"; do
    echo
    cellseg evaluate "$OUT/submission_$era.zip" "$DATA/ground_truth.zarr" --metric "$era" \
      --json "$OUT/scores_$era.json"
  done
}

ablation() {  # the member stores predicted above stand for the report's stages 1 and 4
  cellseg report --runs $(runs) --out "$OUT/report" --crops test --tune-crops "$(val_ids)" \
    --device "$DEVICE" --reuse $(stores)
}

same_as_report() {  # the product path's submission scores what the report's stage 5 scores, class by class
  python - "$OUT" "${ERAS[@]}" <<'PY'
import json, math, sys
out, eras = sys.argv[1], sys.argv[2:]
report = json.load(open(f"{out}/report/report.json"))
stage5 = next(s for s in report["stages"] if s["key"] == "postprocess")["scores"]
differ = []
for era in eras:
    ours = json.load(open(f"{out}/scores_{era}.json"))["label_scores"]
    for name, theirs in stage5[era]["classes"].items():
        key = "combined_score" if "combined_score" in ours[name] else "iou"
        if not math.isclose(ours[name][key], theirs, abs_tol=1e-9):
            differ.append(f"{era} {name}: submission {ours[name][key]:.4f}, report {theirs:.4f}")
print("the submissions score the report's stage 5 class by class in " + ", ".join(eras) if not differ
      else "DIFFERENT from the report's stage 5: " + "; ".join(differ))
sys.exit(1 if differ else 0)
PY
}

stage "synthetic dataset (preset small)" make_data
stage "train ${MODELS[*]} (configs/demo/)" each_model train_model
stage "predict the validation and test crops (no TTA, 8x TTA)" each_model predict_model
stage "decide on the validation crops (decisions.json)" decide
stage "predict the test crops as decided" predict_decided
stage "post-process as decided, per era" postprocess
stage "submissions at the test crops' geometry" submit
stage "validate the submissions" validate
stage "leaderboard: score each era's submission" leaderboard
stage "ablation report (test crops scored, validation crops tuned)" ablation
stage "the submissions against the report's stage 5" same_as_report

echo
echo "==> timings ($(getconf _NPROCESSORS_ONLN) CPU cores, OMP_NUM_THREADS=$OMP_NUM_THREADS, DEMO_PARALLEL=$PARALLEL," \
  "device $DEVICE)"
printf '%s\n' "${TIMINGS[@]}" | tee "$OUT/timings.txt"
seconds_since "$DEMO_START" "total" | tee -a "$OUT/timings.txt"
echo
echo "decisions: $OUT/decide/decisions.json; submissions: $OUT/submission_2025.zip, $OUT/submission_2026.zip; scores:"
echo "$OUT/scores_2025.json, $OUT/scores_2026.json (all 48 labels of the held-out truth; labels the demo models do not"
echo "predict are submitted empty); ablation: $OUT/report/report.md"
