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
