#!/usr/bin/env bash
# Shared by demo.sh and test.sh: create the virtual environment if missing and install cellseg into it.
#   source scripts/_setup.sh [EXTRAS]      e.g. EXTRAS=dev
# Environment knobs:
#   PYTHON=python3.11          interpreter used to create the venv (>= 3.11)
#   CELLSEG_VENV=.venv         where the venv lives
#   CELLSEG_CONSTRAINTS=none   skip constraints.txt (keep a site/CUDA torch you installed yourself)
set -euo pipefail
CELLSEG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CELLSEG_VENV:-$CELLSEG_ROOT/.venv}"
EXTRAS="${1:-}"
PY="${PYTHON:-python3}"

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "cellseg needs Python >= 3.11; '$PY' is $("$PY" --version 2>&1). Set PYTHON=/path/to/python3.11." >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi

constraints=(-c "$CELLSEG_ROOT/constraints.txt")
[ "${CELLSEG_CONSTRAINTS:-}" = "none" ] && constraints=()
spec="."; [ -n "$EXTRAS" ] && spec=".[$EXTRAS]"
# Re-install only when the dependency declarations changed (a stamp of their hash), so reruns are instant.
stamp="$VENV/.cellseg-install-$(cat "$CELLSEG_ROOT/pyproject.toml" "$CELLSEG_ROOT/constraints.txt" \
  | { sha256sum 2>/dev/null || shasum -a 256; } | cut -c1-16)-${EXTRAS:-base}"
if [ ! -f "$stamp" ]; then
  echo "==> installing cellseg$([ -n "$EXTRAS" ] && echo "[$EXTRAS]") into $VENV (first run downloads PyTorch: a few minutes)"
  start=$(date +%s)
  (cd "$CELLSEG_ROOT" && "$VENV/bin/python" -m pip install --disable-pip-version-check -q -e "$spec" "${constraints[@]}")
  echo "==> installed in $(( $(date +%s) - start )) s; venv size $(du -sh "$VENV" | cut -f1)"
  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
