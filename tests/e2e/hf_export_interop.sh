#!/usr/bin/env bash
# The Hugging Face export means what transformers' GPT-2 means: an independent NumPy GPT-2 reading
# model.safetensors + config.json gives the loss `megatrain eval` prints on the same samples.
# Needs the interop Python (numpy, safetensors: scripts/python-env.sh); exits 77 (skipped), saying so, without it.
source "$(dirname "$0")/lib/common.bash"
require_interop_python numpy safetensors
prepare_data
write_config
for tie in true false; do
  rm -rf ckpt hf run
  "$MT" --config tiny.yaml --set training.train_iters=30 --set checkpoint.save_dir=ckpt \
        --set model.tie_embeddings=$tie >/dev/null
  "$MT" ckpt export ckpt --format hf --output hf >/dev/null
  ours=$("$MT" eval --checkpoint ckpt --data data/text_document --samples 6 --device cpu | sed -E 's/.*mean loss ([0-9.]+).*/\1/')
  theirs=$("$PY" "$SRC/tests/interop/gpt2_numpy_loss.py" hf data/text_document 32 6)
  python3 -c "import sys; a, b = float('$ours'), float('$theirs'); print(f'tie=$tie megatrain {a} numpy-gpt2 {b}'); sys.exit(abs(a - b) > 1e-4 * b)" \
    || fail "tie=$tie: losses differ"
done
