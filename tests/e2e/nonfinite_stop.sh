#!/usr/bin/env bash
# Training that goes non-finite stops with an error instead of saving and rotating NaN checkpoints and
# exiting 0: after training.max_nonfinite_iters non-finite iterations in a row the run fails naming the first
# non-finite gradient and its rank, no checkpoint is taken during the streak, and a checkpoint whose weights
# hold inf/NaN is never written (fp16 values overflow while the fp32 masters stay finite; under ZeRO-3 too, where
# they are each rank's blocks).
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
run_expecting_failure() {  # name overrides...
  local name=$1; shift
  local rc=0
  "$MT" --config tiny.yaml --set training.train_iters=60 --set checkpoint.save_dir=ckpt_$name \
    --set checkpoint.save_interval=1 --set logging.dir=run_$name "$@" >$name.out 2>$name.err || rc=$?
  [ $rc -ne 0 ] && [ $rc -lt 128 ] || { tail -3 $name.err; fail "$name: exit $rc, expected an error"; }
}
# fp32, lr 1e30 over TP=2: iteration 2 onwards is NaN.
run_expecting_failure tp2 --set optimizer.lr=1e30 --set training.max_nonfinite_iters=3 --nproc 2 --set parallel.tensor=2
grep -q "3 non-finite iterations in a row (iterations 2 to 4" tp2.err || { cat tp2.err; fail "tp2: no clear stop"; }
grep -q "first non-finite gradient, at iteration 2, was on rank(s) \[0, 1\]; on this rank (rank 0) in embedding" tp2.err \
  || { cat tp2.err; fail "tp2: the first non-finite gradient and its rank are not named"; }
[ "$(cat ckpt_tp2/latest)" = iter_0000001 ] || fail "tp2: a checkpoint was saved after iteration 1: $(ls ckpt_tp2)"
echo "tp2: $(grep -m1 'megatrain: error' tp2.err)"
# fp16: the scaler skips overflowing steps (not counted while it can back off) until a huge finite step
# overflows the fp16 weights; that checkpoint is refused.
run_expecting_failure fp16 --set optimizer.lr=1e30 --set training.precision=fp16
grep -q "not saving a checkpoint at iteration [0-9]*: the weights are not finite on rank(s) \[0\]" fp16.err \
  || { cat fp16.err; fail "fp16: non-finite weights were not refused"; }
refused=$(sed -nE 's/.*not saving a checkpoint at iteration ([0-9]+).*/\1/p' fp16.err)
last=$(sed -E 's/iter_0*//' ckpt_fp16/latest)
[ "$last" -lt "$refused" ] || fail "fp16: latest checkpoint $last is not before the refused iteration $refused"
echo "fp16: $(cat fp16.err)"
# The same under ZeRO-3 (parallel.shard: parameters), whose values live in each rank's fp16 blocks between units.
run_expecting_failure zero3 --set optimizer.lr=1e30 --set training.precision=fp16 --nproc 2 --set parallel.shard=parameters
grep -q "not saving a checkpoint at iteration [0-9]*: the weights are not finite on rank(s) \[" zero3.err \
  || { cat zero3.err; fail "zero3: non-finite weights were not refused"; }
echo "zero3: $(grep -m1 'megatrain: error' zero3.err)"
# A run that ends inside a non-finite streak shorter than max_nonfinite_iters cannot save its last iteration: it
# fails naming why (it used to exit 0 without its checkpoint), and the checkpoint before the streak stays latest.
run_expecting_failure endnan --set optimizer.lr=1e30 --set training.max_nonfinite_iters=100 --set training.train_iters=8
grep -q "training ended after iteration 8 without its checkpoint: the last 7 iteration(s) were not finite" endnan.err \
  || { cat endnan.err; fail "endnan: the refused final checkpoint is not an error"; }
[ "$(cat ckpt_endnan/latest)" = iter_0000001 ] || fail "endnan: latest is not the checkpoint before the streak"
echo "endnan: $(grep -m1 'megatrain: error' endnan.err)"
# A healthy run is not affected.
"$MT" --config tiny.yaml --set training.train_iters=6 --set logging.dir=ok >/dev/null || fail "a healthy run failed"
