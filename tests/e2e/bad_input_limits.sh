#!/usr/bin/env bash
# Hostile sizes and files: each gives a clear error naming the key or file, a non-zero exit, and never a crash,
# a hang or a bare std::bad_alloc (cases found by an adversarial run against the CPU build).
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config

# Sizes that overflow int64 once multiplied, or that no machine holds: refused before anything is allocated.
expect_error "model.hidden_size" --config tiny.yaml --set model.hidden_size=4611686018427387904 --set model.num_heads=1
expect_error "model.num_layers" --config tiny.yaml --set model.num_layers=9223372036854775807
expect_error "model.seq_length" --config tiny.yaml --set model.seq_length=4611686018427387904
expect_error "model.vocab_size" --config tiny.yaml --set model.vocab_size=4611686018427387904
expect_error "model.ffn_hidden_size" --config tiny.yaml --set model.ffn_hidden_size=4611686018427387904
expect_error "training.micro_batch_size" --config tiny.yaml --set training.micro_batch_size=4611686018427387904
expect_error "model.hidden_size=1048576" --config tiny.yaml --set model.hidden_size=1048576 --set model.num_heads=1
expect_error "model.make_vocab_size_divisible_by" --config tiny.yaml \
  --set model.make_vocab_size_divisible_by=9223372036854775807
expect_error "logging.eval_iters" --config tiny.yaml --set logging.eval_iters=9223372036854775807
expect_error "parallel.timeout_s" --config tiny.yaml --set parallel.timeout_s=1e300
expect_error "derived values are computed" --config tiny.yaml --set derived.head_dim=3
{ cat tiny.yaml; printf 'derived:\n  padded_vocab_size: 1000\n'; } > derived.yaml
expect_error "derived.padded_vocab_size" --config derived.yaml

# Files that are no files: refused at once instead of read forever.

rc=0; timeout 20 "$MT" --config /dev/zero >out.txt 2>err.txt || rc=$?
[ "$rc" -ne 124 ] || fail "--config /dev/zero hangs"
[ "$rc" -ne 0 ] && grep -q "/dev/zero: is not a regular file" err.txt || { cat err.txt; fail "--config /dev/zero: rc $rc"; }
cp data/text_document.bin pipe.bin
mkfifo pipe.idx
rc=0; timeout 20 "$MT" --config tiny.yaml --set 'data.train=[pipe]' >out.txt 2>err.txt || rc=$?
[ "$rc" -ne 124 ] || fail "a FIFO named pipe.idx hangs"
[ "$rc" -ne 0 ] && grep -q "pipe.idx: not a regular file" err.txt || { cat err.txt; fail "FIFO .idx: rc $rc"; }
rm pipe.idx pipe.bin
cp data/text_document.idx pipe.idx
mkfifo pipe.bin
rc=0; timeout 20 "$MT" --config tiny.yaml --set 'data.train=[pipe]' >out.txt 2>err.txt || rc=$?
[ "$rc" -ne 124 ] || fail "a FIFO named pipe.bin hangs"
[ "$rc" -ne 0 ] && grep -q "pipe.bin: not a regular file" err.txt || { cat err.txt; fail "FIFO .bin: rc $rc"; }
echo "all hostile sizes and files give clear errors"
