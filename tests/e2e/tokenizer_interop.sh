#!/usr/bin/env bash
# `data prepare --tokenizer gpt2|hf` gives exactly the ids of Hugging Face's tokenizers on every document of a
# generated corpus (many scripts, emoji, whitespace and control characters, invalid UTF-8, long words), for the
# committed fixture tokenizers and a larger one trained here; --workers 1 and 3 write identical files.
# Needs the `tokenizers` package in a venv: $TOKENIZERS_VENV, or build/tokenizer-venv beside the binary
#   python3 -m venv build/tokenizer-venv && build/tokenizer-venv/bin/pip install tokenizers
# and exits 77 (skipped) without it.
source "$(dirname "$0")/lib/common.bash"
VENV=${TOKENIZERS_VENV:-$(dirname "$MT")/tokenizer-venv}
if ! "$VENV/bin/python" -c "import tokenizers" 2>/dev/null; then
  echo "SKIP: no Python with the tokenizers package at $VENV (set TOKENIZERS_VENV or create build/tokenizer-venv)"
  exit 77
fi
"$VENV/bin/python" "$SRC/tests/interop/check_tokenizer.py" "$MT" "$SRC/tests/data/tokenizer" check \
  --docs 1500 --vocab 2000 --workers 2 | tee check.log
grep -q "^total: .* 0 mismatches$" check.log || fail "megatrain and tokenizers disagree"

T="$SRC/tests/data/tokenizer"
for w in 1 3; do
  "$MT" data prepare --input check/corpus.jsonl --output w$w --tokenizer hf --tokenizer-file "$T/llama3-tokenizer.json" \
        --workers $w >/dev/null
done
cmp w1.bin w3.bin && cmp w1.idx w3.idx || fail "--workers 3 wrote other bytes than --workers 1"
expect_error "not supported" data prepare --input check/corpus.jsonl --output x --tokenizer hf \
  --tokenizer-file <(sed 's/"type": "ByteLevel"/"type": "Metaspace"/' "$T/gpt2-tokenizer.json")
expect_error "merge-file" data prepare --input check/corpus.jsonl --output x --tokenizer gpt2 --vocab-file "$T/gpt2-vocab.json"
echo "ok"
