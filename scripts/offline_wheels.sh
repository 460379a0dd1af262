#!/usr/bin/env bash
# Download every wheel cellseg needs into one folder, for GPU nodes with no internet access.
#
#   bash scripts/offline_wheels.sh [--dest DIR] [--python 3.12] [--platform manylinux_2_28_x86_64 (default: every manylinux x86_64 tag)]
#                                  [--exclude 'torch,torchvision,triton,nvidia-*'] [--only 'monai,zarr'] [--peer nnunet]
#                                  [--extras view,export]
#
# On the cluster:   python -m pip install --no-index --find-links DIR cellseg
# or, for a source checkout:  python -m pip install --no-index --find-links DIR --no-deps -e .  (after the deps)
#
# It resolves the full dependency set for the *target* interpreter and platform (not this machine's) with
# `pip install --dry-run --report`, then downloads each pinned wheel. --exclude drops packages the cluster
# already provides (site CUDA torch, for example); patterns are shell globs. --only keeps just the listed
# packages (plus nothing else), handy for topping up an existing environment. --peer nnunet resolves nnU-Net v2's
# environment instead of cellseg's (bench/peers/nnunet: `python -m bench.peers.nnunet env --wheels DIR`), its one
# source-only dependency (acvl-utils) built into a wheel here. --extras adds optional dependency sets (view:
# neuroglancer for `cellseg view`; export: ONNX, ONNX Runtime and bioimageio.spec for `cellseg export`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/wheels"; PYVER="3.12"; EXCLUDE=""; ONLY=""; PEER=""; EXTRAS=""
# pip matches platform tags exactly: list every glibc 2.5 ... 2.39 manylinux tag.
PLATFORMS=(manylinux2014_x86_64 manylinux1_x86_64); for n in $(seq 39 -1 5); do PLATFORMS+=("manylinux_2_${n}_x86_64"); done
while [ $# -gt 0 ]; do
  case "$1" in
    --dest) DEST="$2"; shift 2 ;;
    --python) PYVER="$2"; shift 2 ;;
    --platform) PLATFORMS=("$2"); shift 2 ;;
    --exclude) EXCLUDE="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    --peer) PEER="$2"; shift 2 ;;
    --extras) EXTRAS="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python3}"
mkdir -p "$DEST"
target=(--python-version "$PYVER" --implementation cp --only-binary=:all:)
for p in "${PLATFORMS[@]}"; do target+=(--platform "$p"); done

report="$(mktemp)"; trap 'rm -f "$report"' EXIT
case "$PEER" in
  "")
    echo "==> resolving cellseg's dependencies for CPython $PYVER (${PLATFORMS[0]} ... ${PLATFORMS[-1]})"
    "$PY" -m pip install --quiet --dry-run --ignore-installed --report "$report" --target "$(mktemp -d)" \
      "${target[@]}" -c "$ROOT/constraints.txt" "$ROOT${EXTRAS:+[$EXTRAS]}" >/dev/null ;;
  nnunet)  # the version bench/peers/nnunet/env.py pins; acvl-utils ships only as source: built here (pure Python)
    requirement="$(sed -n 's/^VERSION = "\(.*\)"$/nnunetv2==\1/p' "$ROOT/bench/peers/nnunet/env.py")"
    echo "==> resolving $requirement for CPython $PYVER (${PLATFORMS[0]} ... ${PLATFORMS[-1]})"
    "$PY" -m pip wheel --quiet --no-deps -w "$DEST" "acvl-utils>=0.2.6,<0.3"
    "$PY" -m pip install --quiet --dry-run --ignore-installed --report "$report" --target "$(mktemp -d)" \
      "${target[@]}" --find-links "$DEST" "$requirement" >/dev/null ;;
  *) echo "unknown --peer $PEER (known: nnunet)" >&2; exit 2 ;;
esac

# name==version for everything resolved except cellseg itself, filtered by --only / --exclude.
mapfile -t pins < <("$PY" - "$report" "$EXCLUDE" "$ONLY" <<'PY'
import fnmatch, json, sys
report, exclude, only = sys.argv[1], sys.argv[2], sys.argv[3]
ALIASES = {"cc3d": "connected-components-3d"}  # import name -> distribution name
norm = lambda s: ALIASES.get(s.lower().replace("_", "-"), s.lower().replace("_", "-"))
ex = [norm(p) for p in exclude.split(",") if p]
keep = {norm(p) for p in only.split(",") if p}
for item in json.load(open(report))["install"]:
    meta = item["metadata"]; name = norm(meta["name"])
    if name == "cellseg" or any(fnmatch.fnmatch(name, p) for p in ex) or (keep and name not in keep):
        continue
    print(f"{meta['name']}=={meta['version']}")
PY
)
echo "==> downloading ${#pins[@]} wheels into $DEST"
"$PY" -m pip download --quiet --no-deps "${target[@]}" --find-links "$DEST" -d "$DEST" "${pins[@]}"
if [ -z "$ONLY" ] && [ -z "$PEER" ]; then  # --only tops up an environment: the listed packages alone
  echo "==> building the cellseg wheel"
  "$PY" -m pip wheel --quiet --no-deps -w "$DEST" "$ROOT"
fi
echo "==> done: $(ls "$DEST" | wc -l) files, $(du -sh "$DEST" | cut -f1) in $DEST"
