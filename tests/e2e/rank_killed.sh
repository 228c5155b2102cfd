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
