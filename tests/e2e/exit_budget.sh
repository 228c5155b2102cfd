#!/usr/bin/env bash
# The exits a Slurm job needs: training.exit_interval (save and exit every N iterations, as Megatron's
# --exit-interval) and training.exit_duration_mins (save and exit once the wall-clock budget is spent, agreed by
# all ranks), each exiting 0 with a checkpoint, and resuming exactly: the losses of the whole run equal a
# straight run's. The budget exit also runs over two ranks (TP2).
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
common=(--config tiny.yaml --set training.train_iters=6)
"$MT" "${common[@]}" --set logging.dir=straight >/dev/null || fail "straight run failed"
losses straight/metrics.jsonl 1 6 > want.txt
[ "$(wc -l < want.txt)" -eq 6 ] || fail "straight run logged $(wc -l < want.txt) losses"

# exit_interval=4: the first run stops after iteration 4 (status 0, checkpoint 4); the second resumes, reaches
# the end at 6 (no exit at 8: the run is over) and saves there.
for i in 1 2; do
  "$MT" "${common[@]}" --set training.exit_interval=4 --set logging.dir=interval \
        --set checkpoint.save_dir=interval/ckpt > "interval$i.log" 2>&1 || fail "exit_interval run $i exited $?"
done
grep -q "saving and exiting after iteration 4 (training.exit_interval=4)" interval1.log ||
  fail "no exit_interval message: $(tail -3 interval1.log)"
[ "$(cat interval/ckpt/latest)" = iter_0000006 ] || fail "latest is $(cat interval/ckpt/latest), expected iter_0000006"
[ -d interval/ckpt/iter_0000004 ] || fail "no checkpoint at the exit (iteration 4)"
losses interval/metrics.jsonl 1 6 > got.txt
diff want.txt got.txt || fail "exit_interval: losses after the resume differ from the straight run"

# exit_duration_mins: a budget smaller than one iteration exits after every iteration; resumed 5 times more,
# the run ends at 6 with the straight run's losses. Over TP2 both ranks stop after the same iteration.
for n in 1 2; do
  tp=(); [ "$n" = 2 ] && tp=(--nproc 2 --set parallel.tensor=2)
  rm -rf budget
  for i in 1 2 3 4 5 6; do
    "$MT" "${common[@]}" "${tp[@]}" --set training.exit_duration_mins=1e-9 --set logging.dir=budget \
          --set checkpoint.save_dir=budget/ckpt > "budget$i.log" 2>&1 || fail "ranks $n: budget run $i exited $?"
  done
  grep -q "saving and exiting after iteration 1: training.exit_duration_mins=1e-09 reached" budget1.log ||
    fail "ranks $n: no budget message: $(tail -3 budget1.log)"
  [ "$(cat budget/ckpt/latest)" = iter_0000006 ] || fail "ranks $n: latest is $(cat budget/ckpt/latest)"
  losses budget/metrics.jsonl 1 6 > got.txt
  if [ "$n" = 1 ]; then
    diff want.txt got.txt || fail "exit_duration_mins: losses after 5 resumes differ from the straight run"
  else
    [ "$(wc -l < got.txt)" -eq 6 ] || fail "TP2: $(wc -l < got.txt) losses logged over the resumes"
  fi
done

# Bad values name the key.
out=$("$MT" "${common[@]}" --set training.exit_duration_mins=-1 2>&1) && fail "a negative budget was accepted"
grep -q "training.exit_duration_mins" <<<"$out" || fail "the error does not name the key: $out"
out=$("$MT" "${common[@]}" --set training.exit_interval=-2 2>&1) && fail "a negative interval was accepted"
grep -q "training.exit_interval" <<<"$out" || fail "the error does not name the key: $out"
echo "PASS: exit_interval and exit_duration_mins exit 0 with a checkpoint and resume exactly"
