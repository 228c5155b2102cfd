#!/usr/bin/env bash
# A rank killed with SIGKILL mid-run ends the whole `--nproc` job promptly with a message naming that rank,
# and the last committed checkpoint still loads.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
"$MT" --config tiny.yaml --nproc 4 --set parallel.tensor=2 --set training.train_iters=100000 \
      --set checkpoint.save_dir=ckpt --set checkpoint.save_interval=5 >out.txt 2>err.txt &
launcher=$!
for _ in $(seq 300); do [ -f ckpt/latest ] && break; sleep 0.1; done
[ -f ckpt/latest ] || fail "no checkpoint was committed"
victim=$(pgrep -P "$launcher" | sed -n 3p)   # the third rank (rank 2)
[ -n "$victim" ] || fail "no rank processes found"
start=$(date +%s)
kill -KILL "$victim"
rc=0
wait "$launcher" || rc=$?
elapsed=$(( $(date +%s) - start ))
[ $rc -ne 0 ] || fail "the job exited 0 after a rank was killed"
[ $elapsed -le 60 ] || fail "took ${elapsed}s to end the job"
grep -q "rank 2 (pid $victim) was killed by signal 9" err.txt || { cat err.txt; fail "the message does not name rank 2"; }
[ -z "$(pgrep -P "$launcher")" ] || fail "ranks left running"
echo "job ended ${elapsed}s after SIGKILL of rank 2 (exit $rc): $(grep 'rank 2' err.txt)"
"$MT" ckpt inspect ckpt --verify >/dev/null || fail "the last committed checkpoint does not verify"
"$MT" eval --checkpoint ckpt --data data/text_document --samples 4 || fail "the last committed checkpoint does not load"

# A rank stopped with SIGSTOP answers nothing: its peer times out and exits first. The launcher must still
# name the stopped rank first (and kill it), and the peer's timeout error must name it by its heartbeat.
"$MT" --config tiny.yaml --nproc 2 --set training.train_iters=100000 --set parallel.timeout_s=5 \
      --set logging.dir=stopped >out2.txt 2>err2.txt &
launcher=$!
for _ in $(seq 300); do grep -q '"loss"' stopped/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
victim=""
for child in $(pgrep -P "$launcher"); do
  tr '\0' '\n' < /proc/$child/environ | grep -qx "RANK=1" && victim=$child
done
[ -n "$victim" ] || fail "no rank 1 process found"
start=$(date +%s)
kill -STOP "$victim"
rc=0
wait "$launcher" || rc=$?
elapsed=$(( $(date +%s) - start ))
[ $rc -ne 0 ] || fail "the job exited 0 with a stopped rank"
[ $elapsed -le 40 ] || fail "took ${elapsed}s to end the job with a stopped rank"
grep -m1 "megatrain launch:" err2.txt | grep -q "rank 1 (pid $victim) is stopped" \
  || { cat err2.txt; fail "the launcher does not name the stopped rank 1 first"; }
grep -q "ranks whose heartbeat stopped, likely stopped or frozen: \[1\]" err2.txt \
  || { cat err2.txt; fail "rank 0's timeout error does not name rank 1"; }
[ -z "$(pgrep -P "$launcher")" ] || fail "ranks left running"
echo "job ended ${elapsed}s after SIGSTOP of rank 1 (exit $rc):"; grep -E "megatrain( launch|: error)" err2.txt
# Ranks started without the launcher (as srun or torchrun start them): nothing but the peers themselves sees a rank
# die. Two tensor-parallel ranks talk through shared memory (parallel.gloo_shared_memory); when rank 1 is killed,
# rank 0 must see its process gone and fail at once, naming it, not wait out parallel.timeout_s (60 s).
port=$(free_port)
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$MT" --config tiny.yaml --set parallel.tensor=2 --set training.train_iters=100000 --set parallel.timeout_s=60 \
          --set logging.dir=alone$r >alone$r.out 2>alone$r.err &
  pids[$r]=$!
done
for _ in $(seq 300); do grep -q '"loss"' alone0/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
grep -q '"loss"' alone0/metrics.jsonl || { cat alone0.err; fail "the two ranks did not start training"; }
start=$(date +%s)
kill -KILL "${pids[1]}"
rc=0
wait "${pids[0]}" || rc=$?
elapsed=$(( $(date +%s) - start ))
[ $rc -ne 0 ] || fail "rank 0 exited 0 after rank 1 was killed"
[ $elapsed -le 10 ] || fail "rank 0 took ${elapsed}s to see rank 1 gone (the timeout is 60 s)"
grep -q "rank 1 (global 1) (pid ${pids[1]}) exited" alone0.err \
  || { cat alone0.err; fail "rank 0 does not name rank 1"; }
echo "rank 0 ended ${elapsed}s after SIGKILL of rank 1: $(grep -m1 'exited' alone0.err)"
