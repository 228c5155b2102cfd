#!/usr/bin/env bash
# Bad input of every kind: one clear message naming what and where, a non-zero exit, no crash, nothing lost.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config

# Config problems.
printf 'model: {num_layers: 2\n  hidden_size: [\n' > broken.yaml
expect_error "broken.yaml" --config broken.yaml
expect_error "no_such.yaml" --config no_such.yaml
expect_error "did you mean model.hidden_size" --config tiny.yaml --set model.hiden_size=32
expect_error "model.num_layers" --config tiny.yaml --set model.num_layers=two
expect_error "model.num_heads" --config tiny.yaml --set model.num_heads=5
expect_error "training.precision" --config tiny.yaml --set training.precision=fp8
expect_error "training.device: expected one of auto, cuda, cpu" --config tiny.yaml --set training.device=gpu
expect_error "parallel.backend: nccl needs training.device: cuda" --config tiny.yaml --set parallel.backend=nccl

# Device problems: asking for a GPU where none can be used names the key and the reason.
if ! "$MT" info --require-gpu >/dev/null 2>&1; then
  expect_error "training.device: cuda" --config tiny.yaml --set training.device=cuda
  [ ! -e run/metrics.jsonl ] || ! grep -q '"loss"' run/metrics.jsonl || fail "trained on the CPU when asked for cuda"
fi

# Data problems.
cp data/text_document.idx only.idx
expect_error "only.bin" --config tiny.yaml --set 'data.train=[only]'
head -c 30 data/text_document.idx > trunc.idx
cp data/text_document.bin trunc.bin
expect_error "trunc.idx" --config tiny.yaml --set 'data.train=[trunc]'
cp data/text_document.idx short.idx
head -c 1000 data/text_document.bin > short.bin
expect_error "short.bin" --config tiny.yaml --set 'data.train=[short]'
expect_error "vocab_size" --config tiny.yaml --set model.vocab_size=100
# A flipped bit in a .bin trained silently (issue 30, item 13): with the checksum file data prepare writes beside
# the pair, training and `data inspect --verify` refuse it, naming the file and the chunk.
"$MT" data inspect data/text_document --verify | grep -q "checksums   data/text_document.bin and .* match" ||
  fail "inspect --verify did not verify a good dataset"
cp data/text_document.idx flipped.idx
cp data/text_document.crc32c flipped.crc32c
python3 - data/text_document.bin flipped.bin <<'PY'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
data[5000] ^= 0x10
open(sys.argv[2], "wb").write(bytes(data))
PY
expect_error "data.train\[0\]: flipped.bin: chunk 0 (bytes 0\.\..*) has CRC-32C" --config tiny.yaml \
  --set 'data.train=[flipped]'
[ ! -e run/metrics.jsonl ] || ! grep -q '"loss"' run/metrics.jsonl || fail "trained on a corrupted .bin"
expect_error "flipped.bin: chunk 0" data inspect flipped --verify
expect_error "missing.txt" data prepare --input missing.txt --output x --tokenizer byte
[ ! -e x.bin ] && [ ! -e x.idx ] || fail "a failed prepare left output files"

# Checkpoint problems: an unwritable save dir fails before training; a corrupted checkpoint is refused.
echo "not a directory" > blocker
expect_error "blocker" --config tiny.yaml --set checkpoint.save_dir=blocker/ckpt
[ ! -e run/metrics.jsonl ] || ! grep -q '"loss"' run/metrics.jsonl || fail "trained despite an unwritable save dir"
"$MT" --config tiny.yaml --set training.train_iters=6 --set checkpoint.save_dir=ckpt >/dev/null
ckpt=$(cat ckpt/latest)
cp -r "ckpt/$ckpt" pristine
python3 - "ckpt/$ckpt/rank_00000.bin" <<'PY'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[64] ^= 0x40  # inside model.embedding.word_embeddings.weight, the first tensor stored
open(path, "wb").write(bytes(data))
PY
expect_error "checksum" --config tiny.yaml --set training.train_iters=8 --set checkpoint.save_dir=ckpt
expect_error "checksum" eval --checkpoint ckpt --data data/text_document --samples 4
cmp -s pristine/metadata.yaml "ckpt/$ckpt/metadata.yaml" || fail "the failed resume touched the checkpoint"
rm "ckpt/$ckpt/metadata.yaml"
expect_error "metadata.yaml" eval --checkpoint "ckpt/$ckpt" --data data/text_document --samples 4
# eval reads its data as training does (issue 49, items 6 and 7b): against PREFIX.crc32c first, and a token id
# outside the vocabulary is named with the file, sequence and token it was read from.
expect_error "--data flipped: flipped.bin: chunk 0 (bytes 0\.\..*) has CRC-32C.*(--skip-checksums skips this check)" \
  eval --checkpoint pristine --data flipped --samples 4
cp data/text_document.idx high.idx
python3 - data/text_document.bin high.bin <<'PY'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
data[5001] ^= 0x10  # the high byte of token 2500 (uint16): an id past the vocabulary of 257
open(sys.argv[2], "wb").write(bytes(data))
PY
expect_error "--data: sample [0-9]* holds token id [0-9]* (read from high.bin: sequence [0-9]*, token [0-9]*), outside" \
  eval --checkpoint pristine --data high --samples 100 --skip-checksums
echo "all bad-input cases give clear errors"
