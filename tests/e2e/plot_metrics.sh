#!/usr/bin/env bash
# scripts/plot_metrics.py: two runs' metrics.jsonl make one PNG (loss, validation loss, lr, tokens/s against
# tokens). Needs matplotlib, from the interop Python (scripts/python-env.sh); skipped (77), saying so, without it.
source "$(dirname "$0")/lib/common.bash"
require_interop_python matplotlib
prepare_data
write_config
for lr in 1e-3 3e-3; do
  "$MT" --config tiny.yaml --set training.train_iters=6 --set logging.interval=2 --set logging.eval_interval=3 \
        --set logging.eval_iters=1 --set optimizer.lr=$lr --set logging.dir=run-$lr >/dev/null
done
"$PY" "$SRC/scripts/plot_metrics.py" run-1e-3 run-3e-3/metrics.jsonl -o two.png --labels "lr 1e-3,lr 3e-3"
[ "$(head -c 8 two.png | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || fail "two.png is not a PNG"
[ "$(stat -c %s two.png)" -gt 20000 ] || fail "two.png is suspiciously small"
# A metrics file alone plots against its records' consumed_tokens; records without them (as megatrain wrote before
# it logged consumed_tokens) need --seq-length, or the run's megatrain.log beside them.
cp run-1e-3/metrics.jsonl alone.jsonl
"$PY" "$SRC/scripts/plot_metrics.py" alone.jsonl -o alone.png || fail "a lone metrics file with consumed_tokens"
sed -E 's/"consumed_tokens":[0-9]+,//' alone.jsonl > old.jsonl
! grep -q consumed_tokens old.jsonl || fail "old.jsonl still has consumed_tokens"
rc=0
"$PY" "$SRC/scripts/plot_metrics.py" old.jsonl -o old.png 2>err.txt || rc=$?
[ "$rc" -ne 0 ] && grep -q "pass --seq-length" err.txt || fail "a lone old metrics file without --seq-length: $(cat err.txt)"
"$PY" "$SRC/scripts/plot_metrics.py" old.jsonl -o old.png --seq-length 32 || fail "--seq-length"
sed -E 's/"consumed_samples":([0-9]+)/"consumed_samples":\1,"consumed_tokens":\1000/' old.jsonl > tokens.jsonl
"$PY" "$SRC/scripts/plot_metrics.py" tokens.jsonl -o tokens.png || fail "consumed_tokens records"
echo "plot_metrics ok"
