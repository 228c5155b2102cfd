#!/usr/bin/env bash
# SIGTERM mid-run: megatrain finishes the iteration, saves a checkpoint and exits 0; the same command
# then resumes from it and the losses continue those of an uninterrupted run.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
"$MT" --config tiny.yaml --set training.train_iters=400 --set logging.dir=straight >/dev/null
"$MT" --config tiny.yaml --set training.train_iters=400 --set checkpoint.save_dir=ckpt > log.txt &
pid=$!
for _ in $(seq 100); do grep -q '"loss"' run/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 0 ] || fail "exit $rc after SIGTERM"
grep -q "received signal" log.txt || fail "no message about the signal"
[ -f ckpt/latest ] || fail "no checkpoint after SIGTERM"
stopped=$(sed -E 's/iter_0*//' ckpt/latest)
[ "$stopped" -lt 400 ] || fail "SIGTERM came after the run ended; the test proves nothing"
"$MT" --config tiny.yaml --set training.train_iters=400 --set checkpoint.save_dir=ckpt >/dev/null
losses straight/metrics.jsonl $((stopped + 1)) 400 > a.txt
losses run/metrics.jsonl $((stopped + 1)) 400 > b.txt
diff a.txt b.txt >/dev/null || fail "losses after the signal-time checkpoint differ"
echo "stopped at iteration $stopped on SIGTERM, resumed to 400 with identical losses"

# Under --nproc, a signal that reaches one rank only stops the whole job after the same iteration, whatever the
# layout: the stop is agreed over every rank, not just the data-parallel group (with TP=2 or PP=2 the DP group
# has one rank, and rank 0 used to save and leave while its peer trained on into a timeout). SIGHUP (the
# terminal closed) to the launcher is forwarded and handled like SIGTERM.
pid_of_rank() {  # launcher_pid rank
  local child
  for child in $(ps -o pid= --ppid "$1"); do
    tr '\0' '\n' < /proc/$child/environ 2>/dev/null | grep -qx "RANK=$2" && { echo "$child"; return; }
  done
}
stop_one() {  # name signal target(launcher|rank N) overrides...
  local name=$1 sig=$2 target=$3; shift 3
  local rank=""
  [ "$target" = rank ] && { rank=$1; shift; }
  "$MT" --config tiny.yaml --set training.train_iters=400 --set parallel.timeout_s=20 --nproc 2 \
    --set checkpoint.save_dir=ckpt_$name --set logging.dir=run_$name "$@" > log_$name.txt 2>&1 &
  local pid=$! victim
  for _ in $(seq 300); do grep -q '"loss"' run_$name/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
  if [ -n "$rank" ]; then victim=$(pid_of_rank $pid $rank); else victim=$pid; fi
  [ -n "$victim" ] || fail "$name: no process for rank $rank"
  kill -$sig "$victim"
  rc=0
  wait "$pid" || rc=$?
  [ "$rc" -eq 0 ] || { tail -5 log_$name.txt; fail "$name: exit $rc after SIG$sig"; }
  [ -f ckpt_$name/latest ] || { tail -5 log_$name.txt; fail "$name: no checkpoint after SIG$sig"; }
  stopped=$(sed -E 's/iter_0*//' ckpt_$name/latest)
  [ "$stopped" -lt 400 ] || fail "$name: the signal came after the run ended; the test proves nothing"
  echo "$name: SIG$sig to ${rank:+rank }${rank:-the launcher}: every rank stopped and saved at iteration $stopped"
}
stop_one tp2 USR1 rank 0 --set parallel.tensor=2
stop_one pp2 USR1 rank 1 --set parallel.pipeline=2
stop_one hup HUP launcher --set parallel.pipeline=2
