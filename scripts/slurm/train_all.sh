#!/usr/bin/env bash
# Submit the eight architectures, one job each, with the seed's GPU counts (2 for 2D, 4 for 3D).
#
#   bash scripts/slurm/train_all.sh data.root=/data/cellmap [more key=value overrides for every job]
#
# Extra sbatch options (partition, account, time) go in SBATCH_* environment variables, e.g.
#   SBATCH_PARTITION=gpu SBATCH_ACCOUNT=lab bash scripts/slurm/train_all.sh data.root=/data/cellmap
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
mkdir -p "$ROOT/logs"
for name in unet_2d unet_3d resnet_2d resnet_3d swin_2d swin_3d vit_2d vit_3d; do
  case "$name" in *_2d) gpus=2 ;; *) gpus=4 ;; esac
  sbatch --job-name "cellseg-$name" --gpus-per-node "$gpus" --chdir "$ROOT" \
    "$HERE/train_one.sbatch" "configs/experiments/$name.yaml" "$@"
done
