#!/usr/bin/env bash
# Tokens per second of `megatrain data prepare --tokenizer hf` against Hugging Face's tokenizers
# (encode_batch, Rust, rayon threads) on the same cores and the same documents.
# Usage: bench/tokenizer_throughput.sh [BUILD_DIR] [WORKERS] [MEGABYTES]
#   Needs the tokenizers package: the interop environment BUILD_DIR/interop-venv (scripts/python-env.sh makes it)
#   or $TOKENIZERS_VENV; exits 77 without it.
# The corpus: the paragraphs of /usr/share/doc/*/copyright (English prose, licences, names) plus the generated
# multilingual corpus of tests/interop, as JSON lines, MEGABYTES in all. The tokenizer: GPT-2-style byte-level
# BPE with a 16000-token vocabulary trained on that corpus here. megatrain's time is the whole command (reading
# JSON lines, tokenizing, writing .bin/.idx); tokenizers' is encode_batch alone, on texts already in memory.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
WORKERS=${2:-$(nproc)}
MB=${3:-32}
VENV=${TOKENIZERS_VENV:-$BUILD/interop-venv}
PY=$VENV/bin/python
if ! "$PY" -c "import tokenizers" 2>/dev/null; then
  echo "SKIP: no Python with the tokenizers package at $VENV (scripts/python-env.sh $BUILD makes it)"
  exit 77
fi
WORK=$(mktemp -d /tmp/megatrain-tokbench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

"$PY" - "$SRC/tests/interop" "$WORK" "$MB" <<'PY'
import glob, json, os, sys
sys.path.insert(0, sys.argv[1])
import tokenizer_corpus
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
work, limit = sys.argv[2], int(sys.argv[3]) << 20
docs = []
for path in sorted(glob.glob("/usr/share/doc/*/copyright")):
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        continue
    docs += [p for p in text.split("\n\n") if p.strip()]
docs += [tokenizer_corpus.as_python_text(d) for d in tokenizer_corpus.documents(5, 3000)]
base, size, out = list(docs), 0, []
while size < limit:  # repeat the material up to the size asked for
    for d in base:
        out.append(d)
        size += len(d.encode())
        if size >= limit:
            break
with open(os.path.join(work, "corpus.jsonl"), "w") as f:
    for d in out:
        f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=16000, special_tokens=["<|endoftext|>"],
                        show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(os.path.join(work, "tokenizer.json"))
print(f"corpus: {len(out)} documents, {size / 2**20:.1f} MiB; tokenizer: vocab {tok.get_vocab_size()}")
PY

start=$(date +%s.%N)
"$BUILD/megatrain" data prepare --input "$WORK/corpus.jsonl" --output "$WORK/out" --tokenizer hf \
  --tokenizer-file "$WORK/tokenizer.json" --workers "$WORKERS" | tee "$WORK/prepare.log"
end=$(date +%s.%N)
tokens=$(sed -E 's/.* ([0-9]+) tokens .*/\1/' "$WORK/prepare.log")

RAYON_NUM_THREADS=$WORKERS TOKENIZERS_PARALLELISM=true "$PY" - "$WORK" "$tokens" "$start" "$end" "$WORKERS" <<'PY'
import json, os, sys, time
from tokenizers import Tokenizer
work, tokens, start, end, workers = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
texts = [json.loads(l)["text"] for l in open(os.path.join(work, "corpus.jsonl"), encoding="utf-8")]
tok = Tokenizer.from_file(os.path.join(work, "tokenizer.json"))
t0 = time.perf_counter()
enc = tok.encode_batch(texts, add_special_tokens=False)
t1 = time.perf_counter()
theirs = sum(len(e.ids) for e in enc) + len(texts)  # + one end-of-document id each, as megatrain counts
assert theirs == tokens, f"token counts differ: megatrain {tokens}, tokenizers {theirs}"
ours_s, theirs_s = end - start, t1 - t0
print(f"workers/threads: {workers} on {os.cpu_count()} cores")
print(f"megatrain data prepare: {tokens / ours_s / 1e6:.2f} M tokens/s ({ours_s:.2f} s, whole command)")
print(f"tokenizers encode_batch: {theirs / theirs_s / 1e6:.2f} M tokens/s ({theirs_s:.2f} s, encoding only)")
print(f"ratio megatrain / tokenizers: {theirs_s / ours_s:.2f}")
PY
