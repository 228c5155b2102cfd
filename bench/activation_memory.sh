#!/usr/bin/env bash
# Per-layer activation memory per rank, measured, against Korthikanti et al.'s formulas (16-bit activations).
# Per-layer bytes = (peak activations with L2 layers - with L1 layers) / (L2 - L1), so the embedding, head
# and transient buffers cancel. Usage: bench/activation_memory.sh [build/megatrain]
set -euo pipefail
MT=${1:-build/megatrain}
S=256 B=2 H=256 A=8 L1=2 L2=4
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cat > "$work/mid.yaml" <<YAML
model: {num_layers: $L1, hidden_size: $H, num_heads: $A, seq_length: $S, vocab_size: 257, dropout: 0.1,
        attention_dropout: 0.1}
training: {micro_batch_size: $B, global_batch_size: $B, train_iters: 2, precision: bf16}
optimizer: {lr: 1.0e-4}
data: {synthetic: true}
logging: {dir: $work/run, interval: 1}
YAML
peak() {  # layers tp sp recompute -> activation peak bytes of rank 0
  rm -rf "$work/run"
  OPENBLAS_NUM_THREADS=1 "$MT" --config "$work/mid.yaml" --nproc "$2" --set model.num_layers=$1 \
    --set parallel.tensor=$2 --set parallel.sequence_parallel=$3 --set training.recompute=$4 >/dev/null 2>&1
  grep -o 'activations [0-9.]*' "$work/run/megatrain.log" | head -1 | awk '{print $2 * 1048576}'
}
printf '%-28s %12s %12s %14s\n' layout "measured MiB" "formula MiB" "formula terms"
for row in "1 false none" "2 false none" "2 true none" "1 false full" "2 true full"; do
  read -r t sp rc <<<"$row"
  a=$(peak $L1 "$t" "$sp" "$rc"); b=$(peak $L2 "$t" "$sp" "$rc")
  python3 - "$a" "$b" "$t" "$sp" "$rc" <<PY
import sys
a, b, t, sp, rc = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "true", sys.argv[5]
s, bsz, h, heads = $S, $B, $H, $A
per_layer = (b - a) / ($L2 - $L1)
if rc == "full":
    formula, terms = 2 * s * bsz * h / (t if sp else 1), "2sbh (input only)" + ("/t" if sp else "")
elif sp:
    formula, terms = s * bsz * h * (34 + 5 * heads * s / h) / t, "sbh(34+5as/h)/t"
else:
    formula, terms = s * bsz * h * (10 + 24 / t + 5 * heads * s / (h * t)), "sbh(10+24/t+5as/(ht))"
name = f"tp={t} sp={'on' if sp else 'off'} recompute={rc}"
print(f"{name:<28} {per_layer / 2**20:12.2f} {formula / 2**20:12.2f} {terms:>22}")
PY
done
