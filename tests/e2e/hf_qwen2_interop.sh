#!/usr/bin/env bash
# Qwen2 / Qwen2.5 to and from transformers' Qwen2ForCausalLM (issue 44, item 2): Llama's layers with biases on q, k
# and v (model.qkv_bias), sharded with their column-parallel weights.
# - A tiny random Qwen2ForCausalLM made by transformers (every weight and bias random, grouped-query attention,
#   untied, and a tied twin) imports with transformers' mean loss (fp32, within 1e-5 relative).
# - It trains from the import on one rank, in TP2 x PP2 (sequence parallel) and in CP2 with the same losses (within
#   1e-5); the trained checkpoint exports to a Qwen2ForCausalLM that transformers loads strictly with `megatrain
#   eval`'s loss, and greedy `generate` of 20 tokens on 5 prompts equals transformers' generate on the export.
# - With use_sliding_window (issue 44, item 5): a window of 5 tokens over layer 1 (max_window_layers 1, so layer 0
#   attends fully) imports as model.sliding_window 5 past model.full_attention_layers 1, with the same checks
#   (import, TP2 x PP2, CP2, export, greedy) at sequences much longer than the window.
# - Bad input is refused by name: a sliding layer before a full one (layer_types), use_sliding_window with a window
#   of 0, model.qkv_bias with model.arch gpt.
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

# The sliding window past the first layer.
"$PY" "$TINY" make qwen2 windowed --heads 4 --groups 2 --window 5 --full-layers 1 >make.log 2>&1 ||
  { cat make.log; fail "transformers could not make a Qwen2 with a sliding window"; }
check_import windowed windowed.imp 64
grep -q "sliding_window: 5" windowed.imp/model.yaml && grep -q "full_attention_layers: 1" windowed.imp/model.yaml ||
  fail "the windowed import's model.yaml lacks sliding_window 5 past full_attention_layers 1"
check_training_layouts windowed.imp ckpt_windowed
check_export ckpt_windowed hf_windowed Qwen2ForCausalLM
grep -q '"max_window_layers": 1' hf_windowed/config.json && grep -q '"sliding_window": 5' hf_windowed/config.json ||
  fail "the windowed export's config.json lacks sliding_window 5 from layer 1"
check_greedy ckpt_windowed hf_windowed

# Refusals, by name.
expect_import_refused windowed slid_first 'c["layer_types"] = ["sliding_attention", "full_attention"]' \
  "layer_types holds \"full_attention\" at layer 1, after a sliding_attention layer"
expect_import_refused made zero_window 'c["use_sliding_window"] = True; c["sliding_window"] = 0; c.pop("layer_types", None); c["max_window_layers"] = 0' \
  "sliding_window = 0 with use_sliding_window true"
write_config
expect_error "model.qkv_bias" --config tiny.yaml --set model.qkv_bias=true
echo "PASS"
