# sft.bash: supervised fine-tuning fixtures for the e2e tests (issue 28).

# tok/: the Llama-3-style test tokenizer with its reserved specials 2 and 3 renamed <|im_start|> and <|im_end|>,
# and a tokenizer_config.json naming the ChatML template (as sft_data.sh).
write_chatml_tokenizer() {
  mkdir -p tok
  python3 - "$SRC/tests/data/tokenizer/llama3-tokenizer.json" tok <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for k, name in ((2, "<|im_start|>"), (3, "<|im_end|>")):
    del j["model"]["vocab"][j["added_tokens"][k]["content"]]
    j["added_tokens"][k]["content"] = name
    j["model"]["vocab"][name] = k
json.dump(j, open(sys.argv[2] + "/tokenizer.json", "w"))
chatml = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
json.dump({"chat_template": chatml, "eos_token": "<|im_end|>"}, open(sys.argv[2] + "/tokenizer_config.json", "w"))
PY
}

# chat.jsonl: $1 conversations (default 64) of varied length, prompts and answers made of a few words, prepared
# with the ChatML template into sft.bin/.idx and its loss mask sft_mask.bin/.idx.
prepare_chat_data() {
  write_chatml_tokenizer
  python3 - "${1:-64}" <<'PY'
import json, random, sys
rng = random.Random(7)
words = "the cat sat on a mat and saw red blue green fish in water while birds sang over hills".split()
def text(lo, hi):
    return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))
with open("chat.jsonl", "w") as f:
    for i in range(int(sys.argv[1])):
        if i % 3 == 0:
            f.write(json.dumps({"prompt": text(2, 12), "response": text(1, 6)}) + "\n")
        else:
            f.write(json.dumps({"messages": [{"role": "user", "content": text(3, 20)},
                                             {"role": "assistant", "content": text(1, 10)}]}) + "\n")
PY
  "$MT" data prepare --input chat.jsonl --tokenizer hf --tokenizer-file tok/tokenizer.json --format chat \
    --output sft >/dev/null
}

# sft.yaml: the tiny GPT on the chat data (vocabulary 512 for the tokenizer's ids), 4 layers, dropout on.
write_sft_config() {
  cat >sft.yaml <<'YAML'
model: {num_layers: 4, hidden_size: 32, num_heads: 4, ffn_hidden_size: 128, seq_length: 32, vocab_size: 512,
        dropout: 0.1, attention_dropout: 0.1}
training: {micro_batch_size: 1, global_batch_size: 8, train_iters: 6, precision: fp32, seed: 42, device: cpu}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup_iters: 2, weight_decay: 0.1, betas: [0.9, 0.95]}
data: {train: [sft], split: [90, 10, 0]}
parallel: {timeout_s: 60, grad_bucket_size: 5000}
checkpoint: {save_dir: "", load: auto}
logging: {dir: run, interval: 1, eval_interval: 3, eval_iters: 1}
YAML
}

# same_valid A B: the validation losses of metrics files A and B are at the same iterations and within 1e-6.
same_valid() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def v(p): return {r["iteration"]: r["valid_loss"] for r in map(json.loads, open(p)) if "valid_loss" in r}
a, b = v(sys.argv[1]), v(sys.argv[2])
assert a and sorted(a) == sorted(b), (a, b)
worst = max(abs(a[i] - b[i]) / abs(a[i]) for i in a)
print(f"validation {sys.argv[2]} vs {sys.argv[1]}: worst relative difference {worst:.2e} (tolerance 1e-6)")
assert worst <= 1e-6, f"validation losses differ: {a} vs {b}"
PY
}
