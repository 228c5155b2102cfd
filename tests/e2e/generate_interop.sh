#!/usr/bin/env bash
# `megatrain generate --greedy` continues a prompt exactly as transformers' generate(do_sample=False) does on the
# Hugging Face export of the same checkpoint (GPT2LMHeadModel, float32, CPU), for tied and untied embeddings.
# Needs torch and transformers (5.x) in a venv: $TRANSFORMERS_VENV, or build/transformers-venv:
#   python3 -m venv build/transformers-venv && build/transformers-venv/bin/pip install torch transformers numpy
# Exits 77 (skipped), saying so, when that Python cannot import them.
source "$(dirname "$0")/lib/common.bash"
VENV=${TRANSFORMERS_VENV:-$(dirname "$MT")/transformers-venv}
if ! "$VENV/bin/python" -c "import torch, transformers" 2>/dev/null; then
  echo "SKIP: no Python with torch and transformers at $VENV (set TRANSFORMERS_VENV or create build/transformers-venv)"
  exit 77
fi
prepare_data
write_config
sed -i 's/seq_length: 32/seq_length: 64/' tiny.yaml  # every prompt plus 20 new tokens fits
for tie in true false; do
  rm -rf ckpt hf
  # Trained enough that its greedy text is more than spaces (see generate.sh).
  "$MT" --config tiny.yaml --set training.train_iters=200 --set model.hidden_size=64 --set model.ffn_hidden_size=256 \
        --set training.global_batch_size=16 --set optimizer.lr=1e-2 --set optimizer.min_lr=1e-3 \
        --set checkpoint.save_dir=ckpt --set model.tie_embeddings=$tie >/dev/null
  "$MT" ckpt export ckpt --format hf --output hf >/dev/null
  for prompt in "Permission is hereby granted to " "The GNU General Public License " "x"; do
    ids=$(printf '%s' "$prompt" | od -An -tu1 -v | xargs)  # the byte tokenizer's ids
    ours=$("$MT" generate --load ckpt --prompt "$prompt" --greedy --max-new-tokens 20 --ids --device cpu 2>/dev/null)
    theirs=$(HF_HUB_OFFLINE=1 "$VENV/bin/python" "$SRC/tests/interop/hf_greedy_generate.py" "$PWD/hf" "$ids" 20 2>py.err) ||
      { cat py.err >&2; fail "transformers failed"; }
    echo "tie=$tie prompt='$prompt'"
    echo "  megatrain:    $ours"
    echo "  transformers: $theirs"
    [ -n "$ours" ] && [ "$ours" = "$theirs" ] || fail "tie=$tie: greedy continuations differ"
  done
done
echo "PASS"
