#!/usr/bin/env bash
# scripts/sweep.sh: a 2x1 grid of --set overrides trains two runs in their own directories and prints a table of
# final loss, validation loss and tokens/s; a failing point is reported in the table and fails the sweep.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
SWEEP=("$SRC/scripts/sweep.sh" --megatrain "$MT" --config tiny.yaml)
short=(--set training.train_iters=4 --set optimizer.warmup_iters=1 --set logging.interval=2
       --set logging.eval_interval=2 --set logging.eval_iters=1)
bash "${SWEEP[@]}" --out sw --grid optimizer.lr=1e-3,3e-3 --grid training.micro_batch_size=4 -- "${short[@]}" \
  > table.txt || { cat table.txt; fail "the sweep failed"; }
cat table.txt
for d in "sw/optimizer.lr=1e-3_training.micro_batch_size=4" "sw/optimizer.lr=3e-3_training.micro_batch_size=4"; do
  [ "$(grep -c '"loss"' "$d/metrics.jsonl")" -eq 2 ] || fail "$d: expected 2 training records"
  grep -q '"valid_loss"' "$d/metrics.jsonl" || fail "$d: no validation record"
  [ -d "$d/checkpoints" ] || fail "$d: the checkpoints are not in the run's directory"
done
grep -q "optimizer.lr  training.micro_batch_size  final_loss  valid_loss  tokens_per_s  status" table.txt ||
  fail "the table has no header"
# Two rows: the grid values, a loss, a validation loss and a throughput, all numbers, status ok.
[ "$(grep -cE '^(1e-3|3e-3) +4 +[0-9]+\.[0-9]{4} +[0-9]+\.[0-9]{4} +[0-9]+ +ok$' table.txt)" -eq 2 ] ||
  fail "expected two complete rows"
# The two learning rates give two different runs.
[ "$(awk '/ ok$/ {print $3}' table.txt | sort -u | wc -l)" -eq 2 ] || fail "both runs have the same final loss"
[ "$(wc -l < sw/summary.tsv)" -eq 3 ] || fail "summary.tsv should hold a header and two rows"

# A point that cannot run (8 is not divisible by micro batch 3): reported with its exit code 2 (a refused config), the others still run, exit 1.
rc=0
bash "${SWEEP[@]}" --out bad --grid training.micro_batch_size=3,4 -- "${short[@]}" > bad.txt || rc=$?
cat bad.txt
[ "$rc" -eq 1 ] || fail "a failed point should make the sweep exit 1, got $rc"
grep -qE '^3 +- +- +- +failed \(2\)$' bad.txt || fail "the failed point is not in the table"
grep -qE '^4 +[0-9.]+ +[0-9.]+ +[0-9]+ +ok$' bad.txt || fail "the point after the failure did not run"
grep -q "training.global_batch_size" bad.txt || fail "the failure's error is not shown"
echo "sweep ok"
