#!/usr/bin/env bash
# The main job, from a fresh machine: set up the environment, generate the synthetic CellMap-layout
# dataset, and describe it. (Training, prediction, ensembling and scoring join this script as they land.)
#   bash scripts/demo.sh [OUT_DIR]          default OUT_DIR=demo_out
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh"
OUT="${1:-$CELLSEG_ROOT/demo_out}"
DATA="$OUT/data"

if [ ! -f "$DATA/train_crop_manifest.csv" ]; then
  echo "==> generating the synthetic dataset (preset small) in $DATA"
  cellseg synth --out "$DATA" --preset small --seed 0
fi
echo "==> cellseg info $DATA"
cellseg info "$DATA"
