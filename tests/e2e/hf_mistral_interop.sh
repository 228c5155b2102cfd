#!/usr/bin/env bash
# Mistral to and from transformers' MistralForCausalLM (issue 44, item 5): Llama's layers, every one attending within
# a sliding window of the last W tokens (model.sliding_window), here much shorter than the sequences.
# - A tiny random MistralForCausalLM (every weight random, grouped-query attention, window 6, untied; a tied twin with
#   window 11) imports with transformers' mean loss (fp32, within 1e-5 relative) over 64-token samples.
# - It trains from the import on one rank, in TP2 x PP2 (sequence parallel) and in CP2 with the same losses (within
#   1e-5; CP2's 8-token chunks meet blocks the window hides wholly or in part); the trained checkpoint exports to a
#   MistralForCausalLM that transformers loads strictly with `megatrain eval`'s loss, and greedy `generate` of 20
#   tokens on 5 prompts (the KV cache's decode within the window) equals transformers' generate on the export.
# - Bad input is refused by name: a window that is no token count; exporting a window that spares the first layers
#   without Qwen's biases or QK-norm (Mistral slides every layer).
# Skips (77), saying so, without the interop Python (scripts/python-env.sh).
source "$(dirname "$0")/lib/common.bash"
require_interop_python torch transformers
source "$SRC/tests/e2e/lib/hf_family.bash"
prepare_data

"$PY" "$TINY" make mistral made --heads 4 --groups 2 --window 6 >make.log 2>&1 ||
  { cat make.log; fail "transformers could not make a Mistral"; }
"$PY" "$TINY" make mistral made_tied --heads 4 --groups 2 --window 11 --tie >make.log 2>&1 ||
  { cat make.log; fail "transformers could not make a tied Mistral"; }
check_import made made.imp 64
grep -q "sliding_window: 6" made.imp/model.yaml || fail "the import's model.yaml lacks sliding_window 6"
check_import made_tied made_tied.imp 64

check_training_layouts made.imp ckpt
check_export ckpt hf MistralForCausalLM
grep -q '"sliding_window": 6' hf/config.json || fail "the export's config.json lacks sliding_window 6"
check_greedy ckpt hf
check_training_layouts made_tied.imp ckpt_tied
check_export ckpt_tied hf_tied MistralForCausalLM
grep -q '"tie_word_embeddings": true' hf_tied/config.json || fail "the tied Mistral exported untied"

# Refusals, by name.
expect_import_refused made fractional 'c["sliding_window"] = 4.5' "sliding_window = 4.5 is not a window size"
write_llama_config
"$MT" --config llama.yaml --set model.sliding_window=4 --set model.full_attention_layers=1 --set training.train_iters=1 \
      --set optimizer.warmup_iters=0 --set checkpoint.save_dir=spared >spared.log 2>&1 ||
  { tail spared.log; fail "a window past the first layer did not train"; }
expect_error "model.sliding_window 4: with model.full_attention_layers 1: MistralForCausalLM slides every layer" \
  ckpt export spared --format hf --output spared.hf
echo "PASS"
