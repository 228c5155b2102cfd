#!/usr/bin/env bash
# Weighted blends in Megatron's syntax (data.train: [0.3, a, 0.7, b]) give each dataset megatron-core's share of
# the samples (printed on the "data:" line), blend the validation splits with the same weights, accept a blend
# for data.valid, keep the losses of one rank at DP=2 and across a resume, and refuse a zero weight. With the interop
# Python (numpy, megatron-core: scripts/python-env.sh), the split / blend golden values of tests/unit are also
# checked against megatron-core's real functions; without it that part is skipped with a message.
source "$(dirname "$0")/lib/common.bash"
REF="$SRC/tests/interop/megatron_split_blend_reference.py"
if have_interop_python numpy megatron.core; then
  "$PY" "$REF" --check-numpy --check-megatron | tee ref.log
  grep -q "mismatches" ref.log && fail "the reference disagrees with megatron-core or numpy"
  grep -q "megatron-core check: OK" ref.log || fail "megatron-core's check did not run (see above)"
  "$PY" "$REF" --golden | cmp - "$SRC/tests/unit/core/data/megatron_split_golden.inc" ||
    fail "tests/unit/core/data/megatron_split_golden.inc is not what the reference generates"
fi

# Two datasets of the licence texts: a (the first 7 files) and b (the next 7).
mkdir -p data
mapfile -t inputs < <(find /usr/share/common-licenses -type f | sort)
"$MT" data prepare --input "${inputs[@]:0:7}" --output data/a --tokenizer byte >/dev/null
"$MT" data prepare --input "${inputs[@]:7:7}" --output data/b --tokenizer byte >/dev/null
write_config
sed -i 's|^data: .*|data: {train: [0.3, data/a, 0.7, data/b], split: [80, 20, 0]}|' tiny.yaml
common=(--config tiny.yaml --set training.train_iters=6 --set logging.eval_interval=3 --set logging.eval_iters=2
        --set parallel.timeout_s=60)
"$MT" "${common[@]}" --set logging.dir=one >one.log 2>&1 || { cat one.log; fail "the blend run failed"; }
grep "data:" one.log
# 6 iterations of 8 samples: megatron-core asks ceil(48*0.3)=15 of a and ceil(48*0.7)=34 of b; validation
# (2 batches of 8) ceil(4.8)=5 and ceil(11.2)=12.
grep -q "train: blend of 49 samples \[data/a w=0.3: 15 samples" one.log || fail "train shares differ"
grep -q "data/b w=0.7: 34 samples" one.log || fail "train share of b differs"
grep -q "validation: blend of 17 samples \[data/a w=0.3: 5 samples" one.log || fail "validation shares differ"
grep -q '"valid_loss"' one/metrics.jsonl || fail "no validation loss"
run_ranks 2 "${common[@]}" --set logging.dir=dp2
same_losses one/metrics.jsonl dp2/metrics.jsonl 1 6 1e-4
# Stopped after iteration 3 and resumed, the blend continues where it was.
"$MT" "${common[@]}" --set logging.dir=part --set checkpoint.save_dir=ckpt --exit-after 3 >/dev/null 2>&1
"$MT" "${common[@]}" --set logging.dir=resumed --set checkpoint.save_dir=ckpt >/dev/null 2>&1
same_losses one/metrics.jsonl resumed/metrics.jsonl 4 6 0

# A blend for data.valid (whole datasets), and a plain list still concatenates.
"$MT" "${common[@]}" --set logging.dir=v --set 'data.valid=[1, data/a, 3, data/b]' >v.log 2>&1 ||
  { cat v.log; fail "the data.valid blend run failed"; }
grep -q "validation: blend of 16 samples \[data/a w=0.25: 4 samples" v.log ||
  { grep "data:" v.log; fail "valid shares"; }
"$MT" "${common[@]}" --set logging.dir=plain --set 'data.train=[data/a, data/b]' >plain.log 2>&1 ||
  { cat plain.log; fail "the plain list run failed"; }
grep -q "train: [0-9]* samples per epoch" plain.log || fail "a plain list is no longer a concatenation"

expect_error "data.train\[0\]: blend weight 0 must be a finite number > 0" --config tiny.yaml \
  --set 'data.train=[0, data/a, 1, data/b]'
echo "ok"
