#!/usr/bin/env bash
# Compares two megatrain binaries bit for bit on a tiny GPT (and its Llama and MoE twins) over a set of layouts
# (every parallelism, ZeRO-1/2/3, zero-bubble, context parallel, experts, LoRA, fp8): every loss, grad norm,
# validation loss and loss scale of metrics.jsonl must be identical. The restructuring rule ("losses
# bit-identical to the commit before") is checked with it.
#   scripts/bitcheck.sh OLD_BINARY NEW_BINARY [WORKDIR] [LAYOUT_NAME...]
# Layouts (name: overrides): see the table below. Exit 0 when all match, 1 otherwise.
set -uo pipefail
old=${1:?usage: bitcheck.sh OLD_BINARY NEW_BINARY [WORKDIR] [LAYOUT...]}
new=${2:?usage: bitcheck.sh OLD_BINARY NEW_BINARY [WORKDIR] [LAYOUT...]}
work=${3:-/tmp/bitcheck}
shift $(( $# >= 3 ? 3 : 2 ))
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
export OPENBLAS_NUM_THREADS=1

# Overrides that make tiny.yaml a Llama (grouped-query attention, SwiGLU, rotary) and its MLPs mixtures of experts.
llama="model.arch=llama model.num_query_groups=2 model.ffn_hidden_size=96"
moe="model.moe.num_experts=4 model.moe.top_k=2 model.moe.ffn_hidden_size=32 model.moe.aux_loss_coeff=0.01"
moesel="training.recompute=selective training.recompute_modules=[core_attn,layernorm,moe_act]"
declare -A layouts=(
  [fp32]="1|"
  [bf16]="1|training.precision=bf16"
  [fp16]="1|training.precision=fp16"
  [recompute]="1|training.recompute=full"
  [dp2]="2|parallel.data=2"
  [tp2sp]="2|parallel.tensor=2 parallel.sequence_parallel=true"
  [pp2vp2dp2]="4|parallel.pipeline=2 parallel.virtual_pipeline=2 parallel.data=2"
  [zero4]="4|parallel.data=4 parallel.distributed_optimizer=true"
  [tp2pp2dp2]="8|parallel.tensor=2 parallel.pipeline=2 parallel.data=2 parallel.sequence_parallel=true parallel.distributed_optimizer=true"
  [bf16tp2zero]="4|training.precision=bf16 parallel.tensor=2 parallel.data=2 parallel.distributed_optimizer=true"
  [zero2]="4|parallel.data=4 parallel.shard=gradients parallel.grad_bucket_size=2000"
  [zero3]="4|parallel.data=4 parallel.shard=parameters parallel.grad_bucket_size=2000"
  [zbh1]="4|parallel.pipeline=2 parallel.data=2 parallel.pipeline_schedule=zb-h1"
  [zbv]="2|parallel.pipeline=2 parallel.virtual_pipeline=2 parallel.pipeline_schedule=zb-v"
  [cp2]="2|parallel.context=2 model.dropout=0 model.attention_dropout=0"
  [llamacp2tp2]="4|$llama parallel.context=2 parallel.tensor=2 parallel.sequence_parallel=true model.dropout=0 model.attention_dropout=0"
  [moeep2]="4|$llama $moe parallel.data=4 parallel.expert=2 parallel.distributed_optimizer=true"
  [moefold]="4|$llama $moe parallel.tensor=2 parallel.data=2 parallel.expert=2 parallel.expert_tensor=1 parallel.sequence_parallel=true"
  [lora]="1|finetune.lora.rank=4 finetune.lora.random_base=true"
  [loratp2]="2|$llama finetune.lora.rank=4 finetune.lora.random_base=true parallel.tensor=2"
  [fp8]="1|training.precision=bf16 training.fp8.format=hybrid"
  [selective]="1|training.recompute=selective training.recompute_modules=[core_attn,layernorm,mlp_act]"
  [moeselsp]="2|$llama $moe $moesel parallel.tensor=2 parallel.sequence_parallel=true"
  [fp8tp2]="2|training.precision=bf16 training.fp8.format=hybrid parallel.tensor=2 parallel.sequence_parallel=true"
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(fp32 bf16 fp16 recompute dp2 tp2sp pp2vp2dp2 zero4 tp2pp2dp2 bf16tp2zero zero2 zero3 zbh1 zbv
                                   cp2 llamacp2tp2 moeep2 moefold lora loratp2 fp8 fp8tp2 selective moeselsp)

if [ ! -f "$work/data/text_document.idx" ]; then
  mkdir -p "$work/data"
  cat "$here"/README.md "$here"/app/*/*.cpp > "$work/data/text.txt"
  "$new" data prepare --input "$work/data/text.txt" --output "$work/data/text_document" --tokenizer byte >/dev/null ||
    { echo "bitcheck: data prepare failed" >&2; exit 1; }
fi
cat > "$work/tiny.yaml" <<YAML
model: {num_layers: 4, hidden_size: 32, num_heads: 4, ffn_hidden_size: 128, seq_length: 32, vocab_size: 257,
        dropout: 0.1, attention_dropout: 0.1}
training: {micro_batch_size: 2, global_batch_size: 16, train_iters: 10, precision: fp32, seed: 42, device: cpu}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup_iters: 5, weight_decay: 0.1, betas: [0.9, 0.95], grad_clip: 0.5}
data: {train: [$work/data/text_document], split: [90, 10, 0]}
checkpoint: {save_dir: "", load: none}
logging: {interval: 1, eval_interval: 5, eval_iters: 2}
YAML

# The fields that must match, one line per record (timings and memory excluded).
extract() {
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    keep = {k: r[k] for k in ("iteration", "loss", "grad_norm", "valid_loss", "loss_scale", "skipped_iters", "nan_iters", "lr") if k in r}
    # Values, not their spelling: 1 and 1.0 are the same loss scale.
    keep = {k: float(v) if isinstance(v, (int, float)) and k != "iteration" else v for k, v in keep.items()}
    print(json.dumps(keep, sort_keys=True))' "$1"
}

status=0
for name in "${names[@]}"; do
  spec=${layouts[$name]:-}
  [ -n "$spec" ] || { echo "bitcheck: unknown layout $name" >&2; exit 2; }
  n=${spec%%|*}
  sets=()
  for kv in ${spec#*|}; do sets+=(--set "$kv"); done
  for which in old new; do
    bin=$old; [ $which = new ] && bin=$new
    dir="$work/$name.$which"
    rm -rf "$dir"
    args=(--config "$work/tiny.yaml" --set "logging.dir=$dir" "${sets[@]}")
    [ "$n" -gt 1 ] && args+=(--nproc "$n")
    if ! "$bin" "${args[@]}" >"$dir.log" 2>&1; then
      echo "$name: $which run failed (log: $dir.log)"; tail -5 "$dir.log"; status=1; continue 2
    fi
    extract "$dir/metrics.jsonl" > "$dir.txt"
  done
  if [ ! -s "$work/$name.new.txt" ]; then
    echo "$name: no records in $work/$name.new/metrics.jsonl"; status=1
  elif cmp -s "$work/$name.old.txt" "$work/$name.new.txt"; then
    echo "$name: identical ($(wc -l < "$work/$name.new.txt") records)"
  else
    echo "$name: DIFFERENT"; diff "$work/$name.old.txt" "$work/$name.new.txt" | head -6; status=1
  fi
done
exit $status
