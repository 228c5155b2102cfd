#!/usr/bin/env bash
# Running it for real (issue 15): the short progress line with elapsed time and ETA (the long one with
# logging.verbose_line), the model's total parameter count whatever the layout, fp16 overflow steps said in
# words, and the loss spike detector: log (nothing changes), skip (the step is not applied, counted as skipped)
# and stop (a checkpoint, exit 1, resume after the spike).
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
# An eager detector: every loss above the running mean of the last few is a spike (the tiny run's noisy curve
# has several in 30 iterations; the seed fixes which).
EAGER=(--set training.train_iters=30 --set training.loss_spike.window=2 --set training.loss_spike.warmup_iters=3
       --set training.loss_spike.sigmas=1e-9 --set training.loss_spike.ratio=1)

# The progress line and its record.
"$MT" --config tiny.yaml --set training.train_iters=30 --set logging.dir=plain > plain.txt
grep -Eq "iter 30/30 \| [0-9]+s ETA 0s \| loss [0-9.]+ \| lr [0-9.e+-]+ \| grad norm [0-9.]+ \| [0-9]+ tokens/s" \
  plain.txt || fail "no short progress line: $(grep 'iter 30' plain.txt)"
! grep " iter [0-9]*/" plain.txt | grep -q "consumed samples\|skipped\|loss scale" || fail "the short line shows what says nothing"
python3 - plain/metrics.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert all("elapsed_s" in r and "eta_s" in r for r in rows), "metrics lack elapsed_s / eta_s"
assert rows[-1]["eta_s"] == 0 and rows[-1]["elapsed_s"] >= rows[0]["elapsed_s"], rows[-1]
PY
"$MT" --config tiny.yaml --set training.train_iters=6 --set logging.verbose_line=true --set logging.dir=long \
  > long.txt
grep -q "iteration       6/6       | consumed samples .* | elapsed .* | ETA 0s" long.txt ||
  fail "logging.verbose_line: no long line"

# The total parameter count: one rank's equals TP 2 x PP 2's (tied embedding copies counted once). The
# vocabulary is padded to a multiple of 128 x TP and the padded rows are stored parameters: the one rank pads
# as TP 2 does (to 512).
count() { sed -n 's/.*model: gpt \([0-9]*\) parameters.*/\1/p' "$1"; }
"$MT" --config tiny.yaml --set training.train_iters=6 --set logging.dir=one \
  --set model.make_vocab_size_divisible_by=256 > one.txt
"$MT" --config tiny.yaml --set training.train_iters=6 --set logging.dir=tp2pp2 --nproc 4 \
  --set parallel.tensor=2 --set parallel.pipeline=2 > tp2pp2.txt
[ -n "$(count one.txt)" ] && [ "$(count one.txt)" = "$(count tp2pp2.txt)" ] ||
  fail "total parameters: one rank $(count one.txt), TP2xPP2 $(count tp2pp2.txt)"
grep -q "this rank holds" tp2pp2.txt || fail "no per-rank share in the model line"
grep -q "peak memory per rank (MiB): min .* (rank [0-9]), max .*; per pipeline stage" tp2pp2.txt ||
  fail "no per-rank peak memory at PP 2"

# fp16's overflow steps: said in words, the JSON null.
"$MT" --config tiny.yaml --set training.precision=fp16 --set training.train_iters=6 --set logging.dir=fp16 \
  > fp16.txt
grep -q "iter 1/6 .* grad norm overflow (step skipped) | loss scale" fp16.txt || fail "fp16 overflow not said"
! grep " iter [0-9]*/" fp16.txt | grep -q "nan" || fail "fp16 line still prints nan"
python3 -c 'import json,sys; r=json.loads(open("fp16/metrics.jsonl").readline()); assert r["grad_norm"] is None, r'

# log: warnings and records, and not one number changes.
"$MT" --config tiny.yaml "${EAGER[@]}" --set logging.dir=log > log.txt
grep -q "\[warning\] loss spike at iteration [0-9]*: loss [0-9.]*, running mean [0-9.]*" log.txt ||
  fail "action log: no spike warning"
[ "$(losses plain/metrics.jsonl 1 30)" = "$(losses log/metrics.jsonl 1 30)" ] || fail "action log changed losses"
# skip: the spikes' steps are not applied (counted as skipped); up to the first spike the run is the same.
"$MT" --config tiny.yaml "${EAGER[@]}" --set training.loss_spike.action=skip --set logging.dir=skip > skip.txt
python3 - log/metrics.jsonl skip/metrics.jsonl <<'PY'
import json, sys
def read(p):
    rows = [json.loads(l) for l in open(p)]
    return ([r for r in rows if r.get("event") == "loss_spike"], {r["iteration"]: r for r in rows if "loss" in r and "event" not in r})
log_spikes, log_rows = read(sys.argv[1])
spikes, rows = read(sys.argv[2])
assert log_spikes and spikes, "no spike records"
first = spikes[0]["iteration"]
assert first == log_spikes[0]["iteration"], (first, log_spikes[0])
assert all(rows[i]["loss"] == log_rows[i]["loss"] for i in range(1, first + 1)), "skip changed losses before a spike"
assert rows[first]["skipped_iters"] == 1 and rows[first - 1]["skipped_iters"] == 0, rows[first]
assert rows[30]["skipped_iters"] == len(spikes), (rows[30]["skipped_iters"], len(spikes))
assert rows[first + 1]["loss"] != log_rows[first + 1]["loss"], "the spike's step was applied"
assert all(s["action"] == "skip" for s in spikes)
print(f"skip: spikes at {[s['iteration'] for s in spikes]}")
PY
grep -q "training.loss_spike.action=skip: the step is not applied" skip.txt || fail "skip: no warning"
# stop: a checkpoint after the spike, exit 1 with the reason, and the resumed run goes on past it.
set +e
"$MT" --config tiny.yaml "${EAGER[@]}" --set training.loss_spike.action=stop --set logging.dir=stop \
  --set checkpoint.save_dir=ck > stop.txt 2> stop.err
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "stop: exit 0"
it=$(python3 -c 'import json; print([json.loads(l) for l in open("stop/metrics.jsonl") if "loss_spike" in l][0]["iteration"])')
grep -q "training stopped after iteration $it: loss spike" stop.err || fail "stop: no reason: $(cat stop.err)"
[ -d "ck/iter_$(printf %07d "$it")" ] || fail "stop: no checkpoint at iteration $it: $(ls ck)"
grep -q "skipped_iters: .1" "ck/iter_$(printf %07d "$it")/metadata.yaml" || fail "stop: the spike's step not skipped"
"$MT" --config tiny.yaml "${EAGER[@]}" --set logging.dir=stop --set checkpoint.save_dir=ck > resumed.txt
grep -q "resumed from ck/iter_$(printf %07d "$it") at iteration $it" resumed.txt || fail "stop: did not resume"
grep -q "iter 30/30" resumed.txt || fail "stop: the resumed run did not finish"
echo "loss spike ok (stop at iteration $it)"
