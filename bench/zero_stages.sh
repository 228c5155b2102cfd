#!/usr/bin/env bash
# Throughput and bytes moved per step of each ZeRO stage (parallel.shard none, optimizer, gradients, parameters) and
# of hybrid sharding in groups of 2 (parallel.shard_group 2), at DP 2 and DP 4 on CPU ranks (Gloo over loopback).
# Tokens/s from the median ms per iteration of iterations 2..ITERS (the first warms up) in metrics.jsonl, the
# fastest beside it (on a shared machine the least disturbed); bytes per step and rank over the data-parallel groups
# from metrics.jsonl's comm_bytes_by_group (parallel/comm/comm_counted.h: reduce-scatter, all-gather, all-reduce; the f64
# loss and norm sums left out), and rank 0's peak memory. A GPT of hidden 256, 4 layers of 4 heads, sequence 256,
# micro batch 4 per rank (one microbatch), fp32, dropout off; one BLAS thread a rank. DP ranks beyond the machine's
# cores share them: on a 2-core machine the DP 4 rows measure the overheads more than a speed-up.
# Usage: bench/zero_stages.sh [build/megatrain]
set -euo pipefail
MT=${1:-build/megatrain}
ITERS=${ITERS:-6}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cat > "$work/b.yaml" <<YAML
model: {num_layers: 4, hidden_size: 256, num_heads: 4, ffn_hidden_size: 1024, seq_length: 256, vocab_size: 257,
        dropout: 0, attention_dropout: 0, tie_embeddings: false}
training: {micro_batch_size: 4, global_batch_size: 4, train_iters: $ITERS, precision: fp32}
optimizer: {lr: 1.0e-4, warmup_iters: 1}
data: {synthetic: true}
logging: {dir: $work/run, interval: 1}
checkpoint: {save_dir: "", load: none}
parallel: {grad_bucket_size: 1000000}
YAML
echo "# $(date -u +%FT%TZ) $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo '?'); uptime:$(uptime)"
printf '%-26s %4s %9s %9s %10s %12s %12s %12s %12s %9s\n' layout dp "min ms" "median ms" "tokens/s" "RS MB" "AG MB" \
  "AR MB" "total MB" "peak MiB"
row() {  # name dp settings...
  local name=$1 n=$2; shift 2
  rm -rf "$work/run"
  OPENBLAS_NUM_THREADS=1 "$MT" --config "$work/b.yaml" --nproc "$n" --set training.global_batch_size=$((4 * n)) "$@" \
    >/dev/null 2>"$work/err" || { tail -3 "$work/err"; echo "$name failed" >&2; exit 1; }
  python3 - "$name" "$n" "$work/run/metrics.jsonl" <<'PY'
import json, statistics, sys
name, n, metrics = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [json.loads(l) for l in open(metrics) if '"ms_per_iter"' in l]
steps = [r for r in rows if r["iteration"] >= 2]
ms = [r["ms_per_iter"] for r in steps]
tok = [r["tokens_per_s"] for r in steps]
dp = steps[-1].get("comm_bytes_by_group", {}).get("dp", {})
mb = lambda k: dp.get(k, 0) / 1e6
total = sum(v for k, v in dp.items() if k != "scalars") / 1e6
peak = max(r["peak_bytes"] for r in rows) / 2**20
print(f"{name:<26} {n:>4} {min(ms):9.1f} {statistics.median(ms):9.1f} {statistics.median(tok):10.0f} "
      f"{mb('reduce_scatter'):12.3f} {mb('all_gather'):12.3f} {mb('all_reduce'):12.3f} {total:12.3f} {peak:9.2f}")
PY
}
for dp in 2 4; do
  for stage in none optimizer gradients parameters; do
    row "$stage" $dp --set parallel.shard=$stage
  done
  if [ $dp -eq 4 ]; then
    for stage in optimizer gradients parameters; do
      row "$stage, shard group 2" $dp --set parallel.shard=$stage --set parallel.shard_group=2
    done
  fi
done
