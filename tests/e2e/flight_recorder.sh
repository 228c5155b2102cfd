#!/usr/bin/env bash
# The flight recorder (issue 46): a 4-rank run whose rank 2 is stopped (SIGSTOP) mid-run: the others time out in
# their collective (parallel.timeout_s), each dumps its last collectives to logging.dir/flight_recorder/, and
# `megatrain debug hang RUN_DIR` names rank 2 as the rank the others waited for; without dumps it refuses the
# directory by name.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
expect_error "no flight records" debug hang nowhere
"$MT" --config tiny.yaml --nproc 4 --set training.train_iters=100000 --set parallel.timeout_s=4 \
      --set training.global_batch_size=8 --set training.micro_batch_size=2 --set logging.dir=hung \
      >hung.out 2>hung.err &
launcher=$!
for _ in $(seq 300); do
  [ -f hung/metrics.jsonl ] && [ "$(wc -l < hung/metrics.jsonl)" -ge 5 ] && break
  sleep 0.1
done
[ -f hung/metrics.jsonl ] || { tail -5 hung.err; fail "the run did not start"; }
victim=""
for pid in $(pgrep -P $launcher); do  # the rank whose environment says RANK=2
  tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -qx "RANK=2" && victim=$pid
done
[ -n "$victim" ] || fail "no rank 2 to stop"
kill -STOP "$victim"
echo "SIGSTOP to rank 2 (pid $victim)"
rc=0
wait $launcher || rc=$?
[ $rc -ne 0 ] || fail "the run with a stopped rank exited 0"
grep -q "rank 2 (pid $victim) is stopped" hung.err || { tail -8 hung.err; fail "the launcher did not name the stopped rank"; }
ls hung/flight_recorder
[ ! -f hung/flight_recorder/rank_00002.json ] || fail "the stopped rank wrote a flight record"
"$MT" debug hang hung | tee hang.txt
grep -q "suspect rank(s): 2$" hang.txt || fail "debug hang does not name rank 2"
grep -q "left no record" hang.txt || fail "debug hang does not say rank 2 left no record"
