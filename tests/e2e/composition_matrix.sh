#!/usr/bin/env bash
# The pairwise composition matrix (issue 45): every meaningful pair of {TP+SP, CP, PP 1F1B, interleaved, ZB-H1, ZB-V,
# DP, ZeRO-1, ZeRO-2, ZeRO-3, HSDP, offload, EP, MoE, fp8, LoRA, SFT packing, full, uniform and selective
# recompute, bf16, fp16} is on together in at least one run of a covering set that tests/e2e/lib/composition.py
# generates (each run turns on several features; at most 8 ranks). Each run trains 4 iterations of a 4-layer
# Llama (dropout on) and gives the losses of its reference, the one-rank run of the same model, data, recompute
# and precision features, within 1e-6 in fp32 and 1e-2 in bf16, fp16 and fp8; `megatrain plan` predicts its rank
# 0's peak memory within 5%. The pairs and the run covering each are printed; each pair refused as meaningless is
# refused by the config with its reason; docs/parallelism.md's composition table is the generator's.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/sft.bash"
GEN="$SRC/tests/e2e/lib/composition.py"
prepare_data
prepare_chat_data 96  # sft.bin and its loss mask (tok/: a 512-id vocabulary)
cat > comp.yaml <<'YAML'
model: {arch: llama, num_layers: 4, hidden_size: 64, num_heads: 8, num_query_groups: 4, ffn_hidden_size: 192,
        seq_length: 32, vocab_size: 512, rotary_base: 10000, dropout: 0.1, attention_dropout: 0.1}
training: {micro_batch_size: 1, global_batch_size: 8, train_iters: 4, precision: fp32, seed: 42, device: cpu}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup_iters: 1, weight_decay: 0.1, betas: [0.9, 0.95]}
data: {train: [data/text_document], split: [100, 0, 0]}
parallel: {timeout_s: 120, grad_bucket_size: 3000}
checkpoint: {save_dir: "", load: auto}
logging: {dir: run, interval: 1, eval_interval: 0}
YAML

echo "== the pairs and the run covering each"
python3 "$GEN" pairs | tee pairs.txt
echo "$(wc -l < pairs.txt) pairs"

echo "== refused pairs: refused by the config with their reason"
while read -r line; do
  phrase=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["phrase"])' "$line")
  mapfile -t sets < <(python3 -c 'import json,sys; [print(s) for s in json.loads(sys.argv[1])["sets"]]' "$line")
  args=(--config comp.yaml --nproc "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["world"])' "$line")")
  for s in "${sets[@]}"; do args+=(--set "$s"); done
  expect_error "$phrase" "${args[@]}"
done < <(python3 "$GEN" refused)

echo "== docs/parallelism.md's composition table is the generator's"
python3 - "$SRC/docs/parallelism.md" <(python3 "$GEN" markdown) <<'PY'
import sys
doc, gen = open(sys.argv[1]).read(), open(sys.argv[2]).read().strip()
begin, end = "<!-- composition table: tests/e2e/lib/composition.py markdown -->", "<!-- end of composition table -->"
assert begin in doc and end in doc, "docs/parallelism.md has no composition table markers"
table = doc.split(begin, 1)[1].split(end, 1)[0].strip()
assert table == gen, "docs/parallelism.md's composition table is not the generator's: regenerate it with " \
                     "`python3 tests/e2e/lib/composition.py markdown`"
print("the table matches")
PY

echo "== the runs"
python3 "$GEN" runs > runs.jsonl
count=0
while read -r line; do
  eval "$(python3 - "$line" <<'PY'
import json, shlex, sys
r = json.loads(sys.argv[1])
print(f"name={r['name']} world={r['world']} ref={r['reference']['name']} tol={r['tolerance']}")
print("features=" + shlex.quote(", ".join(r["features"])))
print("sets=(" + " ".join(f"--set {shlex.quote(s)}" for s in r["sets"]) + ")")
print("ref_sets=(" + " ".join(f"--set {shlex.quote(s)}" for s in r["reference"]["sets"]) + ")")
PY
)"
  if [ ! -d "$ref" ]; then
    "$MT" --config comp.yaml ${ref_sets[@]+"${ref_sets[@]}"} --set logging.dir=$ref >/dev/null 2>$ref.err \
      || { tail -5 $ref.err; fail "$ref failed"; }
  fi
  "$MT" --config comp.yaml --nproc $world "${sets[@]}" --set logging.dir=$name >/dev/null 2>$name.err \
    || { tail -5 $name.err; fail "$name ($features) failed"; }
  same_losses $ref/metrics.jsonl $name/metrics.jsonl 1 4 $tol || fail "$name ($features) differs from $ref"
  "$MT" plan --config comp.yaml "${sets[@]}" --world $world --gpu cpu --json > plan_$name.json \
    || fail "$name: plan failed"
  python3 - $name "$features" plan_$name.json $name/megatrain.log <<'PY'
import json, re, sys
name, features, plan_path, log = sys.argv[1:5]
line = next(l for l in open(log) if "peak memory (MiB):" in l)
measured = {k: float(v) for k, v in re.findall(r"(\w+) ([0-9.]+)", line.split("):", 1)[1])}
plan = json.load(open(plan_path))["memory"][0]
predicted = plan["total_bytes"] / 1048576
# tests/e2e/plan_memory.sh's rule for Gloo's reducer threads (sharded gradients or parameters): they may free a
# transient bucket sooner than plan's program order holds it, and their workspaces may overlap.
threads = "ZeRO-2" in features or "ZeRO-3" in features
below = plan["transient_grad_bytes"] / 1048576 if threads else 0.0
above = plan["peak_bytes"]["workspace"] / 1048576 if threads else 0.0
err = (predicted - measured["total"]) / measured["total"]
note = f" (Gloo threads: down to {below:.3f} MiB below, {above:.3f} above)" if threads else ""
print(f"{name} [{features}]: losses match; peak memory {measured['total']:.2f} MiB, plan {predicted:.3f} MiB "
      f"({100 * err:+.1f}%){note}")
assert predicted * 0.95 - below <= measured["total"] <= predicted * 1.05 + above, \
    f"{name}: plan's memory {predicted:.3f} MiB is not within 5% of the measured {measured['total']:.2f}"
PY
  count=$((count + 1))
done < runs.jsonl
[ $count -eq "$(wc -l < runs.jsonl)" ] || fail "ran $count of $(wc -l < runs.jsonl) runs"
echo "all $count runs equal their references; every pair of $(wc -l < pairs.txt) covered"
