#!/usr/bin/env bash
# Qwen2 / Qwen2.5 to and from transformers' Qwen2ForCausalLM (issue 44, item 2): Llama's layers with biases on q, k
# and v (model.qkv_bias), sharded with their column-parallel weights.
# - A tiny random Qwen2ForCausalLM made by transformers (every weight and bias random, grouped-query attention,
#   untied, and a tied twin) imports with transformers' mean loss (fp32, within 1e-5 relative).
# - It trains from the import on one rank, in TP2 x PP2 (sequence parallel) and in CP2 with the same losses (within
#   1e-5); the trained checkpoint exports to a Qwen2ForCausalLM that transformers loads strictly with `megatrain
#   eval`'s loss, and greedy `generate` of 20 tokens on 5 prompts equals transformers' generate on the export.
# - Bad input is refused by name: use_sliding_window true (not modelled yet), model.qkv_bias with model.arch gpt.
# Skips (77), saying so, without the interop Python (scripts/python-env.sh).
source "$(dirname "$0")/lib/common.bash"
require_interop_python torch transformers
source "$SRC/tests/e2e/lib/hf_family.bash"
prepare_data

# Import, untied and tied: megatrain eval = transformers' loss.
for tie in "" --tie; do
  name=made${tie:+_tied}
  "$PY" "$TINY" make qwen2 "$name" --heads 4 --groups 2 $tie >make.log 2>&1 ||
    { cat make.log; fail "transformers could not make a Qwen2"; }
  check_import "$name" "$name.imp" 64
  grep -q "qkv_bias: true" "$name.imp/model.yaml" || fail "$name: the import's model.yaml lacks qkv_bias"
done

# Training from the import: one rank, TP2 x PP2 with sequence parallelism, CP2 alike; the trained checkpoint's
# export has its loss and its greedy continuations.
check_training_layouts made.imp ckpt
check_export ckpt hf Qwen2ForCausalLM
check_greedy ckpt hf

# Refusals, by name.
expect_import_refused made windowed 'c["use_sliding_window"] = True; c["sliding_window"] = 16' "use_sliding_window"
write_config
expect_error "model.qkv_bias" --config tiny.yaml --set model.qkv_bias=true
echo "PASS"
