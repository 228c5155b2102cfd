#!/usr/bin/env bash
# The schedules reach the optimizer: the lr each iteration logs to metrics.jsonl follows optimizer.decay (wsd in
# each shape, inverse_square_root), the values checked against the formulas at every step.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
run() {  # $1: run dir, rest: --set overrides
  local dir=$1; shift
  "$MT" --config tiny.yaml --set training.train_iters=10 --set logging.interval=1 --set logging.dir="$dir" \
        --set optimizer.lr=3e-3 --set optimizer.min_lr=3e-4 "$@" >/dev/null
}
# $1: metrics file, $2: a Python expression of the step s (math imported) giving the expected lr.
check() {
  python3 - "$1" "$2" <<'PY' || fail "$1: lr differs from $2"
import json, math, sys
expr, n = sys.argv[2], 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "lr" not in r:
        continue
    s, want = r["iteration"], eval(expr, {"math": math, "s": r["iteration"]})
    if abs(r["lr"] - want) > 1e-6 * want:
        sys.exit(f"iteration {s}: lr {r['lr']}, expected {want}")
    n += 1
if n != 10:
    sys.exit(f"{n} lr records, expected 10")
print(f"{sys.argv[1]}: lr follows {expr}")
PY
}
# Warmup 2, peak until step 6, then 0.4 * 10 = 4 steps of anneal to min_lr at step 10.
warm="min(s, 2) / 2 * 3e-3 if s <= 2 else"
for shape in linear cosine exponential 1-sqrt; do
  run "wsd-$shape" --set optimizer.decay=wsd --set optimizer.warmup_iters=2 --set optimizer.wsd_decay_fraction=0.4 \
      --set optimizer.wsd_decay_style=$shape
done
r="max(s - 6, 0) / 4"
check wsd-linear/metrics.jsonl "$warm 3e-4 + 2.7e-3 * (1 - $r)"
check wsd-cosine/metrics.jsonl "$warm 3e-4 + 2.7e-3 * 0.5 * (math.cos(math.pi * $r) + 1)"
check wsd-exponential/metrics.jsonl "$warm 3e-4 + 2.7e-3 * (2 * 0.5 ** ($r) - 1)"
check wsd-1-sqrt/metrics.jsonl "$warm 3e-4 + 2.7e-3 * (1 - math.sqrt($r))"
# lr * sqrt(warmup) / sqrt(step) after a warmup of 4, floored at min_lr.
run isqrt --set optimizer.decay=inverse_square_root --set optimizer.warmup_iters=4
check isqrt/metrics.jsonl "s / 4 * 3e-3 if s <= 4 else max(3e-4, 3e-3 * 2 / math.sqrt(s))"
echo "lr_schedules ok"
