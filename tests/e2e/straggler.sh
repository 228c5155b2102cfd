#!/usr/bin/env bash
# Straggler detection (issue 46): a 4-rank run whose rank 1 is throttled from outside (SIGSTOP / SIGCONT, stopped
# three quarters of the time) names rank 1 as the slowest of its stage in most intervals' busy-time lines and in
# metrics.jsonl, and warns that it is a straggler once it has been slow for three intervals in a row (margin 0.25);
# the same run unthrottled warns about nobody (margin 0.5: four ranks sharing two cores stay well within it).
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
run=(--config tiny.yaml --nproc 4 --set training.train_iters=400 --set training.global_batch_size=8
     --set training.micro_batch_size=2 --set logging.interval=20 --set parallel.timeout_s=60)
"$MT" "${run[@]}" --set logging.straggler_margin=0.5 --set logging.dir=even >/dev/null 2>even.err \
  || { tail -5 even.err; fail "the unthrottled run failed"; }
grep -q "busy ms/iter (beside the collectives' waits): stage median" even/megatrain.log || fail "no busy-time line"
! grep -q "is a straggler" even/megatrain.log || { grep "busy ms" even/megatrain.log; fail "an even run warned"; }
"$MT" "${run[@]}" --set logging.straggler_margin=0.25 --set logging.dir=slow >/dev/null 2>slow.err &
launcher=$!
victim=""
for _ in $(seq 100); do
  for pid in $(pgrep -P $launcher); do
    tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -qx "RANK=1" && victim=$pid
  done
  [ -n "$victim" ] && break
  sleep 0.1
done
[ -n "$victim" ] || fail "no rank 1"
while kill -0 "$victim" 2>/dev/null; do  # rank 1 runs a quarter of the time
  kill -STOP "$victim" 2>/dev/null || break
  sleep 0.03
  kill -CONT "$victim" 2>/dev/null || break
  sleep 0.01
done
wait $launcher || { tail -5 slow.err; fail "the throttled run failed"; }
grep "busy ms" slow/megatrain.log | tail -3
grep -q "rank 1 is a straggler" slow/megatrain.log || fail "the throttled rank 1 was not named a straggler"
python3 - slow/metrics.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"busy_ms"' in l]
slowest = [r["busy_ms"]["slowest_rank"] for r in rows[1:]]
assert slowest and slowest.count(1) > len(slowest) / 2, f"slowest ranks by interval: {slowest}"
print(f"slowest rank by interval: {slowest}; last excess "
      f"{rows[-1]['busy_ms']['slowest'] / rows[-1]['busy_ms']['stage_median'] - 1:+.0%}")
PY
