#!/usr/bin/env python3
"""Checks a `megatrain ckpt export DIR --format hf --output OUT` result against Hugging Face's loaders.

    python3 tests/interop/check_hf_export.py OUT [--checkpoint CKPT] [--tokens 1,2,3]

Always: parses OUT/model.safetensors by hand (header length, JSON, 8-byte alignment, offsets tiling the data)
and checks OUT/config.json against the tensor shapes. Then, if `transformers` and `torch` import, loads
GPT2LMHeadModel.from_pretrained(OUT) strictly (no missing or unexpected weights), runs a forward pass and checks
the logits are finite with the right shape. With --checkpoint (the exported megatrain checkpoint directory, and
numpy + pyyaml importable) it also runs a numpy forward pass over the checkpoint's own tensors in megatrain's
layout (per-head interleaved QKV rows, (out, in) weights, padded vocabulary) and requires transformers' logits
to match it: the check that the export's de-interleaving and transposes are right.
Prints SKIP for the part it cannot run; exits non-zero on failure.
Not part of ctest: it needs Python packages the C++ build does not.
"""
import argparse
import json
import math
import os
import struct
import sys

DTYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2}


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def check_files(out):
    path = os.path.join(out, "model.safetensors")
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    if (8 + n) % 8:
        fail(f"{path}: data does not start 8-byte aligned (header {n} bytes)")
    header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    data = blob[8 + n :]
    header.pop("__metadata__", None)
    end = 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        if b != end:
            fail(f"{path}: {name} starts at {b}, expected {end}")
        if e - b != math.prod(t["shape"]) * DTYPE_BYTES[t["dtype"]]:
            fail(f"{path}: {name} has {e - b} bytes for shape {t['shape']} {t['dtype']}")
        end = e
    if end != len(data):
        fail(f"{path}: tensors cover {end} of {len(data)} data bytes")

    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    C, V, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_layer"]
    expect = {
        "transformer.wte.weight": [V, C],
        "transformer.wpe.weight": [cfg["n_positions"], C],
        "transformer.ln_f.weight": [C],
    }
    for i in range(L):
        expect[f"transformer.h.{i}.attn.c_attn.weight"] = [C, 3 * C]
        expect[f"transformer.h.{i}.mlp.c_fc.weight"] = [C, cfg["n_inner"]]
        expect[f"transformer.h.{i}.mlp.c_proj.weight"] = [cfg["n_inner"], C]
    if not cfg.get("tie_word_embeddings", True):
        expect["lm_head.weight"] = [V, C]
    for name, shape in expect.items():
        if name not in header:
            fail(f"{path}: missing {name}")
        if header[name]["shape"] != shape:
            fail(f"{path}: {name} has shape {header[name]['shape']}, config implies {shape}")
    print(f"OK: {path}: {len(header)} tensors, header and offsets valid, shapes match config.json")
    return cfg


def check_transformers(out, cfg, tokens):
    try:
        import torch
        from transformers import GPT2LMHeadModel
    except ImportError as e:
        print(f"SKIP: transformers/torch not importable ({e})")
        return
    model, info = GPT2LMHeadModel.from_pretrained(out, output_loading_info=True)
    missing = [k for k in info["missing_keys"] if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    if missing or info["unexpected_keys"] or info["mismatched_keys"]:
        fail(f"load: missing {missing}, unexpected {info['unexpected_keys']}, mismatched {info['mismatched_keys']}")
    model.eval()
    ids = torch.tensor([tokens or [cfg["eos_token_id"], 72, 101, 108, 108, 111]])
    with torch.no_grad():
        out_ = model(ids, labels=ids)
    logits = out_.logits
    if tuple(logits.shape) != (1, ids.shape[1], cfg["vocab_size"]):
        fail(f"logits shape {tuple(logits.shape)}")
    if not torch.isfinite(logits).all():
        fail("non-finite logits")
    print(f"OK: transformers loaded GPT2LMHeadModel; loss on {ids.shape[1]} tokens = {out_.loss.item():.4f}")


def load_checkpoint(ckpt):
    """megatrain checkpoint -> (config dict, {name: fp32 array}) for the model.* tensors."""
    import numpy as np
    import yaml

    with open(os.path.join(ckpt, "metadata.yaml")) as f:
        meta = yaml.safe_load(f)
    np_dtype = {"fp32": np.float32, "fp16": np.float16}
    tensors = {}
    for t in meta["tensors"]:
        if not t["name"].startswith("model."):
            continue
        out = np.zeros(t["shape"], dtype=np.float32)
        for s in t["slices"]:
            with open(os.path.join(ckpt, s["file"]), "rb") as f:
                f.seek(s["offset"])
                raw = f.read(s["bytes"])
            if t["dtype"] == "bf16":
                vals = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
            else:
                vals = np.frombuffer(raw, dtype=np_dtype[t["dtype"]]).astype(np.float32)
            region = tuple(slice(a, a + e) for a, e in zip(s["start"], s["extent"]))
            out[region] = vals.reshape(s["extent"])
        tensors[t["name"][len("model."):]] = out
    return yaml.safe_load(meta["config"])["model"], tensors


def reference_logits(cfg, w, ids):
    """The GPT forward pass in megatrain's parameter layout (pre-LN, tanh GELU, causal attention)."""
    import numpy as np

    L, C, H, V = cfg["num_layers"], cfg["hidden_size"], cfg["num_heads"], cfg["vocab_size"]
    D, eps = C // H, cfg.get("layernorm_eps", 1e-5)
    T = len(ids)

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[p + ".weight"] + w[p + ".bias"]

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))

    x = w["embedding.word_embeddings.weight"][ids] + w["embedding.position_embeddings.weight"][:T]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(L):
        p = f"layers.{i}."
        h = ln(x, p + "ln1")
        qkv = h @ w[p + "attn.qkv.weight"].T + w[p + "attn.qkv.bias"]  # (T, 3C), column (h*3 + j)*D + d
        qkv = qkv.reshape(T, H, 3, D)
        q, k, v = (qkv[:, :, j].transpose(1, 0, 2) for j in range(3))  # (H, T, D)
        a = q @ k.transpose(0, 2, 1) / np.sqrt(D) + mask
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        ctx = (a @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + ctx @ w[p + "attn.proj.weight"].T + w[p + "attn.proj.bias"]
        h = ln(x, p + "ln2")
        h = gelu(h @ w[p + "mlp.fc1.weight"].T + w[p + "mlp.fc1.bias"])
        x = x + h @ w[p + "mlp.fc2.weight"].T + w[p + "mlp.fc2.bias"]
    x = ln(x, "final_ln")
    head = w.get("lm_head.weight", w["embedding.word_embeddings.weight"])
    return (x @ head.T)[:, :V]


def check_against_checkpoint(out, ckpt, tokens):
    try:
        import numpy as np
        import torch
        import yaml  # noqa: F401
        from transformers import GPT2LMHeadModel
    except ImportError as e:
        print(f"SKIP: reference comparison needs numpy, pyyaml, torch, transformers ({e})")
        return
    cfg, w = load_checkpoint(ckpt)
    ids = tokens or [cfg["vocab_size"] - 1] + [(7 * i + 3) % cfg["vocab_size"] for i in range(11)]
    ref = reference_logits(cfg, w, np.array(ids))
    model = GPT2LMHeadModel.from_pretrained(out, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        got = model(torch.tensor([ids])).logits[0].numpy()
    err = float(np.abs(got - ref).max())
    scale = float(np.abs(ref).max())
    with open(os.path.join(out, "config.json")) as f:
        exported_fp32 = json.load(f).get("torch_dtype", "float32") == "float32"
    tol = (1e-4 if exported_fp32 else 5e-2) * max(scale, 1.0)  # 16-bit exports rounded the weights
    if not err <= tol:
        fail(f"transformers' logits differ from the checkpoint's reference forward by {err:.3g} (scale {scale:.3g})")
    print(f"OK: transformers' logits match the reference forward over {ckpt} (max abs diff {err:.2e})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the export directory (model.safetensors, config.json)")
    ap.add_argument("--checkpoint", help="the megatrain checkpoint the export came from: compare logits")
    ap.add_argument("--tokens", default="", help="comma-separated token ids for the forward pass")
    args = ap.parse_args()
    cfg = check_files(args.out)
    tokens = [int(t) for t in args.tokens.split(",") if t]
    check_transformers(args.out, cfg, tokens)
    if args.checkpoint:
        check_against_checkpoint(args.out, args.checkpoint, tokens)


if __name__ == "__main__":
    main()
