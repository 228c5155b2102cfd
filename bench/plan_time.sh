#!/usr/bin/env bash
# Predicted (megatrain plan, calibrated by `megatrain bench kernels` on this machine) vs measured ms/iteration of
# CPU runs of a few shapes and layouts; prints a table (bench/NOTES.md keeps one). Not a test: timings vary
# with the machine's load (each layout runs twice and the faster run counts; the load average is printed).
# Usage: bench/plan_time.sh [MEGATRAIN_BINARY]
set -euo pipefail
MT=$(realpath "${1:-build/megatrain}")
WORK=$(mktemp -d /tmp/megatrain-plan-time.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
export OPENBLAS_NUM_THREADS=1  # one core per rank, as bench kernels measures
mkdir -p data
mapfile -t inputs < <(find /usr/share/common-licenses -type f | sort)
"$MT" data prepare --input "${inputs[@]}" --output data/text_document --tokenizer byte >/dev/null
"$MT" bench kernels -o rates.yaml >/dev/null
cat > base.yaml <<'YAML'
model: {num_layers: 4, hidden_size: 256, num_heads: 8, ffn_hidden_size: 1024, seq_length: 128, vocab_size: 257,
        dropout: 0.1, attention_dropout: 0.1}
training: {micro_batch_size: 4, global_batch_size: 16, train_iters: 9, precision: fp32, seed: 42, device: cpu}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup_iters: 0}
data: {train: [data/text_document], split: [95, 5, 0]}
checkpoint: {save_dir: "", load: none}
logging: {dir: run, interval: 3}
parallel: {timeout_s: 120}
YAML
layouts=(
  "tiny|1|--set model.hidden_size=64 --set model.num_heads=4 --set model.ffn_hidden_size=256 --set model.seq_length=64"
  "mid|1|"
  "mid-bf16|1|--set training.precision=bf16"
  "mid-recompute|1|--set training.recompute=full"
  "wide|1|--set model.hidden_size=512 --set model.ffn_hidden_size=2048 --set model.num_layers=2"
  "long|1|--set model.seq_length=512 --set training.micro_batch_size=1"
  "llama-mid|1|--set model.arch=llama --set model.num_query_groups=2 --set model.ffn_hidden_size=auto --set model.dropout=0 --set model.attention_dropout=0"
  "mid-tp2|2|--set parallel.tensor=2"
  "mid-tp2-sp|2|--set parallel.tensor=2 --set parallel.sequence_parallel=true"
  "mid-pp2|2|--set parallel.pipeline=2 --set training.micro_batch_size=2"
  "mid-pp2-vp2|2|--set parallel.pipeline=2 --set parallel.virtual_pipeline=2 --set training.micro_batch_size=2"
  "mid-dp2|2|"
  "mid-dp2-zero|2|--set parallel.distributed_optimizer=true"
  "tiny-dp4|4|--set model.hidden_size=64 --set model.num_heads=4 --set model.ffn_hidden_size=256 --set model.seq_length=64"
)
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-16s %6s %14s %15s %8s\n" layout ranks "measured ms" "predicted ms" error
for entry in "${layouts[@]}"; do
  IFS='|' read -r name world sets <<<"$entry"
  read -r -a args <<<"$sets"
  for round in 1 2; do  # twice, the faster kept: a run slowed by other work on the machine says little
    if [ "$world" -eq 1 ]; then
      "$MT" train --config base.yaml "${args[@]}" --set logging.dir=run_${name}_$round >/dev/null
    else
      "$MT" train --config base.yaml "${args[@]}" --set logging.dir=run_${name}_$round --nproc "$world" >/dev/null
    fi
  done
  "$MT" plan --config base.yaml "${args[@]}" --world "$world" --gpu cpu --rates rates.yaml --json > plan_$name.json
  python3 - "$name" "$world" plan_$name.json run_${name}_1/metrics.jsonl run_${name}_2/metrics.jsonl <<'PY'
import json, sys
name, world, plan, *metrics = sys.argv[1:]
# Per run the mean of iterations 4-9 (past the first iterations' warm-up); the faster run.
def mean_ms(path):
    rows = [json.loads(l) for l in open(path) if '"ms_per_iter"' in l][1:]
    return sum(r["ms_per_iter"] for r in rows) / len(rows)
measured = min(mean_ms(m) for m in metrics)
predicted = json.load(open(plan))["time_s"]["total"] * 1e3
print(f"{name:<16} {world:>6} {measured:>14.1f} {predicted:>15.1f} {100 * (predicted / measured - 1):>7.1f}%")
PY
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
