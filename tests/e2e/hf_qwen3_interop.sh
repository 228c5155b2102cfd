#!/usr/bin/env bash
# Qwen3 to and from transformers' Qwen3ForCausalLM (issue 44, item 3): Llama's layers with QK-norm (each query and
# key head RMS-normalized before the rotary embeddings, model.qk_norm) and an explicit head_dim (model.head_dim,
# here 12 where hidden / heads is 8, so the attention's width H * D differs from the hidden size).
# - A tiny random Qwen3ForCausalLM (every weight random, the q/k norms' weights 1 + noise, grouped-query attention,
#   untied with head_dim 12; a tied twin with head_dim hidden / heads) imports with transformers' mean loss (fp32,
#   within 1e-5 relative).
# - It trains from the import on one rank, in TP2 x PP2 (sequence parallel) and in CP2 with the same losses (within
#   1e-5); the trained checkpoint exports to a Qwen3ForCausalLM that transformers loads strictly with `megatrain
#   eval`'s loss, and greedy `generate` of 20 tokens on 5 prompts equals transformers' generate on the export.
# - A Qwen3 with a sliding window of 5 past layer 0 imports with transformers' loss and exports with eval's.
# - Bad input is refused by name: a sliding window that is not a token count, attention_bias true (o_proj biases),
#   an odd head_dim; model.qk_norm with model.arch gpt; exporting QK-norm beside q/k/v biases (no HF family).
# Skips (77), saying so, without the interop Python (scripts/python-env.sh).
source "$(dirname "$0")/lib/common.bash"
require_interop_python torch transformers
source "$SRC/tests/e2e/lib/hf_family.bash"
prepare_data

"$PY" "$TINY" make qwen3 made --heads 4 --groups 2 --head-dim 12 >make.log 2>&1 ||
  { cat make.log; fail "transformers could not make a Qwen3"; }
"$PY" "$TINY" make qwen3 made_tied --heads 4 --groups 2 --tie >make.log 2>&1 ||
  { cat make.log; fail "transformers could not make a tied Qwen3"; }
for name in made made_tied; do
  check_import "$name" "$name.imp" 64
  grep -q "qk_norm: true" "$name.imp/model.yaml" || fail "$name: the import's model.yaml lacks qk_norm"
done
grep -q "head_dim: 12" made.imp/model.yaml || fail "the import's model.yaml lacks head_dim 12"

check_training_layouts made.imp ckpt
check_export ckpt hf Qwen3ForCausalLM
grep -q '"head_dim": 12' hf/config.json || fail "the export's config.json lacks head_dim 12"
check_greedy ckpt hf
check_training_layouts made_tied.imp ckpt_tied
check_export ckpt_tied hf_tied Qwen3ForCausalLM
grep -q '"tie_word_embeddings": true' hf_tied/config.json || fail "the tied Qwen3 exported untied"

# A sliding window of 5 past layer 0 (use_sliding_window, max_window_layers 1) imports and exports back.
"$PY" "$TINY" make qwen3 windowed --heads 4 --groups 2 --window 5 --full-layers 1 >make.log 2>&1 ||
  { cat make.log; fail "transformers could not make a Qwen3 with a sliding window"; }
check_import windowed windowed.imp 64
grep -q "full_attention_layers: 1" windowed.imp/model.yaml || fail "the windowed import lacks full_attention_layers 1"
check_export windowed.imp hf_windowed Qwen3ForCausalLM 64

# Refusals, by name.
expect_import_refused made wide_window 'c["use_sliding_window"] = True; c["sliding_window"] = "wide"; c.pop("layer_types", None); c["max_window_layers"] = 0' \
  "sliding_window = \"wide\" is not a window size"
expect_import_refused made biased 'c["attention_bias"] = True' "attention_bias = true"
expect_import_refused made odd 'c["head_dim"] = 7' "head_dim = 7: rotary embeddings rotate pairs"
write_config
expect_error "model.qk_norm: true with model.arch: gpt" --config tiny.yaml --set model.qk_norm=true
write_llama_config
"$MT" --config llama.yaml --set model.qk_norm=true --set model.qkv_bias=true --set training.train_iters=1 --set optimizer.warmup_iters=0 \
      --set checkpoint.save_dir=biasnorm >biasnorm.log 2>&1 || { tail biasnorm.log; fail "QK-norm with biases did not train"; }
expect_error "model.qk_norm true with model.qkv_bias: no Hugging Face model computes it" \
  ckpt export biasnorm --format hf --output biasnorm.hf
echo "PASS"
