#!/usr/bin/env bash
# Llama 3.1+ rotary scaling to and from transformers' LlamaForCausalLM (issue 44, items 1 and 6): rope_type linear,
# llama3 (tied embeddings, as Llama 3.2 1B / 3B ship) and yarn, each on a tiny random model whose original context
# (16) is a quarter of its 64 positions, so the scaling changes the frequencies the test's sequences reach.
# - Each imports from transformers 5's rope_parameters with transformers' mean loss (fp32, within 1e-5 relative),
#   and from transformers 4's rope_theta + rope_scaling (the released checkpoints' config.json) with the same loss.
# - It trains from the import on one rank, in TP2 x PP2 (sequence parallel) and in CP2 with the same losses (within
#   1e-5); the trained checkpoint exports to a LlamaForCausalLM that transformers loads strictly with `megatrain
#   eval`'s loss, and greedy `generate` of 20 tokens on 5 prompts equals transformers' on the export.
# - What megatrain does not model is refused by name: rope_type dynamic, a partial rotary factor, an unknown rotary
#   key; model.rope_scaling with model.arch gpt, and llama3 without its original context.
# Skips (77), saying so, without the interop Python (scripts/python-env.sh).
source "$(dirname "$0")/lib/common.bash"
require_interop_python torch transformers
source "$SRC/tests/e2e/lib/hf_family.bash"
prepare_data

for rope in linear llama3 yarn; do
  tie=""
  [ "$rope" != llama3 ] || tie=--tie
  "$PY" "$TINY" make llama "$rope" --heads 4 --groups 2 --rope "$rope" $tie >make.log 2>&1 ||
    { cat make.log; fail "transformers could not make a Llama with $rope rotary scaling"; }
  check_import "$rope" "$rope.imp" 64
  grep -q "type: $rope" "$rope.imp/model.yaml" || fail "$rope: the import's model.yaml lacks its rope_scaling"
  # The same model as transformers 4.x wrote it: rope_theta beside rope_scaling.
  cp -r "$rope" "$rope.v4"
  edit_config "$rope.v4" 'p = c.pop("rope_parameters"); c["rope_theta"] = p.pop("rope_theta"); c["rope_scaling"] = p'
  "$MT" ckpt import "$rope.v4" --format hf --output "$rope.v4.imp" >import.log 2>&1 ||
    { cat import.log; fail "$rope: the transformers 4.x config.json did not import"; }
  cmp <(grep -v '^#' "$rope.imp/model.yaml") <(grep -v '^#' "$rope.v4.imp/model.yaml") ||
    fail "$rope: rope_scaling (4.x) and rope_parameters (5.x) import to different models"
  check_training_layouts "$rope.imp" "$rope.ckpt"
  check_export "$rope.ckpt" "$rope.hf" LlamaForCausalLM
  check_greedy "$rope.ckpt" "$rope.hf"
done
grep -q '"tie_word_embeddings": true' llama3.hf/config.json || fail "the tied llama3 model exported untied"

# Refusals, by name.
expect_import_refused yarn dynamic 'c["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 5000.0}' \
  'rope_type = "dynamic": megatrain models the rotary types default, linear, llama3 and yarn'
expect_import_refused yarn partial 'c["rope_parameters"]["partial_rotary_factor"] = 0.5' "partial_rotary_factor = 0.5"
expect_import_refused yarn unknown 'c["rope_parameters"]["short_factor"] = [1.0, 1.0]' \
  "short_factor = .*: megatrain does not model this rotary key"
write_config
expect_error "model.rope_scaling.type: llama3 with model.arch: gpt" --config tiny.yaml \
  --set model.rope_scaling.type=llama3 --set model.rope_scaling.original_max_position_embeddings=16
write_llama_config
expect_error "original_max_position_embeddings must be positive" --config llama.yaml --set model.rope_scaling.type=llama3
expect_error "dynamic is not implemented yet" --config llama.yaml --set model.rope_scaling.type=dynamic
echo "PASS"
