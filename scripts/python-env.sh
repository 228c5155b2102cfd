#!/usr/bin/env bash
# The interop tests' Python: a virtual environment at BUILD_DIR/interop-venv (default build/) with exactly the
# packages tests/interop/requirements.txt pins (torch, transformers, tokenizers, sentencepiece, peft,
# megatron-core, tensorboard, matplotlib and what they need). scripts/test.sh runs it before ctest; the tests
# find the environment beside the binary (tests/e2e/lib/common.bash: require_interop_python), so no path of a
# particular machine is involved. Reused as it is while its stamp matches the requirements (and the
# SentencePiece library's version); made anew otherwise. megatrain itself never needs Python.
#   scripts/python-env.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
venv=$build/interop-venv
req=tests/interop/requirements.txt

# Python sentencepiece must be the version of the libsentencepiece megatrain links (unigram segmentation
# differs between versions): Debian 12's is the pinned one; another system's library version wins.
spm=$(pkg-config --modversion sentencepiece 2>/dev/null || true)
stamp="$(sha256sum "$req" | cut -d' ' -f1) sentencepiece=${spm:-none} $(python3 --version 2>&1)"
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.megatrain-stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "python-env: $venv is up to date"
  exit 0
fi

start=$(date +%s)
echo "python-env: making $venv from $req (torch and transformers: a few GB, a few minutes)"
rm -rf "$venv"
python3 -m venv "$venv"
log=$build/interop-venv.log
pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input)
if ! { "${pip[@]}" install -q -r "$req" &&
       if [ -n "$spm" ] && [ "$("$venv/bin/python" -c 'import sentencepiece; print(sentencepiece.__version__)')" != "$spm" ]; then
         "${pip[@]}" install -q "sentencepiece==$spm"
       fi; } >"$log" 2>&1; then
  tail -20 "$log" >&2
  echo "python-env: could not install $req into $venv (log: $log)" >&2
  exit 1
fi
echo "$stamp" >"$venv/.megatrain-stamp"
echo "python-env: $venv ready in $(($(date +%s) - start)) s ($(du -sh "$venv" | cut -f1))"
