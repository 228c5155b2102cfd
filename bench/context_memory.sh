#!/usr/bin/env bash
# Activation memory per rank against the context-parallel degree (parallel.context), measured on CPU ranks:
# per-layer bytes = (rank 0's activation peak with L2 layers - with L1 layers) / (L2 - L1), so the embedding, head
# and transient buffers cancel; it should fall as 1/CP (each rank holds T / CP tokens of every layer's
# activations; attention's transient key/value blocks are not kept). Usage: bench/context_memory.sh [build/megatrain]
set -euo pipefail
MT=${1:-build/megatrain}
S=1024 B=1 H=128 A=4 L1=1 L2=3
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cat > "$work/cp.yaml" <<YAML
model: {num_layers: $L1, hidden_size: $H, num_heads: $A, seq_length: $S, vocab_size: 257, dropout: 0,
        attention_dropout: 0}
training: {micro_batch_size: $B, global_batch_size: $B, train_iters: 2, precision: bf16}
optimizer: {lr: 1.0e-4, warmup_iters: 1}
data: {synthetic: true}
logging: {dir: $work/run, interval: 1}
YAML
peak() {  # layers cp comm -> activation peak bytes of rank 0
  rm -rf "$work/run"
  OPENBLAS_NUM_THREADS=1 "$MT" --config "$work/cp.yaml" --nproc "$2" --set model.num_layers=$1 \
    --set parallel.context=$2 --set parallel.context_comm=$3 >/dev/null 2>&1
  grep -o 'activations [0-9.]*' "$work/run/megatrain.log" | head -1 | awk '{print $2 * 1048576}'
}
printf '%-20s %14s %10s\n' layout "MiB per layer" "x CP=1"
base=
for row in "1 p2p" "2 p2p" "2 allgather" "4 p2p" "4 allgather"; do
  read -r cp comm <<<"$row"
  a=$(peak $L1 "$cp" "$comm"); b=$(peak $L2 "$cp" "$comm")
  per=$(python3 -c "print(($b - $a) / ($L2 - $L1))")
  base=${base:-$per}
  python3 -c "print(f'{\"cp=$cp $comm\":<20} {$per / 2**20:14.3f} {$per / $base:10.3f}')"
done
