#!/usr/bin/env bash
# Uniform full recomputation (training.recompute_method: uniform, issue 45): each model chunk's layers in groups of
# recompute_num_layers, each group checkpointed as one (its input kept, its forward run again in backward). Groups
# of 1, 2 and sizes that do not divide a chunk's layers give the losses of the run without recomputation bit for
# bit (fp32, dropout on), in one rank, with TP 2 + SP and PP 2 (1F1B), interleaved ZB-V, ZeRO-3, context
# parallelism, LoRA, fp8 and on a MoE Llama with expert parallelism; the same layout without recomputation is
# the reference of each (and one rank's that of TP 2 + SP with PP 2, within 1e-6). The measured activation peak
# falls below no recomputation's for every group size; groups of 1 hold what per-layer (block) recomputation holds.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
write_llama_config
write_moe_config
common=(--set model.num_layers=6 --set training.micro_batch_size=2 --set training.global_batch_size=8
        --set training.train_iters=5 --set parallel.timeout_s=60)
uniform() { echo "--set training.recompute=full --set training.recompute_method=uniform --set training.recompute_num_layers=$1"; }
# run NAME CONFIG NPROC ARGS...: a run logged in NAME/.
run() {
  local name=$1 cfg=$2 n=$3; shift 3
  local launch=()
  [ "$n" -gt 1 ] && launch=(--nproc "$n")
  "$MT" --config "$cfg" "${common[@]}" "${launch[@]}" "$@" --set logging.dir="$name" >/dev/null 2>"$name.err" ||
    { tail -5 "$name.err"; fail "$name"; }
}
act() { grep -o "activations [0-9.]*" "$1/megatrain.log" | tail -1 | cut -d' ' -f2; }

# One rank: groups of 1 (per-layer), 2 (2+2+2), 4 (4+2) and 6 (the whole model); block's per-layer full beside.
run llama_none llama.yaml 1
run llama_block llama.yaml 1 --set training.recompute=full
for g in 1 2 4 6; do
  # shellcheck disable=SC2046
  run llama_u$g llama.yaml 1 $(uniform $g)
  same_losses llama_none/metrics.jsonl llama_u$g/metrics.jsonl 1 5 0
done
same_losses llama_none/metrics.jsonl llama_block/metrics.jsonl 1 5 0
python3 - "$(act llama_none)" "$(act llama_block)" "$(act llama_u1)" "$(act llama_u2)" "$(act llama_u4)" \
  "$(act llama_u6)" <<'PY'
import sys
none, block, u1, u2, u4, u6 = map(float, sys.argv[1:])
print(f"activation peak MiB: none {none}, block (every layer) {block}, uniform groups of 1 {u1}, 2 {u2}, 4 {u4}, 6 {u6}")
assert abs(u1 - block) <= 0.011, "groups of 1 are per-layer recomputation"
for g, v in ((1, u1), (2, u2), (4, u4), (6, u6)):
    assert v < none, f"uniform groups of {g} did not lower the activation peak: {v} vs {none}"
PY

# Layouts, each against itself without recomputation (PP 2 gives chunks of 3 layers, ZB-V's 12 layers over 4
# chunks too: groups of 2 are 2+1), TP 2 + SP with PP 2 also against one rank. name|config|ranks|layout
layouts=(
  "tp2sp_pp2|llama|4|--set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.pipeline=2"
  "pp2vp2_zbv|llama|2|--set model.num_layers=12 --set parallel.pipeline=2 --set parallel.virtual_pipeline=2 --set parallel.pipeline_schedule=zb-v"
  "dp2_zero3|llama|2|--set parallel.shard=parameters --set parallel.grad_bucket_size=2000"
  "cp2|llama|2|--set model.dropout=0 --set model.attention_dropout=0 --set parallel.context=2"
  "moe_ep2_pp2|moe|4|--set parallel.expert=2 --set parallel.pipeline=2"
  "lora|tiny|1|--set finetune.lora.rank=4 --set finetune.lora.random_base=true"
)
for entry in "${layouts[@]}"; do
  IFS='|' read -r name cfg n sets <<<"$entry"
  read -r -a args <<<"$sets"
  run ${name}_none $cfg.yaml "$n" "${args[@]}"
  for g in 1 2; do
    # shellcheck disable=SC2046
    run ${name}_u$g $cfg.yaml "$n" "${args[@]}" $(uniform $g)
    same_losses ${name}_none/metrics.jsonl ${name}_u$g/metrics.jsonl 1 5 0
  done
done
same_losses llama_none/metrics.jsonl tp2sp_pp2_u2/metrics.jsonl 1 5 1e-6
python3 - "$(act tp2sp_pp2_none)" "$(act tp2sp_pp2_u2)" "$(act moe_ep2_pp2_none)" "$(act moe_ep2_pp2_u2)" <<'PY'
import sys
a, b, c, d = map(float, sys.argv[1:])
print(f"activation peak MiB, rank 0: TP2+SP PP2 none {a}, uniform 2 {b}; MoE EP2 PP2 none {c}, uniform 2 {d}")
assert b < a and d < c, (a, b, c, d)
PY
# A MoE model in one rank, groups of 4 (4+2), and fp8 (bf16 with hybrid fp8 GEMMs) with groups of 4.
run moe_none moe.yaml 1
run moe_u4 moe.yaml 1 $(uniform 4)
same_losses moe_none/metrics.jsonl moe_u4/metrics.jsonl 1 5 0
fp8=(--set training.precision=bf16 --set training.fp8.format=hybrid)
run fp8_none llama.yaml 1 "${fp8[@]}"
run fp8_u4 llama.yaml 1 "${fp8[@]}" $(uniform 4)
same_losses fp8_none/metrics.jsonl fp8_u4/metrics.jsonl 1 5 0

expect_error "training.recompute_num_layers: 0 with training.recompute_method: uniform: set the layers of each" \
  --config tiny.yaml --set training.recompute=full --set training.recompute_method=uniform
expect_error "training.recompute_method: uniform is set, but training.recompute is none" --config tiny.yaml \
  --set training.recompute_method=uniform
expect_error "training.recompute_num_layers: 3 is more than model.num_layers=2" --config tiny.yaml \
  --set training.recompute=full --set training.recompute_method=uniform --set training.recompute_num_layers=3
echo "uniform_recompute: ok"
