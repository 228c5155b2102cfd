"""Mean next-token loss of a Hugging Face GPT-2 export (model.safetensors + config.json), computed by an
independent NumPy implementation of GPT-2 as transformers defines it (Conv1D weights stored (in, out),
c_attn columns [q | k | v], gelu_new, LayerNorm with layer_norm_epsilon, tied or untied lm_head).

Usage: gpt2_numpy_loss.py EXPORT_DIR DATA_PREFIX SEQ_LENGTH SAMPLES
Samples are read in file order from the Megatron indexed dataset: sample j is tokens [j*S, j*S + S].
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import indexed_file  # noqa: E402


def read_tokens(prefix):
    return np.array(indexed_file.read_tokens(prefix), dtype=np.int64)


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def forward_loss(W, cfg, tokens, targets):
    T = tokens.shape[0]
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    D = C // H
    x = W["transformer.wte.weight"][tokens] + W["transformer.wpe.weight"][:T]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        h = layer_norm(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = h @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]
        q, k, v = (qkv[:, j * C:(j + 1) * C].reshape(T, H, D).transpose(1, 0, 2) for j in range(3))
        s = q @ k.transpose(0, 2, 1) / np.sqrt(D) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        a = a.transpose(1, 0, 2).reshape(T, C)
        x = x + a @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        h = layer_norm(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        h = gelu_new(h @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"])
        x = x + h @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    x = layer_norm(x, W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], eps)
    head = W["lm_head.weight"] if "lm_head.weight" in W else W["transformer.wte.weight"]
    logits = x @ head.T
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    return float((lse - logits[np.arange(T), targets]).sum())


def main():
    export_dir, prefix, S, K = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    cfg = json.load(open(f"{export_dir}/config.json"))
    W = {k: v.astype(np.float64) for k, v in load_file(f"{export_dir}/model.safetensors").items()}
    assert W["transformer.wte.weight"].shape[0] == cfg["vocab_size"], "wte rows != vocab_size"
    stream = read_tokens(prefix)
    total = 0.0
    for j in range(K):
        chunk = stream[j * S: j * S + S + 1]
        total += forward_loss(W, cfg, chunk[:-1], chunk[1:])
    print(f"{total / (K * S):.6f}")


if __name__ == "__main__":
    main()
