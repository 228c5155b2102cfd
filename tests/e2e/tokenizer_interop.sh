#!/usr/bin/env bash
# `data prepare --tokenizer gpt2|hf` gives exactly the ids of Hugging Face's tokenizers on every document of a
# generated corpus (many scripts, emoji, whitespace and control characters, invalid UTF-8, long words), for the
# committed fixture tokenizers and a larger one trained here (byte-level: GPT-2, Llama-3 with and without its
# BOS post-processor, with the normalizers NFKC + Lowercase and NFD + Replace(Regex) + Strip; SentencePiece-style:
# Llama-2's legacy normalizer, Metaspace variants, unk without byte fallback); --workers 1 and 3 write identical
# files.
# `--tokenizer sentencepiece` gives exactly the Python sentencepiece package's ids on the same corpus, for the
# committed BPE and unigram models and two larger ones trained here.
# Needs the interop Python (tokenizers, sentencepiece: scripts/python-env.sh installs the sentencepiece of the
# libsentencepiece megatrain links, `pkg-config --modversion sentencepiece`: unigram segmentation differs between
# versions); exits 77 (skipped) without it.
source "$(dirname "$0")/lib/common.bash"
require_interop_python tokenizers sentencepiece
T="$SRC/tests/data/tokenizer"

"$PY" "$SRC/tests/interop/check_tokenizer.py" "$MT" "$T" check --docs 1500 --vocab 2000 --workers 2 | tee check.log
grep -q "^total: .* 0 mismatches$" check.log || fail "megatrain and tokenizers disagree"
for w in 1 3; do
  "$MT" data prepare --input check/corpus.jsonl --output w$w --tokenizer hf --tokenizer-file "$T/llama3-tokenizer.json" \
        --workers $w >/dev/null
done
cmp w1.bin w3.bin && cmp w1.idx w3.idx || fail "--workers 3 wrote other bytes than --workers 1"
expect_error "not supported" data prepare --input check/corpus.jsonl --output x --tokenizer hf \
  --tokenizer-file <(sed 's/"type": "ByteLevel"/"type": "Whitespace"/' "$T/gpt2-tokenizer.json")
expect_error "merge-file" data prepare --input check/corpus.jsonl --output x --tokenizer gpt2 --vocab-file "$T/gpt2-vocab.json"

lib_version=$(pkg-config --modversion sentencepiece 2>/dev/null || true)
py_version=$("$PY" -c "import sentencepiece; print(sentencepiece.__version__)")
if "$MT" data prepare --help | grep -q "no SentencePiece"; then
  skip_part "sentencepiece: megatrain was built without SentencePiece (libsentencepiece-dev)"
else
  [ -z "$lib_version" ] || [ "$lib_version" = "$py_version" ] ||
    fail "Python sentencepiece $py_version, megatrain links libsentencepiece $lib_version (scripts/python-env.sh installs the library's version)"
  "$PY" "$SRC/tests/interop/check_sentencepiece.py" "$MT" "$T" spm --docs 1500 --vocab 1000 --workers 2 | tee spm.log
  grep -q "^total: .* 0 mismatches$" spm.log || fail "megatrain and sentencepiece disagree"
  for w in 1 3; do
    "$MT" data prepare --input spm/spm-corpus.jsonl --output s$w --tokenizer sentencepiece \
          --tokenizer-model "$T/spm-bpe.model" --workers $w >/dev/null
  done
  cmp s1.bin s3.bin && cmp s1.idx s3.idx || fail "sentencepiece: --workers 3 wrote other bytes than --workers 1"
  expect_error "no end-of-sentence piece" data prepare --input spm/spm-corpus.jsonl --output x \
    --tokenizer sentencepiece --tokenizer-model "$T/spm-noeos.model"
fi
echo "ok"
