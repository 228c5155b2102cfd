#!/usr/bin/env bash
# `ckpt export --format hf` of a checkpoint trained on SentencePiece-tokenized data writes a tokenizer.json
# (core/hf/hf_spm_tokenizer.h) that transformers' AutoTokenizer encodes as sentencepiece does: for the
# BPE and unigram fixtures of tests/data/tokenizer, data prepare the generated corpus (tokenizer_corpus.py:
# many scripts, emoji, whitespace runs, control characters, invalid UTF-8), train two iterations, export, and
# compare AutoTokenizer.encode(doc, add_special_tokens=False) with sentencepiece's encode(doc) and with the
# prepared ids, document by document, and the decoding of those ids (tests/interop/check_spm_export.py).
# BPE must match exactly; unigram documents that differ only by a float32-vs-float64 tie are counted apart.
# pipeline("text-generation") on each export continues a prompt with text.
# Needs the interop Python (sentencepiece, tokenizers, transformers, torch: scripts/python-env.sh); exits 77 without.
source "$(dirname "$0")/lib/common.bash"
require_interop_python sentencepiece tokenizers transformers torch
"$MT" data prepare --help | grep -q "this build has no SentencePiece" && { echo "SKIP: megatrain built without SentencePiece"; exit 77; }
T="$SRC/tests/data/tokenizer"
DOCS=${SPM_EXPORT_DOCS:-2000}

python3 - "$SRC/tests/interop" "$DOCS" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import tokenizer_corpus
tokenizer_corpus.write_jsonl("corpus.jsonl", tokenizer_corpus.documents(99, int(sys.argv[2])))
PY
write_config
mkdir -p data
for kind in bpe unigram; do
  model="$T/spm-$kind.model"
  "$MT" data prepare --input corpus.jsonl --output "data/$kind" --tokenizer sentencepiece --tokenizer-model "$model" \
    --workers 2 >/dev/null
  rm -rf ckpt hf run
  "$MT" --config tiny.yaml --set training.train_iters=2 --set optimizer.warmup_iters=1 --set checkpoint.save_dir=ckpt \
        --set "data.train=[data/$kind]" --set model.vocab_size=auto >/dev/null
  "$MT" ckpt export ckpt --format hf --output hf >/dev/null
  for f in tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json; do
    [ -f "hf/$f" ] || fail "$kind: the export has no $f"
  done
  cmp -s "$model" hf/tokenizer.model || fail "$kind: tokenizer.model is not the training model"
  eod=$(sed -n 's/^eod: *//p' "data/$kind.tokenizer.yaml")
  exact=(); [ $kind = bpe ] && exact=(--exact)
  "$PY" "$SRC/tests/interop/check_spm_export.py" hf "$model" "data/$kind" "$eod" --docs "$DOCS" \
    "${exact[@]}" || fail "$kind: the exported tokenizer disagrees with sentencepiece"

  check_text_generation "$PY" "spm-$kind" || fail "$kind: pipeline(\"text-generation\") on the export failed"
done
echo "ok"
