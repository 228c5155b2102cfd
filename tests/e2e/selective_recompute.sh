#!/usr/bin/env bash
# Selective recomputation (training.recompute: selective, issue 31): each layer drops the chosen tensors after its
# forward (core_attn, layernorm, mlp_act, moe_act) and recomputes them at the start of its backward from what it
# kept, with the same dropout keys: the losses equal the run without recomputation bit for bit (fp32) on GPT,
# Llama and a MoE Llama, in one rank and with TP, SP, PP, DP and ZeRO; each module lowers the measured activation
# peak, and all of them together lower it less than full recomputation does; full recomputation of only some layers
# (recompute_num_layers) keeps the losses and lands between. Bad keys are refused naming them.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
write_llama_config
write_moe_config
common=(--set model.num_layers=4 --set training.micro_batch_size=2 --set training.global_batch_size=8
        --set training.train_iters=5 --set parallel.timeout_s=60)
all="[core_attn, layernorm, mlp_act]"
for cfg in tiny llama moe; do
  modules=$all
  [ $cfg = moe ] && modules="[core_attn, layernorm, moe_act]"
  "$MT" --config $cfg.yaml "${common[@]}" --set logging.dir=${cfg}_none >/dev/null 2>${cfg}_none.err \
    || { tail -5 ${cfg}_none.err; fail "$cfg without recomputation"; }
  "$MT" --config $cfg.yaml "${common[@]}" --set training.recompute=selective \
        --set "training.recompute_modules=$modules" --set logging.dir=${cfg}_sel >/dev/null 2>${cfg}_sel.err \
    || { tail -5 ${cfg}_sel.err; fail "$cfg with selective recomputation"; }
  same_losses ${cfg}_none/metrics.jsonl ${cfg}_sel/metrics.jsonl 1 5 0
  # TP 2 + SP, PP 2, DP 2 with ZeRO: one rank's losses.
  "$MT" --config $cfg.yaml "${common[@]}" --nproc 8 --set parallel.tensor=2 --set parallel.sequence_parallel=true \
        --set parallel.pipeline=2 --set parallel.distributed_optimizer=true --set training.recompute=selective \
        --set "training.recompute_modules=$modules" --set logging.dir=${cfg}_sel8 >/dev/null 2>${cfg}_sel8.err \
    || { tail -5 ${cfg}_sel8.err; fail "$cfg with selective recomputation on 8 ranks"; }
  same_losses ${cfg}_none/metrics.jsonl ${cfg}_sel8/metrics.jsonl 1 5 1e-6
done

# Activation peaks (the log's "peak memory" line) of the Llama: none, each module alone, all, full.
act() { grep -o "activations [0-9.]*" "$1/megatrain.log" | tail -1 | cut -d' ' -f2; }
"$MT" --config llama.yaml "${common[@]}" --set training.recompute=full --set logging.dir=llama_full >/dev/null \
  2>llama_full.err || { tail -5 llama_full.err; fail "llama with full recomputation"; }
for m in core_attn layernorm mlp_act; do
  "$MT" --config llama.yaml "${common[@]}" --set training.recompute=selective --set "training.recompute_modules=[$m]" \
        --set logging.dir=llama_$m >/dev/null 2>llama_$m.err || { tail -5 llama_$m.err; fail "llama with $m"; }
done
# Full recomputation of only the first 2 of the 4 layers (training.recompute_num_layers, Megatron's block method).
"$MT" --config llama.yaml "${common[@]}" --set training.recompute=full --set training.recompute_num_layers=2 \
      --set logging.dir=llama_full2 >/dev/null 2>llama_full2.err || { tail -5 llama_full2.err; fail "llama, 2 layers"; }
same_losses llama_none/metrics.jsonl llama_full2/metrics.jsonl 1 5 0
same_losses llama_none/metrics.jsonl llama_full/metrics.jsonl 1 5 0
python3 - "$(act llama_none)" "$(act llama_core_attn)" "$(act llama_layernorm)" "$(act llama_mlp_act)" \
  "$(act llama_sel)" "$(act llama_full)" "$(act llama_full2)" <<'PY'
import sys
none, attn, norm, mlp, every, full, half = map(float, sys.argv[1:])
print(f"full recomputation of 2 of 4 layers: {half} MiB")
assert full < half < none, (full, half, none)
print(f"activation peak MiB: none {none}, core_attn {attn}, layernorm {norm}, mlp_act {mlp}, all three {every}, "
      f"full {full}")
for name, v in (("core_attn", attn), ("layernorm", norm), ("mlp_act", mlp)):
    assert v < none, f"{name} did not lower the activation peak: {v} vs {none}"
assert every < min(attn, norm, mlp), (every, attn, norm, mlp)
assert full < every, f"full recomputation keeps less than selective: {full} vs {every}"
PY

expect_error "training.recompute_num_layers: 2 is set, but training.recompute is none" --config tiny.yaml \
  --set training.recompute_num_layers=2
expect_error "training.recompute_modules: is set, but training.recompute is none" --config tiny.yaml \
  --set "training.recompute_modules=[core_attn]"
expect_error "training.recompute_modules\[0\]: expected one of core_attn, layernorm, mlp_act, moe_act, got 'attention'" \
  --config tiny.yaml --set training.recompute=selective --set "training.recompute_modules=[attention]"
expect_error "training.recompute_modules\[0\]: moe_act needs mixture-of-experts layers" --config tiny.yaml \
  --set training.recompute=selective --set "training.recompute_modules=[moe_act]"
echo "selective_recompute: ok"
