#!/usr/bin/env python3
"""Greedy continuation of token ids by transformers on a `megatrain ckpt export --format hf` directory.

    python3 tests/interop/hf_greedy_generate.py HF_DIR "ID ID ...[,ID ID ...]..." MAX_NEW_TOKENS

For each prompt (comma-separated lists of ids; one model load for all) prints a line of the new ids, space-separated, as `megatrain generate --greedy --ids` prints them: generate(do_sample=False)
in float32 on the CPU with the model class config.json names (GPT2LMHeadModel or LlamaForCausalLM), stopping at
config.json's eos_token_id (the tokenizer's end-of-document id) like megatrain.
Needs torch and transformers (tests/e2e/generate_interop.sh says where it looks for them).
"""
import sys

import torch
from transformers import AutoModelForCausalLM


def main():
    hf_dir, prompts, max_new = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    eos = model.config.eos_token_id
    for prompt in prompts:
        ids = [int(t) for t in prompt.split()]
        inputs = torch.tensor([ids], dtype=torch.long)
        with torch.no_grad():
            out = model.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=False,
                                 max_new_tokens=max_new, eos_token_id=eos, pad_token_id=eos)
        print(" ".join(str(int(t)) for t in out[0, len(ids):]))


if __name__ == "__main__":
    main()
