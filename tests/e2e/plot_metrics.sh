#!/usr/bin/env bash
# scripts/plot_metrics.py: two runs' metrics.jsonl make one PNG (loss, validation loss, lr, tokens/s against
# tokens). Needs matplotlib: MT_PLOT_PYTHON names a python that has it (e.g. a venv made with
# `python3 -m venv /work/.venv-plot && /work/.venv-plot/bin/pip install matplotlib`); skipped (77) without.
source "$(dirname "$0")/lib/common.bash"
PY=""
for candidate in "${MT_PLOT_PYTHON:-}" "$(dirname "$MT")/plot-venv/bin/python" python3; do
  if [ -n "$candidate" ] && "$candidate" -c "import matplotlib" 2>/dev/null; then PY=$candidate; break; fi
done
[ -n "$PY" ] || { echo "SKIP: no python with matplotlib (set MT_PLOT_PYTHON to one, e.g. /work/.venv-plot/bin/python)"; exit 77; }
prepare_data
write_config
for lr in 1e-3 3e-3; do
  "$MT" --config tiny.yaml --set training.train_iters=6 --set logging.interval=2 --set logging.eval_interval=3 \
        --set logging.eval_iters=1 --set optimizer.lr=$lr --set logging.dir=run-$lr >/dev/null
done
# seq_length from each run's megatrain.log (these records carry consumed_samples, not consumed_tokens).
"$PY" "$SRC/scripts/plot_metrics.py" run-1e-3 run-3e-3/metrics.jsonl -o two.png --labels "lr 1e-3,lr 3e-3"
[ "$(head -c 8 two.png | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || fail "two.png is not a PNG"
[ "$(stat -c %s two.png)" -gt 20000 ] || fail "two.png is suspiciously small"
# A metrics file alone needs --seq-length; consumed_tokens, when a record has it, is used as is.
cp run-1e-3/metrics.jsonl alone.jsonl
rc=0
"$PY" "$SRC/scripts/plot_metrics.py" alone.jsonl -o alone.png 2>err.txt || rc=$?
[ "$rc" -ne 0 ] && grep -q "pass --seq-length" err.txt || fail "a lone metrics file without --seq-length: $(cat err.txt)"
"$PY" "$SRC/scripts/plot_metrics.py" alone.jsonl -o alone.png --seq-length 32 || fail "--seq-length"
sed -E 's/"consumed_samples":([0-9]+)/"consumed_samples":\1,"consumed_tokens":\1000/' alone.jsonl > tokens.jsonl
"$PY" "$SRC/scripts/plot_metrics.py" tokens.jsonl -o tokens.png || fail "consumed_tokens records"
echo "plot_metrics ok"
