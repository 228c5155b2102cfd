#!/usr/bin/env bash
# A logging sink that fails mid-run (metrics.jsonl on a full disk: here a link to /dev/full, which refuses every
# write with ENOSPC, as root too) costs no training: the run warns, naming the file and the OS error, trains to
# the end, saves its checkpoint and exits 0. With logging.on_sink_error=save_and_stop it saves after the
# iteration whose record failed and stops cleanly (exit 0); resuming goes on from there.
source "$(dirname "$0")/lib/common.bash"
[ -c /dev/full ] || { echo "SKIP: no /dev/full here"; exit 77; }
prepare_data
write_config
full_disk_run() { mkdir -p "$1" && ln -s /dev/full "$1/metrics.jsonl"; }

full_disk_run run_warn
rc=0
"$MT" --config tiny.yaml --set training.train_iters=6 --set logging.dir=run_warn --set checkpoint.save_dir=ckpt_warn \
      > warn.txt 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat warn.txt >&2; fail "exit $rc with a failing metrics.jsonl (logging.on_sink_error=warn)"; }
grep -q "logging sink failed: run_warn/metrics.jsonl: cannot write: No space left on device" warn.txt ||
  { cat warn.txt >&2; fail "no warning naming metrics.jsonl and the OS error"; }
[ "$(grep -c "logging sink failed" warn.txt)" -eq 1 ] || fail "the failed sink warned more than once"
grep -q "training done: 6 iterations" warn.txt || fail "training did not go on to the end"
[ "$(cat ckpt_warn/latest)" = iter_0000006 ] || fail "no checkpoint at iteration 6: $(cat ckpt_warn/latest 2>&1)"

full_disk_run run_stop
rc=0
"$MT" --config tiny.yaml --set training.train_iters=6 --set logging.interval=2 --set logging.dir=run_stop \
      --set logging.on_sink_error=save_and_stop --set checkpoint.save_dir=ckpt_stop > stop.txt 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat stop.txt >&2; fail "exit $rc with logging.on_sink_error=save_and_stop"; }
grep -q "saving and stopping after iteration 2" stop.txt || { cat stop.txt >&2; fail "no stop after iteration 2"; }
[ "$(cat ckpt_stop/latest)" = iter_0000002 ] || fail "no checkpoint at iteration 2: $(cat ckpt_stop/latest 2>&1)"
rm run_stop/metrics.jsonl  # the disk has room again: the same command resumes
"$MT" --config tiny.yaml --set training.train_iters=6 --set logging.interval=2 --set logging.dir=run_stop \
      --set logging.on_sink_error=save_and_stop --set checkpoint.save_dir=ckpt_stop > resume.txt 2>&1 ||
  { cat resume.txt >&2; fail "resuming after the sink stop failed"; }
[ "$(cat ckpt_stop/latest)" = iter_0000006 ] || fail "the resumed run did not reach iteration 6"
echo "PASS: a failing metrics.jsonl warns and trains on; save_and_stop saves at iteration 2 and resumes"
