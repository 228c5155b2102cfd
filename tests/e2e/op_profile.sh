#!/usr/bin/env bash
# logging.profile_iteration: the profiled iteration writes RUN_DIR/op_profile.md (per-op totals, then rows by op
# and GEMM shape), logs the totals and adds an op_profile event to metrics.jsonl; profiling changes no loss (bit
# for bit against a run without it, with two ranks of tensor parallelism too); values it cannot honour are
# refused naming the key. On the CPU (the GPU half: test_cuda_ops' OpProfileTimesGpuOpsWithEvents).
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config

"$MT" --config tiny.yaml --set training.train_iters=6 --set logging.dir=plain >/dev/null
"$MT" --config tiny.yaml --set training.train_iters=6 --set logging.dir=profiled --set logging.profile_iteration=4 \
      >profiled.log 2>&1 || { cat profiled.log; fail "the profiled run failed"; }
[ "$(losses plain/metrics.jsonl 1 6)" = "$(losses profiled/metrics.jsonl 1 6)" ] || fail "profiling changed the losses"
f=profiled/op_profile.md
[ -f "$f" ] || fail "no $f"
head -1 "$f" | grep -q "^# op profile of iteration 4 on the CPU" || fail "$f: first line: $(head -1 "$f")"
for row in "| gemm | " "| attention_forward | " "| attention_backward | " "| layernorm_forward | " "| adamw_multi_step | "; do
  grep -qF "$row" "$f" || { cat "$f"; fail "$f has no '$row' row"; }
done
grep -qE '^\| gemm \| [0-9]+x[0-9]+x[0-9]+ [nt][nt] \| [0-9]+ \|' "$f" || { cat "$f"; fail "$f: no GEMM row by shape"; }
grep -q "op profile of iteration 4" profiled.log || fail "the log does not carry the profile"
python3 - profiled/metrics.jsonl <<'PY' || fail "metrics.jsonl: no sound op_profile event"
import json, sys
ev = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "op_profile"]
assert len(ev) == 1 and ev[0]["iteration"] == 4 and ev[0]["device"] == "cpu", ev
assert 0 < ev[0]["op_ms"] <= ev[0]["step_ms"], ev
PY
echo "the profiled iteration is timed op by op, and no loss changes"

"$MT" --config tiny.yaml --nproc 2 --set parallel.tensor=2 --set training.train_iters=6 --set logging.dir=tp_plain >/dev/null
"$MT" --config tiny.yaml --nproc 2 --set parallel.tensor=2 --set training.train_iters=6 --set logging.dir=tp_prof \
      --set logging.profile_iteration=2 >/dev/null
[ "$(losses tp_plain/metrics.jsonl 1 6)" = "$(losses tp_prof/metrics.jsonl 1 6)" ] || fail "profiling changed TP=2 losses"
[ -f tp_prof/op_profile.md ] || fail "TP=2: the logging rank wrote no op_profile.md"
echo "with two tensor-parallel ranks too"

for bad in "-1:must be" "7:past training.train_iters=6"; do
  value=${bad%%:*} want=${bad#*:}
  rc=0
  "$MT" --config tiny.yaml --set training.train_iters=6 --set logging.profile_iteration=$value >bad.log 2>&1 || rc=$?
  [ "$rc" -ne 0 ] && grep -q "logging.profile_iteration" bad.log && grep -qF "$want" bad.log ||
    { cat bad.log; fail "logging.profile_iteration=$value: exit $rc, expected an error naming the key and '$want'"; }
done
echo "values it cannot honour are refused naming logging.profile_iteration"
