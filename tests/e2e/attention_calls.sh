#!/usr/bin/env bash
# What ran attention is reported, not assumed: every record of metrics.jsonl carries the calls since the start by
# implementation (attention_cpu_calls / attention_cudnn_calls / attention_kernel_calls), and the log says what ran
# in the first interval. On the CPU: 2 layers x 2 microbatches x (forward + backward) = 8 calls an iteration, 12
# with full recomputation (each forward again before its backward).
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
for spec in none:8 full:12; do
  recompute=${spec%:*} per_iter=${spec#*:}
  "$MT" --config tiny.yaml --set training.train_iters=4 --set optimizer.warmup_iters=1 --set logging.interval=2 --set logging.eval_interval=0 \
        --set training.recompute=$recompute --set logging.dir=run_$recompute > log_$recompute.txt 2>&1 ||
    { cat log_$recompute.txt; fail "the $recompute run failed"; }
  python3 - "run_$recompute/metrics.jsonl" "$per_iter" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"iteration"' in l and '"loss"' in l]
per_iter = int(sys.argv[2])
assert [r["iteration"] for r in rows] == [2, 4], rows
for r in rows:
    got = (r["attention_cpu_calls"], r["attention_cudnn_calls"], r["attention_kernel_calls"])
    assert got == (per_iter * r["iteration"], 0, 0), f"iteration {r['iteration']}: (cpu, cudnn, kernel) = {got}"
PY
  grep -q "attention ran (calls this interval, forward and backward): CPU $((2 * per_iter))$" log_$recompute.txt ||
    { cat log_$recompute.txt; fail "no 'attention ran' line with CPU $((2 * per_iter)) in the $recompute run's log"; }
  echo "recompute $recompute: $per_iter CPU attention calls an iteration, reported in metrics.jsonl and the log"
done
