#!/usr/bin/env bash
# Set up the environment with the dev extras (pytest, ruff, nbmake, hypothesis) and run the test suite.
#   bash scripts/test.sh [PYTEST_ARGS...]     e.g. bash scripts/test.sh -k arrays -x
# GPU tests (marked `gpu`) skip themselves without CUDA; `slow` tests are deselected unless `-m slow`.
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
echo "==> test suite finished in $(( $(date +%s) - start )) s"
