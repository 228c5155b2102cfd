#!/usr/bin/env bash
# `megatrain generate --greedy` continues a prompt exactly as transformers' generate(do_sample=False) does on the
# Hugging Face export of the same checkpoint (float32, CPU): GPT2LMHeadModel with tied and untied embeddings, and
# LlamaForCausalLM with grouped-query attention (untied, rotary_base not the default) and multi-query attention
# (tied).
# Needs the interop Python (torch, transformers: scripts/python-env.sh); exits 77 (skipped), saying so, without it.
source "$(dirname "$0")/lib/common.bash"
require_interop_python torch transformers
source "$SRC/tests/e2e/lib/hf_family.bash"
prepare_data
write_config
write_llama_config
sed -i 's/seq_length: 32/seq_length: 64/' tiny.yaml llama.yaml  # every prompt plus 20 new tokens fits

# check LABEL CONFIG [--set ...]: trains CONFIG with the extra settings, exports it and compares the greedy
# continuations of three prompts.
check() {
  local label=$1 config=$2
  shift 2
  rm -rf ckpt hf run
  "$MT" --config "$config" --set training.global_batch_size=16 --set checkpoint.save_dir=ckpt "$@" >train.log 2>&1 ||
    { tail train.log >&2; fail "$label: training failed"; }
  "$MT" ckpt export ckpt --format hf --output hf >/dev/null
  echo "$label:"
  check_greedy ckpt hf "Permission is hereby granted to " "The GNU General Public License " "x"
}

# Trained enough that the greedy text is more than spaces (see generate.sh).
for tie in true false; do
  check "gpt tie=$tie" tiny.yaml --set training.train_iters=200 --set model.hidden_size=64 \
        --set model.ffn_hidden_size=256 --set optimizer.lr=1e-2 --set optimizer.min_lr=1e-3 --set model.tie_embeddings=$tie
done
check "llama G=4 untied" llama.yaml --set training.train_iters=100 --set optimizer.lr=1e-2 --set optimizer.min_lr=1e-3 \
      --set model.rotary_base=5000
check "llama G=1 tied" llama.yaml --set training.train_iters=200 --set optimizer.lr=1e-2 --set optimizer.min_lr=1e-3 \
      --set model.num_query_groups=1 --set model.tie_embeddings=true --set model.hidden_size=64 --set model.ffn_hidden_size=192
echo "PASS"
