#!/usr/bin/env bash
# `data prepare --tokenizer gpt2|hf` gives exactly the ids of Hugging Face's tokenizers on every document of a
# generated corpus (many scripts, emoji, whitespace and control characters, invalid UTF-8, long words), for the
# committed fixture tokenizers and a larger one trained here (byte-level: GPT-2, Llama-3 with and without its
# BOS post-processor, with the normalizers NFKC + Lowercase and NFD + Replace(Regex) + Strip; SentencePiece-style:
# Llama-2's legacy normalizer, Metaspace variants, unk without byte fallback); --workers 1 and 3 write identical
# files.
# `--tokenizer sentencepiece` gives exactly the Python sentencepiece package's ids on the same corpus, for the
# committed BPE and unigram models and two larger ones trained here.
# Needs the `tokenizers` and `sentencepiece` packages in a venv: $TOKENIZERS_VENV, or build/tokenizer-venv
#   python3 -m venv build/tokenizer-venv && build/tokenizer-venv/bin/pip install tokenizers sentencepiece==V
# (V: the version of libsentencepiece megatrain links, `pkg-config --modversion sentencepiece`: unigram
# segmentation differs between versions). A part whose package is missing is skipped, saying so; exits 77
# (skipped) when both are.
source "$(dirname "$0")/lib/common.bash"
VENV=${TOKENIZERS_VENV:-$(dirname "$MT")/tokenizer-venv}
T="$SRC/tests/data/tokenizer"
ran=0

if "$VENV/bin/python" -c "import tokenizers" 2>/dev/null; then
  "$VENV/bin/python" "$SRC/tests/interop/check_tokenizer.py" "$MT" "$T" check \
    --docs 1500 --vocab 2000 --workers 2 | tee check.log
  grep -q "^total: .* 0 mismatches$" check.log || fail "megatrain and tokenizers disagree"

  for w in 1 3; do
    "$MT" data prepare --input check/corpus.jsonl --output w$w --tokenizer hf --tokenizer-file "$T/llama3-tokenizer.json" \
          --workers $w >/dev/null
  done
  cmp w1.bin w3.bin && cmp w1.idx w3.idx || fail "--workers 3 wrote other bytes than --workers 1"
  expect_error "not supported" data prepare --input check/corpus.jsonl --output x --tokenizer hf \
    --tokenizer-file <(sed 's/"type": "ByteLevel"/"type": "Whitespace"/' "$T/gpt2-tokenizer.json")
  expect_error "merge-file" data prepare --input check/corpus.jsonl --output x --tokenizer gpt2 --vocab-file "$T/gpt2-vocab.json"
  ran=1
else
  echo "SKIP (tokenizers part): no Python with the tokenizers package at $VENV (set TOKENIZERS_VENV or create build/tokenizer-venv)"
fi

lib_version=$(pkg-config --modversion sentencepiece 2>/dev/null || true)
py_version=$("$VENV/bin/python" -c "import sentencepiece; print(sentencepiece.__version__)" 2>/dev/null || true)
if "$MT" data prepare --help | grep -q "no SentencePiece"; then
  echo "SKIP (sentencepiece part): megatrain was built without SentencePiece"
elif [ -z "$py_version" ]; then
  echo "SKIP (sentencepiece part): no Python with the sentencepiece package at $VENV"
elif [ -n "$lib_version" ] && [ "$lib_version" != "$py_version" ]; then
  echo "SKIP (sentencepiece part): Python sentencepiece $py_version, megatrain links libsentencepiece $lib_version;" \
       "install sentencepiece==$lib_version in $VENV"
else
  "$VENV/bin/python" "$SRC/tests/interop/check_sentencepiece.py" "$MT" "$T" spm --docs 1500 --vocab 1000 --workers 2 |
    tee spm.log
  grep -q "^total: .* 0 mismatches$" spm.log || fail "megatrain and sentencepiece disagree"
  for w in 1 3; do
    "$MT" data prepare --input spm/spm-corpus.jsonl --output s$w --tokenizer sentencepiece \
          --tokenizer-model "$T/spm-bpe.model" --workers $w >/dev/null
  done
  cmp s1.bin s3.bin && cmp s1.idx s3.idx || fail "sentencepiece: --workers 3 wrote other bytes than --workers 1"
  expect_error "no end-of-sentence piece" data prepare --input spm/spm-corpus.jsonl --output x \
    --tokenizer sentencepiece --tokenizer-model "$T/spm-noeos.model"
  ran=1
fi
[ "$ran" = 1 ] || exit 77
echo "ok"
