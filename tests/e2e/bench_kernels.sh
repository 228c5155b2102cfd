#!/usr/bin/env bash
# `megatrain bench kernels` on the CPU writes a rates file with every measured part (GEMM points, attention by
# sequence / head dimension / dropout, the per-element costs, Gloo's bandwidth and latency between two local
# ranks, the cores), and `megatrain plan --rates` reads it back into a prediction. A bad rates file fails naming
# the file and the key. (Whether the figures predict CPU runs within 20% is bench/plan_time.sh's, not a test's:
# timings depend on the machine's load.)
source "$(dirname "$0")/lib/common.bash"
"$MT" bench kernels --min-seconds 0.002 -o rates.yaml > bench.log || fail "bench kernels failed: $(tail -3 bench.log)"
for key in gemm_points attention_points norm_forward_s_per_element dropout_forward_s_per_element \
           cross_entropy_backward_s_per_logit intra_node_bytes_per_s intra_node_latency_s cores; do
  grep -q "^$key:" rates.yaml || fail "rates.yaml has no $key"
done
[ "$(grep -c "attention (T" bench.log)" = 18 ] || fail "expected 18 attention points (3 T x 3 D x dropout or not)"
grep -q "^cores: [1-9]" rates.yaml || fail "no positive core count in rates.yaml"
grep -q "gloo all-reduce between 2 ranks" bench.log || fail "no Gloo measurement"

cat > tiny.yaml <<'YAML'
model: {num_layers: 2, hidden_size: 64, num_heads: 4, seq_length: 64, vocab_size: 257}
training: {micro_batch_size: 2, global_batch_size: 8, train_iters: 1, precision: fp32, device: cpu}
optimizer: {lr: 1.0e-3}
data: {synthetic: true}
YAML
"$MT" plan --config tiny.yaml --world 2 --gpu cpu --rates rates.yaml --json > plan.json || fail "plan --rates failed"
python3 -c "import json; t = json.load(open('plan.json'))['time_s']; assert t['total'] > 0 and t['attention'] > 0, t" ||
  fail "plan --rates gave no time"

# Without measured rates, plan says the CPU figures are placeholders; with them it does not.
"$MT" plan --config tiny.yaml --world 2 --gpu cpu | grep -q "placeholders" || fail "no placeholder note without --rates"
! "$MT" plan --config tiny.yaml --world 2 --gpu cpu --rates rates.yaml | grep -q "placeholders" ||
  fail "a placeholder note with measured rates"

printf 'peak_flops: 1.0e9\nhbm_bytes_per_s: 1.0e9\nattention_points: [[64, 16]]\n' > bad.yaml
expect_error "bad.yaml: attention_points\[0\]: expected \[T, D, dropout, flops_per_s\]" \
  plan --config tiny.yaml --world 2 --gpu cpu --rates bad.yaml
echo "ok"
