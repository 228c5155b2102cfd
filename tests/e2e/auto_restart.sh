#!/usr/bin/env bash
# Automatic restart (issue 46): `megatrain --nproc 4 --max-restarts 5` survives ranks killed (SIGKILL) three times at
# random points of a run, each time stopping every rank and starting them all again from the latest checkpoint,
# and ends with the uninterrupted run's losses exactly (resume is exact). Exit codes tell a supervisor what to do:
# 2 for a refused configuration or input (never restarted: a corrupt checkpoint fails once, not six times), 1 for a
# failure a restart may cure. Bad uses of the flag are refused naming what is wrong.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
run=(--config tiny.yaml --set training.train_iters=300 --set optimizer.warmup_iters=5 --set training.micro_batch_size=2
     --set training.global_batch_size=8 --set parallel.timeout_s=30 --set checkpoint.save_interval=8
     --set checkpoint.keep_last=2 --nproc 4)

# Refused uses, exit code 2.
rc=0
"$MT" --config tiny.yaml --max-restarts 2 >/dev/null 2>err.txt || rc=$?
[ $rc -eq 2 ] || fail "--max-restarts without --nproc exited $rc, expected 2"
grep -q -- "--max-restarts restarts the ranks --nproc starts" err.txt || fail "the error does not say why: $(cat err.txt)"
rc=0
"$MT" --config tiny.yaml --nproc 2 --max-restarts 2 >/dev/null 2>err.txt || rc=$?
[ $rc -eq 2 ] || fail "--max-restarts without a checkpoint directory exited $rc, expected 2"
grep -q "needs checkpoint.save_dir set and checkpoint.load: auto" err.txt || fail "the error lacks the keys: $(cat err.txt)"
rc=0
"$MT" --config tiny.yaml --set model.hidden_size=-1 >/dev/null 2>err.txt || rc=$?
[ $rc -eq 2 ] || fail "a refused config exited $rc, expected 2"
echo "refused uses exit 2"

# The uninterrupted run.
"$MT" "${run[@]}" --set checkpoint.save_dir=ck_whole --set logging.dir=whole >/dev/null 2>whole.err \
  || { tail -5 whole.err; fail "the uninterrupted run failed"; }

# The chaos run: a killer waits for progress past its last kill, then kills one random rank at a random moment.
"$MT" "${run[@]}" --max-restarts 5 --set checkpoint.save_dir=ck_chaos --set logging.dir=chaos >chaos.out 2>chaos.err &
launcher=$!
last=0
for kill in 1 2 3; do
  target=$((last + 20 + RANDOM % 20))
  for _ in $(seq 600); do  # up to 60 s
    now=$(python3 -c 'import json,sys
try:
    print(max([json.loads(l).get("iteration", 0) for l in open(sys.argv[1])] or [0]))
except (OSError, ValueError):
    print(0)' chaos/metrics.jsonl)
    [ "$now" -ge $target ] && break
    sleep 0.1
  done
  [ "$now" -ge $target ] || { tail -20 chaos.err; fail "kill $kill: the run did not reach iteration $target"; }
  sleep "0.$((RANDOM % 10))"
  mapfile -t ranks < <(pgrep -P $launcher)
  [ ${#ranks[@]} -gt 0 ] || fail "kill $kill: no rank is running"
  victim=${ranks[$((RANDOM % ${#ranks[@]}))]}
  kill -9 "$victim" 2>/dev/null || true
  echo "kill $kill: SIGKILL to pid $victim at iteration >= $now"
  last=$now
  # Wait for the restart before the next kill.
  for _ in $(seq 300); do
    [ "$(grep -c "restart $kill of 5" chaos.err)" -ge 1 ] && break
    sleep 0.1
  done
  grep -q "restart $kill of 5" chaos.err || { tail -20 chaos.err; fail "kill $kill: no restart"; }
done
wait $launcher || { tail -20 chaos.err; fail "the chaos run failed"; }
grep -o "restart [0-9] of 5 (exit code [0-9]*)" chaos.err
[ "$(grep -c "restart [0-9] of 5" chaos.err)" -eq 3 ] || fail "expected 3 restarts"
same_losses whole/metrics.jsonl chaos/metrics.jsonl 1 300 0
python3 - whole/metrics.jsonl chaos/metrics.jsonl <<'PY'
import json, sys
last = [[json.loads(l) for l in open(p) if '"loss"' in l][-1] for p in sys.argv[1:3]]
assert last[0]["iteration"] == last[1]["iteration"] == 300 and last[0]["loss"] == last[1]["loss"], last
print(f"final loss after 3 kills: {last[1]['loss']!r}, the uninterrupted run's exactly")
PY

# A refused input is not restarted: a checkpoint whose tensors were truncated fails once with exit 2.
latest=$(cat ck_whole/latest)
truncate -s 100 "ck_whole/$latest/rank_00000.bin"
rc=0
"$MT" "${run[@]}" --set training.train_iters=310 --max-restarts 5 --set checkpoint.save_dir=ck_whole \
      --set logging.dir=broken >/dev/null 2>broken.err || rc=$?
[ $rc -ne 0 ] || fail "a truncated checkpoint was resumed"
grep -q "not restarting: exit code 2" broken.err || { tail -5 broken.err; fail "a refused input was restarted"; }
! grep -q "restart 1 of 5" broken.err || fail "a refused input was restarted"
echo "a truncated checkpoint: exit $rc, not restarted"
