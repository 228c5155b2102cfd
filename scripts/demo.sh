#!/usr/bin/env bash
# The demo: installs what is missing, builds, prepares a small real-text dataset (the licence texts every
# Debian system has, plus this project's docs) and trains configs/gpt-tiny.yaml on the CPU, then saves a
# checkpoint and evaluates it. Extra args go to `megatrain` (e.g. --set training.train_iters=100).
set -euo pipefail
cd "$(dirname "$0")/.."
# gpt-tiny's GEMMs are small: one BLAS thread runs them faster than several fighting over 2 cores.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
scripts/install-deps.sh
scripts/build.sh
mkdir -p data/demo
mapfile -t inputs < <(find /usr/share/common-licenses -type f | sort; ls README.md)
build/megatrain data prepare --input "${inputs[@]}" --output data/demo/licenses_text_document --tokenizer byte --overwrite
build/megatrain data inspect data/demo/licenses_text_document
rm -rf runs/gpt-tiny
build/megatrain --config configs/gpt-tiny.yaml "$@"
build/megatrain eval --checkpoint runs/gpt-tiny/checkpoints --data data/demo/licenses_text_document --samples 64
python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("runs/gpt-tiny/metrics.jsonl") if '"loss"' in l]
first, last = rows[0]["loss"], rows[-1]["loss"]
print(f"demo: loss {first:.3f} at iteration {rows[0]['iteration']} -> {last:.3f} at iteration "
      f"{rows[-1]['iteration']} ({100 * (1 - last / first):.1f}% lower)")
PY
