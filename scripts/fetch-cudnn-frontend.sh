#!/usr/bin/env bash
# fetch-cudnn-frontend.sh: puts NVIDIA's header-only cuDNN frontend (cudnn_frontend.h, the graph API that the
# fused attention in core/cuda/attention_cudnn.cpp is written against) into .deps/cudnn-frontend/include, where
# CMake looks for it (CUDNN_FRONTEND_INCLUDE_DIR). The headers come from PyPI's nvidia-cudnn-frontend wheel,
# fetched with pip (no vendored copy in the repository); only its include/ folder is kept. Does nothing when the
# pinned version is already there. The wheel's tags are fixed (any host Python works: only headers are used).
#
# Usage: scripts/fetch-cudnn-frontend.sh [--force]     Env: PYTHON (default python3), DEPS_DIR (default .deps)
set -euo pipefail

VERSION=1.32.0   # compiles with g++ 12 / nvcc 13 in C++20 against the cuDNN 9.19 headers (checked by hand)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS_DIR=${DEPS_DIR:-$ROOT/.deps}
DEST=$DEPS_DIR/cudnn-frontend
PYTHON=${PYTHON:-python3}

die() { echo "fetch-cudnn-frontend: error: $*" >&2; exit 1; }

have=$(cat "$DEST/VERSION" 2>/dev/null || true)
if [[ ${1:-} != --force && -f $DEST/include/cudnn_frontend.h && $have == "$VERSION" ]]; then
  echo "cudnn-frontend $VERSION: already in $DEST"
  exit 0
fi
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip (apt-get install python3-pip, or set PYTHON)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "cudnn-frontend $VERSION: downloading the wheel from PyPI"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --dest "$tmp" "nvidia-cudnn-frontend==$VERSION" ||
  die "pip download nvidia-cudnn-frontend==$VERSION failed"
wheel=$(find "$tmp" -maxdepth 1 -name 'nvidia_cudnn_frontend-*.whl' -print -quit)
[[ -n $wheel ]] || die "pip saved no nvidia_cudnn_frontend wheel in $tmp"

# A wheel is a zip: keep its include/ folder only (the rest is the Python module).
"$PYTHON" - "$wheel" "$tmp/x" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("include/") and not n.endswith("/")]
    if not any(n == "include/cudnn_frontend.h" for n in names):
        sys.exit(f"{wheel} has no include/cudnn_frontend.h")
    for n in names:
        z.extract(n, out)
PY
rm -rf "$DEST"
mkdir -p "$DEST"
mv "$tmp/x/include" "$DEST/include"
echo "$VERSION" >"$DEST/VERSION"
echo "cudnn-frontend $VERSION: headers in $DEST/include"
