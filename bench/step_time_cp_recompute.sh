#!/usr/bin/env bash
# Step time on CPU ranks against the context-parallel degree (parallel.context 1, 2, 4; the ring and the all-gather)
# and against the recompute mode (none; selective core_attn, layernorm, mlp_act, all three; full; full of the first
# layer only, recompute_num_layers 1), with rank 0's peak memory and plan's prediction of both.
# The fastest and the median ms per iteration of iterations 2..ITERS (the first warms up) from metrics.jsonl: on a
# machine shared with other work the fastest is the least disturbed. A GPT of hidden 64,
# 4 heads, 4 layers at sequence 2048, one sample, fp32, dropout off (CP refuses it). CP ranks beyond the machine's
# cores share them: the CP rows are about memory and overheads, not speed-up, on a 2-core machine.
# Usage: bench/step_time_cp_recompute.sh [build/megatrain] [rates.yaml from `megatrain bench kernels`]
set -euo pipefail
MT=${1:-build/megatrain}
RATES=${2:-}
S=${S:-2048} ITERS=${ITERS:-8}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cat > "$work/b.yaml" <<YAML
model: {num_layers: 4, hidden_size: 64, num_heads: 4, ffn_hidden_size: 256, seq_length: $S, vocab_size: 257,
        dropout: 0, attention_dropout: 0}
training: {micro_batch_size: 1, global_batch_size: 1, train_iters: $ITERS, precision: fp32}
optimizer: {lr: 1.0e-4, warmup_iters: 1}
data: {synthetic: true}
logging: {dir: $work/run, interval: 1}
checkpoint: {save_dir: "", load: none}
YAML
rates=()
[ -n "$RATES" ] && rates=(--rates "$RATES")
printf '%-34s %6s %9s %9s %9s %10s %10s\n' layout ranks "min ms" "median ms" "plan ms" "peak MiB" "plan MiB"
row() {  # name ranks settings...
  local name=$1 n=$2; shift 2
  rm -rf "$work/run"
  OPENBLAS_NUM_THREADS=1 "$MT" --config "$work/b.yaml" --nproc "$n" "$@" >/dev/null 2>"$work/err" ||
    { tail -3 "$work/err"; echo "$name failed" >&2; exit 1; }
  "$MT" plan --config "$work/b.yaml" "$@" --world "$n" --gpu cpu ${rates[@]+"${rates[@]}"} --json > "$work/plan.json"
  python3 - "$name" "$n" "$work/run/metrics.jsonl" "$work/plan.json" <<'PY'
import json, statistics, sys
name, n, metrics, plan = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = [json.loads(l) for l in open(metrics) if '"ms_per_iter"' in l]
ms = [r["ms_per_iter"] for r in rows if r["iteration"] >= 2]
peak = max(r["peak_bytes"] for r in rows) / 2**20
p = json.load(open(plan))
print(f"{name:<34} {n:>6} {min(ms):9.1f} {statistics.median(ms):9.1f} {p['time_s']['total'] * 1e3:9.1f} "
      f"{peak:10.2f} {max(m['total_bytes'] for m in p['memory']) / 2**20:10.2f}")
PY
}
row "cp=1" 1
row "cp=2 p2p" 2 --set parallel.context=2
row "cp=2 allgather" 2 --set parallel.context=2 --set parallel.context_comm=allgather
row "cp=4 p2p" 4 --set parallel.context=4
row "cp=4 allgather" 4 --set parallel.context=4 --set parallel.context_comm=allgather
row "recompute none" 1 --set training.recompute=none
row "selective [core_attn]" 1 --set training.recompute=selective --set 'training.recompute_modules=[core_attn]'
row "selective [layernorm]" 1 --set training.recompute=selective --set 'training.recompute_modules=[layernorm]'
row "selective [mlp_act]" 1 --set training.recompute=selective --set 'training.recompute_modules=[mlp_act]'
row "selective [all three]" 1 --set training.recompute=selective \
  --set 'training.recompute_modules=[core_attn,layernorm,mlp_act]'
row "full" 1 --set training.recompute=full
row "full, recompute_num_layers 1" 1 --set training.recompute=full --set training.recompute_num_layers=1
row "cp=2 p2p + selective [all three]" 2 --set parallel.context=2 --set training.recompute=selective \
  --set 'training.recompute_modules=[core_attn,layernorm,mlp_act]'
row "cp=2 p2p + full" 2 --set parallel.context=2 --set training.recompute=full
