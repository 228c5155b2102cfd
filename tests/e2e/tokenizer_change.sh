#!/usr/bin/env bash
# A run trains on the ids of one tokenizer (issue 30, item 6): resuming a checkpoint on data of another tokenizer
# (byte data on a GPT-2 BPE checkpoint, or a vocab.json of the same size with two tokens trading ids), or blending
# datasets of different tokenizers, is refused naming both tokenizer records and what differs, and leaves the
# checkpoint as it was; data.allow_tokenizer_change: true trains on anyway, and the next checkpoint records the
# new tokenizer.
source "$(dirname "$0")/lib/common.bash"
T="$SRC/tests/data/tokenizer"
python3 - "$T/gpt2-vocab.json" <<'PY'
import json, sys
with open("corpus.jsonl", "w") as f:
    for i in range(200):
        f.write(json.dumps({"text": f"document {i}: the quick brown fox jumps over the lazy dog, {i * 7} times."}) + "\n")
vocab = json.load(open(sys.argv[1]))
vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
json.dump(vocab, open("permuted-vocab.json", "w"))
PY
mkdir -p data
"$MT" data prepare --input corpus.jsonl --output data/byte --tokenizer byte >/dev/null
"$MT" data prepare --input corpus.jsonl --output data/gpt2 --tokenizer gpt2 \
      --vocab-file "$T/gpt2-vocab.json" --merge-file "$T/gpt2-merges.txt" >/dev/null
"$MT" data prepare --input corpus.jsonl --output data/perm --tokenizer gpt2 \
      --vocab-file permuted-vocab.json --merge-file "$T/gpt2-merges.txt" >/dev/null
grep -q '^vocab_hash: "crc32c:[0-9a-f]\{8\}"$' data/gpt2.tokenizer.yaml || fail "the sidecar has no vocab_hash"
write_config
run=(--config tiny.yaml --set model.vocab_size=512 --set optimizer.warmup_iters=1 --set checkpoint.save_dir=ckpt)
"$MT" "${run[@]}" --set training.train_iters=2 --set 'data.train=[data/gpt2]' >first.log 2>&1 ||
  { cat first.log; fail "the first run failed"; }
cmp -s ckpt/iter_0000002/tokenizer.yaml data/gpt2.tokenizer.yaml || fail "the checkpoint does not record gpt2"

expect_error "the checkpoint (ckpt/iter_0000002/tokenizer.yaml) and data.train's first dataset (data/byte.tokenizer.yaml) record different tokenizers (kind: gpt2 vs byte; vocab_size: 400 vs 257;" \
  "${run[@]}" --set training.train_iters=4 --set 'data.train=[data/byte]'
expect_error "(vocab_hash: crc32c:[0-9a-f]* vs crc32c:[0-9a-f]*): the same id would mean different tokens" \
  "${run[@]}" --set training.train_iters=4 --set 'data.train=[data/perm]'
[ "$(cat ckpt/latest)" = iter_0000002 ] && [ ! -e ckpt/iter_0000004 ] || fail "a refused resume changed the checkpoints"
expect_error "data.train\[1\] (data/gpt2.tokenizer.yaml) and data.train\[3\] (data/byte.tokenizer.yaml) record different" \
  --config tiny.yaml --set model.vocab_size=512 --set 'data.train=[0.5, data/gpt2, 0.5, data/byte]'
expect_error "data.train\[0\] (data/gpt2.tokenizer.yaml) and data.valid\[0\] (data/perm.tokenizer.yaml)" \
  --config tiny.yaml --set model.vocab_size=512 --set 'data.train=[data/gpt2]' --set 'data.valid=[data/perm]'

# Meant: the run goes on, says so, and its checkpoint records the data's tokenizer.
"$MT" "${run[@]}" --set training.train_iters=4 --set 'data.train=[data/byte]' --set data.allow_tokenizer_change=true \
  >allowed.log 2>&1 || { cat allowed.log; fail "data.allow_tokenizer_change: true did not train on"; }
grep -q "resumed from ckpt/iter_0000002" allowed.log || fail "the allowed run did not resume"
grep -q "record different tokenizers.*training on anyway, as data.allow_tokenizer_change is true" allowed.log ||
  fail "the allowed change is not logged"
cmp -s ckpt/iter_0000004/tokenizer.yaml data/byte.tokenizer.yaml || fail "the new checkpoint does not record byte"
echo "ok"
