#!/usr/bin/env bash
# nnU-Net v2 beside cellseg on the quality benchmark's data (bench/peers/nnunet, docs/quality.md "Against nnU-Net"),
# as steps that each fit a 10-minute job; WORK (default /tmp/peer) keeps everything between them, OUT gets the
# result files (scores.md, scores.json, the step records).
#   OUT=OUT bash bench/gpu/nnunet_peer.sh data           # the `quality` data root and its nnU-Net raw dataset
#   OUT=OUT bash bench/gpu/nnunet_peer.sh nnunet 6       # plan, preprocess, train 6 minutes (alone on the GPU);
#                                                        # exit 75: stopped at the job's limit (STEP_LIMIT_MIN,
#                                                        # default 9.5) with a checkpoint: run it again to resume
#   OUT=OUT bash bench/gpu/nnunet_peer.sh predict        # nnU-Net's predictor on the tuning and test crops
#   OUT=OUT bash bench/gpu/nnunet_peer.sh cellseg 6      # configs/quality/unet_3d.yaml for 6 minutes, predicted
#                                                        # (exit 75 as above: run it again to resume)
#   OUT=OUT bash bench/gpu/nnunet_peer.sh score [NAME..]  # nnU-Net and the arms named (default: every arm in
#                                                        # WORK/stores), both decodings, every era
# Wheels the GPU image lacks: cellseg's in .whl (scripts/offline_wheels.sh --only ...), nnU-Net's in .nnw and .nnw2
# (scripts/offline_wheels.sh --peer nnunet; SimpleITK alone in .nnw2 keeps each folder small), installed once into
# /tmp/site (cellseg's) and /tmp/nnsite (nnU-Net's own environment, ahead of the image's packages when nnU-Net runs).
set -uo pipefail
STEP="${1:?usage: bash bench/gpu/nnunet_peer.sh data|nnunet MIN|predict|cellseg MIN|score}"; shift
OUT="${OUT:-bench_out}"; WORK="${WORK:-/tmp/peer}"
export CELLSEG_CACHE="${CELLSEG_CACHE:-/tmp/cellseg_cache}" PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
install() {  # install() FOLDER TARGET: the wheels of FOLDER into TARGET, once
  [ -d "$1" ] || return 0
  [ -f "$2/.$1.installed" ] && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$2" "$1"/*.whl \
    && touch "$2/.$1.installed" || exit 1
}
install .whl /tmp/site; install .nnw /tmp/nnsite; install .nnw2 /tmp/nnsite
export PYTHONPATH="$PYTHONPATH:/tmp/site"
mkdir -p "$OUT" "$WORK"
# every step gets the same cores (CORES, default all) and data workers (the cores less one), recorded
peer=(python3 -m bench.peers.nnunet --out "$WORK" --env /tmp/nnsite --processes "$(nproc)" --quiet
      --cores "${CORES:-$(nproc)}")
case "$STEP" in
  data)
    [ -f "$WORK/data/datasplit.csv" ] || python3 -m cellseg synth --out "$WORK/data" --preset quality --workers "$(nproc)"
    "${peer[@]}" data --root "$WORK/data" "$@" ;;
  nnunet) "${peer[@]}" train --budget-min "${1:?minutes}" --step-limit-min "${STEP_LIMIT_MIN:-9.5}" ;;
  predict) "${peer[@]}" predict ;;
  cellseg) "${peer[@]}" cellseg --budget-min "${1:?minutes}" --step-limit-min "${STEP_LIMIT_MIN:-9.5}" ;;
  score)  # the arms named (default: every arm with stores in WORK/stores), nnU-Net first
    names=("$@"); [ ${#names[@]} -gt 0 ] || names=($(ls -d "$WORK"/stores/*_test.zarr 2>/dev/null \
      | xargs -n1 basename | sed 's/_test\.zarr$//' | grep -v '^nnunet$'))
    arms=(); for n in "${names[@]}"; do arms+=(--arm "$n=$WORK/stores/${n}_test.zarr,$WORK/stores/${n}_tune.zarr"); done
    "${peer[@]}" score "${arms[@]}" ;;
  *) echo "unknown step $STEP" >&2; exit 2 ;;
esac
code=$?
cp "$WORK"/*.json "$OUT"/ 2>/dev/null; cp "$WORK"/scores/scores.md "$WORK"/scores/scores.json "$OUT"/ 2>/dev/null
tail -n 30 "$WORK"/logs/train.log > "$OUT/nnunet_train_tail.log" 2>/dev/null
exit "$code"
