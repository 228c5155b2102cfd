#!/usr/bin/env bash
# training.fp8 (docs/fp8.md): the transformer layers' GEMMs in fp8, emulated exactly on the CPU.
# - bad input: fp8 with fp16 or fp32, an unknown format or recipe, an amax history of 0 are refused, naming keys;
# - the fp8 losses differ from bf16's (the fp8 path runs) but stay close, for GPT and Llama;
# - layout invariance: TP2 x PP2 x DP2 with SP, the distributed optimizer and interleaving, and TP2 + SP, give the
#   single-rank fp8 losses, with current and delayed scaling (hybrid format);
# - resume is exact with the delayed recipe (its amax histories and scales are in the checkpoint), and the
#   checkpoint resumes on another layout (TP2 + SP x PP2) with the single-rank losses.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
write_llama_config

fp8=(--set training.precision=bf16 --set training.fp8.format=hybrid)
expect_error "training.fp8.format" --config tiny.yaml --set training.fp8.format=e4m3 --set training.precision=fp16
expect_error "training.fp8.format" --config tiny.yaml --set training.fp8.format=e4m3
expect_error "training.fp8.format" --config tiny.yaml "${fp8[@]}" --set training.fp8.format=e4m4
expect_error "training.fp8.recipe" --config tiny.yaml "${fp8[@]}" --set training.fp8.recipe=lagged
expect_error "training.fp8.amax_history_len: must be positive" --config tiny.yaml "${fp8[@]}" \
  --set training.fp8.recipe=delayed --set training.fp8.amax_history_len=0
expect_error "training.fp8.amax_compute_algo: expected one of" --config tiny.yaml "${fp8[@]}" \
  --set training.fp8.recipe=delayed --set training.fp8.amax_compute_algo=mean
# A key that means nothing is refused, even at its default (issue 49, item 5): the history is the delayed recipe's,
# and every fp8 key is fp8's.
expect_error "training.fp8.amax_history_len: is set, but training.fp8.recipe is current" --config tiny.yaml \
  "${fp8[@]}" --set training.fp8.amax_history_len=1024
expect_error "training.fp8.margin: is set, but training.fp8.format is none" --config tiny.yaml \
  --set training.fp8.margin=0
expect_error "training.fp8.margin" --config tiny.yaml "${fp8[@]}" --set training.fp8.margin=-1

common=(--set model.num_layers=4 --set training.micro_batch_size=1 --set training.global_batch_size=8
        --set training.train_iters=6 --set parallel.timeout_s=60 --set parallel.grad_bucket_size=5000)

# fp8 against bf16: not identical (the GEMM inputs are quantised) yet close after 6 iterations.
for cfg in tiny llama; do
  "$MT" --config $cfg.yaml "${common[@]}" --set training.precision=bf16 --set logging.dir=${cfg}_bf16 >/dev/null
  "$MT" --config $cfg.yaml "${common[@]}" "${fp8[@]}" --set logging.dir=${cfg}_fp8 >/dev/null
  losses ${cfg}_bf16/metrics.jsonl 1 6 > a.txt
  losses ${cfg}_fp8/metrics.jsonl 1 6 > b.txt
  ! diff -q a.txt b.txt >/dev/null || fail "$cfg: fp8 losses equal bf16's: the fp8 GEMMs did not run"
  same_losses ${cfg}_bf16/metrics.jsonl ${cfg}_fp8/metrics.jsonl 1 6 2e-2
done
# The start log names fp8 when it is on; metrics.jsonl has the peak memory per kind of the log's first report.
grep -q "bf16 with fp8 GEMMs (hybrid, current scaling)" tiny_fp8/megatrain.log || fail "the start log does not name fp8"
! grep -q "with fp8 GEMMs" tiny_bf16/megatrain.log || fail "the bf16 run's start log names fp8"
python3 - tiny_fp8 <<'PY' || fail "metrics.jsonl's peak_bytes_by_kind differs from the log's peak memory line"
import json, re, sys
run = sys.argv[1]
line = next(l for l in open(f"{run}/megatrain.log") if "peak memory (MiB): " in l).split("peak memory (MiB): ")[1]
logged = {k: float(v) for k, v in (part.rsplit(" ", 1) for part in line.strip().split(" | "))}
first = next(json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"loss"' in l)
kinds = first["peak_bytes_by_kind"]
assert set(kinds) | {"total"} == set(logged), (sorted(kinds), sorted(logged))
for k, v in kinds.items():
    assert abs(v / 1048576 - logged[k]) < 0.006, (k, v / 1048576, logged[k])
assert abs(first["peak_bytes"] / 1048576 - logged["total"]) < 0.006
print("peak memory by kind in metrics.jsonl:", {k: round(v / 1048576, 2) for k, v in kinds.items()})
PY

# Layouts, with both recipes: one rank's fp8 losses.
for recipe in current delayed; do
  r=(--config tiny.yaml "${common[@]}" "${fp8[@]}" --set training.fp8.recipe=$recipe)
  [ "$recipe" = current ] || r+=(--set training.fp8.amax_history_len=4)
  "$MT" "${r[@]}" --set logging.dir=one_$recipe >/dev/null
  "$MT" "${r[@]}" --nproc 8 --set parallel.tensor=2 --set parallel.pipeline=2 --set parallel.virtual_pipeline=2 \
        --set parallel.sequence_parallel=true --set parallel.distributed_optimizer=true \
        --set logging.dir=full_$recipe >/dev/null 2>full_$recipe.err || { tail -5 full_$recipe.err; fail "8 ranks"; }
  same_losses one_$recipe/metrics.jsonl full_$recipe/metrics.jsonl 1 6 1e-2
  "$MT" "${r[@]}" --nproc 2 --set parallel.tensor=2 --set parallel.sequence_parallel=true \
        --set logging.dir=tp_$recipe >/dev/null 2>tp_$recipe.err || { tail -5 tp_$recipe.err; fail "TP2"; }
  same_losses one_$recipe/metrics.jsonl tp_$recipe/metrics.jsonl 1 6 1e-2
done

# Exact resume with delayed scaling (10 straight against 5 + resume + 5).
r=(--config llama.yaml --set training.train_iters=10 "${fp8[@]}" --set training.fp8.recipe=delayed
   --set training.fp8.amax_history_len=3)
"$MT" "${r[@]}" --set logging.dir=straight >/dev/null
"$MT" "${r[@]}" --set logging.dir=resumed --set checkpoint.save_dir=resumed/ckpt --exit-after 5 >/dev/null
"$MT" "${r[@]}" --set logging.dir=resumed --set checkpoint.save_dir=resumed/ckpt >/dev/null
losses straight/metrics.jsonl 6 10 > a.txt
losses resumed/metrics.jsonl 6 10 > b.txt
[ "$(wc -l < a.txt)" -eq 5 ] || fail "expected 5 losses, got $(wc -l < a.txt)"
diff a.txt b.txt || fail "fp8 delayed: losses after resume differ"
echo "fp8 delayed: iterations 6-10 identical after resume"
# The state is layout-free: the one-rank checkpoint at 5 resumes on TP2 (SP) x PP2 with one rank's losses.
cp -r resumed/ckpt other_ckpt
rm -rf other_ckpt/iter_0000010 && echo iter_0000005 > other_ckpt/latest
"$MT" "${r[@]}" --set logging.dir=other --set checkpoint.save_dir=other_ckpt --nproc 4 --set parallel.tensor=2 \
      --set parallel.sequence_parallel=true --set parallel.pipeline=2 >/dev/null 2>other.err || { tail -5 other.err; fail "TP2 x PP2 resume"; }
grep -q "resumed from other_ckpt/iter_0000005" other.err other/*.log 2>/dev/null || grep -rq "resume" other/metrics.jsonl ||
  fail "TP2 x PP2 did not resume"
same_losses straight/metrics.jsonl other/metrics.jsonl 6 10 1e-2
# Another history length is refused, naming the key.
expect_error "training.fp8.amax_history_len" "${r[@]}" --set training.fp8.amax_history_len=5 \
  --set training.train_iters=12 --set checkpoint.save_dir=resumed/ckpt
