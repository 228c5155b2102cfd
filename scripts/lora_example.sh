#!/usr/bin/env bash
# The README's LoRA example, end to end on the CPU: a small Llama made with transformers is imported, a chat JSONL is
# rendered with its ChatML template, LoRA fine-tunes it, generate answers a prompt, and the adapter is exported for
# peft (and the merged model for transformers).
#   scripts/lora_example.sh [MEGATRAIN] [PYTHON with torch + transformers] [WORKDIR]
# PYTHON: by default the interop environment scripts/python-env.sh makes beside the binary (build/interop-venv).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
MT=$(realpath "${1:-$SRC/build/megatrain}")
PY=${2:-$(dirname "$MT")/interop-venv/bin/python}
WORK=${3:-$(mktemp -d /tmp/megatrain-lora.XXXXXX)}
mkdir -p "$WORK" && cd "$WORK"

# 1. A small Llama (4 query heads in 2 key/value groups, vocabulary 512) and a ChatML tokenizer, made in Python.
"$PY" "$SRC/tests/interop/hf_tiny_model.py" make llama llama-hf --heads 4 --groups 2 --vocab 512 --positions 128
source /dev/stdin <<<"$(sed -n '/^write_chatml_tokenizer()/,/^}/p' "$SRC/tests/e2e/lib/sft.bash")"
write_chatml_tokenizer && cp tok/* llama-hf/
"$MT" ckpt import llama-hf --format hf --output base

# 2. Conversations rendered with the tokenizer's chat template (auto: ChatML), with a loss mask on the answers.
python3 - <<'PY'
import json, random
rng = random.Random(0)
colours = "red blue green yellow".split()
with open("chat.jsonl", "w") as f:
    for _ in range(256):
        c = rng.choice(colours)
        f.write(json.dumps({"messages": [{"role": "user", "content": f"what colour is the {c} ball"},
                                         {"role": "assistant", "content": f"the ball is {c}"}]}) + "\n")
PY
"$MT" data prepare --input chat.jsonl --format chat --tokenizer hf --tokenizer-file llama-hf/tokenizer.json \
  --output sft

# 3. LoRA on every linear, the imported model frozen (its model keys from base/model.yaml).
{ grep -v '^#' base/model.yaml; cat <<'YAML'
training: {init_from: base, micro_batch_size: 8, global_batch_size: 16, train_iters: 60, precision: fp32, device: cpu}
optimizer: {lr: 1.0e-2, min_lr: 1.0e-3, warmup_iters: 5, weight_decay: 0.0}
data: {train: [sft], split: [95, 5, 0], sft_packing: pad}
checkpoint: {save_dir: lora/ckpt}
logging: {dir: lora, interval: 10}
finetune:
  lora: {rank: 8, alpha: 16, dropout: 0.05, targets: [qkv, proj, fc1, fc2]}
YAML
} >lora.yaml
sed -i "s/^  seq_length: .*/  seq_length: 64/" lora.yaml
"$MT" --config lora.yaml --nproc 2 --set parallel.tensor=2

# 4. Generate with the fine-tuned model (the adapters folded into the weights).
"$MT" generate --load lora/ckpt --prompt $'<|im_start|>user\nwhat colour is the blue ball<|im_end|>\n<|im_start|>assistant\n' \
  --max-new-tokens 16 --greedy

# 5. Export: a PEFT adapter for the base's Hugging Face export, and the merged model.
"$MT" ckpt export base --format hf --output base-hf
"$MT" ckpt export lora/ckpt --format hf --lora peft --output adapter
"$MT" ckpt export lora/ckpt --format hf --lora merged --output merged-hf
ls adapter merged-hf
