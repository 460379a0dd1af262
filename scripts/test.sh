#!/usr/bin/env bash
# Set up the environment with the dev extras (pytest, ruff, nbmake, hypothesis) and run the test suite.
#   bash scripts/test.sh [PYTEST_ARGS...]     e.g. bash scripts/test.sh -k arrays -x
# GPU tests (marked `gpu`) skip themselves without CUDA; `slow` tests are deselected unless `-m slow`. Last, the
# nnU-Net peer's CPU quick mode runs end to end (CELLSEG_PEER_QUICK=0 skips it).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_setup.sh" dev
cd "$CELLSEG_ROOT"
echo "==> ruff check"
ruff check cellseg tests bench scripts notebooks
echo "==> pytest"
start=$(date +%s)
python -m pytest "$@"
echo "==> notebooks (nbmake: each runs top to bottom in a fresh kernel)"
python -m pytest --nbmake notebooks -p no:cacheprovider -q
if [ "${CELLSEG_PEER_QUICK:-1}" != 0 ]; then  # CELLSEG_PEER_QUICK=0 skips it (it downloads nnU-Net the first time)
  echo "==> the nnU-Net peer end to end on the CPU (bench/peers/nnunet --quick; nnU-Net in its own .venv-nnunet)"
  python -m bench.peers.nnunet env --env "$CELLSEG_ROOT/.venv-nnunet"
  peer_out="$(mktemp -d)/nnunet_peer"
  peer=(python -m bench.peers.nnunet --quick --quiet --processes 2 --env "$CELLSEG_ROOT/.venv-nnunet" --out "$peer_out")
  # first stopped after nnU-Net's first iteration, as a job's time limit stops it (exit 75), then resumed to the end
  code=0; "${peer[@]}" --step-limit-min 0 || code=$?
  [ "$code" = 75 ] || { echo "the peer's stopped training exited $code, not 75" >&2; exit 1; }
  "${peer[@]}"
  grep -q '"starts": 2' "$peer_out/nnunet_train.json" || { echo "the peer's training did not resume" >&2; exit 1; }
fi
echo "==> test suite finished in $(( $(date +%s) - start )) s"
