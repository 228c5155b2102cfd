#!/usr/bin/env python3
"""torch_baseline.py: the PyTorch baseline for bench/gpu_throughput.sh.

The same model as megatrain (models/gpt.cpp), by the config's model.arch:
- gpt: learned positions, pre-LN blocks, tied embeddings, GELU (tanh), LayerNorm eps 1e-5, causal multi-head
  attention;
- llama: RMSNorm (eps model.layernorm_eps), SwiGLU MLP (bias-free gate, up and down), rotary embeddings
  (rotate-half, theta model.rotary_base) on q and k, grouped-query attention (model.num_query_groups key/value
  heads), no biases, no position table, untied head unless model.tie_embeddings;
both with dropout where Megatron has it and the vocabulary padded to a multiple of make_vocab_size_divisible_by
(128) with the padding columns left out of the cross-entropy. Trained on random tokens with bf16 autocast, fused AdamW (fp32 weights and states),
F.scaled_dot_product_attention(is_causal=True), global grad-norm clipping and torch.compile; gradient
accumulation over global batch / micro batch microbatches, as megatrain's step (bench/gpu_throughput.sh gives both
the same micro batch and 8 microbatches a step).

Prints one JSON line on stdout (everything else goes to stderr): ms/iter, tokens/s, TFLOP/s by megatrain's
formula (model_flops_per_iteration in models/gpt.cpp), MFU and peak memory (torch.cuda.max_memory_allocated
over the timed iterations).

  python3 bench/torch_baseline.py --config configs/gpt-1.3b.yaml --seq 2048 --micro-batch 4 --global-batch 32
  python3 bench/torch_baseline.py --config configs/llama3.2-1b.yaml --seq 2048 --micro-batch 4 --global-batch 32
  python3 bench/torch_baseline.py --device cpu --tiny --iters 3          # a smoke test without a GPU
  python3 bench/torch_baseline.py --config configs/llama-tiny.yaml --device cpu --dtype fp32 --no-compile --iters 3
  python3 bench/torch_baseline.py --device cpu --dtype fp32 --no-compile --threads 1 ...  # bench/cpu_vs_torch.sh
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---- config ------------------------------------------------------------------------------------------------

def _scalar(text):
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(t) for t in text[1:-1].split(",") if t.strip()]
    if text in ("true", "false"):
        return text == "true"
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def read_yaml(path):
    """The sections of a megatrain config: PyYAML when installed, else a reader for the block style of configs/."""
    try:
        import yaml
        with open(path) as f:
            return yaml.safe_load(f) or {}
    except ImportError:
        pass
    out, section = {}, None
    with open(path) as f:
        for raw in f:
            line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
            if not line.strip():
                continue
            key, _, value = line.strip().partition(":")
            if not line.startswith(" "):
                section = out.setdefault(key, {}) if not value.strip() else None
                if value.strip():
                    out[key] = _scalar(value)
            elif section is not None:
                section[key] = _scalar(value) if value.strip() else {}
    return out


def resolve(args):
    """Model and optimizer settings: the config file, then the command line."""
    cfg = read_yaml(args.config) if args.config else {}
    m, o = dict(cfg.get("model", {})), dict(cfg.get("optimizer", {}))
    if args.tiny:
        m.update(num_layers=2, hidden_size=64, num_heads=4, ffn_hidden_size=256, seq_length=64, vocab_size=257)
    for key, value in (("num_layers", args.layers), ("hidden_size", args.hidden), ("num_heads", args.heads),
                       ("ffn_hidden_size", args.ffn), ("vocab_size", args.vocab), ("seq_length", args.seq),
                       ("dropout", args.dropout), ("attention_dropout", args.attention_dropout)):
        if value is not None:
            m[key] = value
    for key in ("num_layers", "hidden_size", "num_heads", "seq_length", "vocab_size"):
        if key not in m:
            sys.exit(f"torch_baseline: model.{key} is not set (give --config or --{key.split('_')[0]})")
    m.setdefault("ffn_hidden_size", 0)
    if not m["ffn_hidden_size"]:
        m["ffn_hidden_size"] = 4 * m["hidden_size"]
    m.setdefault("dropout", 0.1)
    m.setdefault("attention_dropout", 0.1)
    m.setdefault("layernorm_eps", 1e-5)
    m.setdefault("init_std", 0.02)
    m.setdefault("arch", "gpt")
    if m["arch"] not in ("gpt", "llama"):
        sys.exit(f"torch_baseline: model.arch {m['arch']!r} is not gpt or llama")
    # As core/config/config_rules.cpp: llama unties the head unless the file says otherwise.
    m.setdefault("tie_embeddings", m["arch"] != "llama")
    m.setdefault("rotary_base", 10000.0)
    m["num_query_groups"] = m.get("num_query_groups") or 0      # 0: one key/value head per query head
    if m["arch"] == "gpt" and m["num_query_groups"] not in (0, m["num_heads"]):
        sys.exit("torch_baseline: grouped-query attention (model.num_query_groups) needs model.arch: llama")
    if m["num_heads"] % kv_heads(m) or m["hidden_size"] % m["num_heads"]:
        sys.exit(f"torch_baseline: {kv_heads(m)} key/value heads must divide {m['num_heads']} heads, and the heads "
                 f"hidden_size {m['hidden_size']}")
    m.setdefault("make_vocab_size_divisible_by", 128)
    if not m.get("max_position_embeddings"):
        m["max_position_embeddings"] = m["seq_length"]
    # As core/config/config_rules.cpp with parallel.tensor = 1 (one GPU).
    multiple = m["make_vocab_size_divisible_by"]
    m["padded_vocab_size"] = (m["vocab_size"] + multiple - 1) // multiple * multiple
    o.setdefault("lr", 6e-4)
    o.setdefault("betas", [0.9, 0.95])
    o.setdefault("eps", 1e-8)
    o.setdefault("weight_decay", 0.1)
    o.setdefault("grad_clip", 1.0)
    return m, o


def kv_heads(m):
    """ModelConfig::kv_heads(): num_query_groups, or num_heads when it is 0."""
    return m["num_query_groups"] if m.get("num_query_groups") else m["num_heads"]


def model_flops_per_iteration(m, tokens):
    """models/gpt.cpp's model_flops_per_iteration, term for term (same operations in the same order)."""
    C, Fh, S = float(m["hidden_size"]), float(m["ffn_hidden_size"]), float(m["seq_length"])
    V, L = float(m["padded_vocab_size"]), float(m["num_layers"])
    KV = C * float(kv_heads(m)) / float(m["num_heads"])  # K (= V) width
    # Forward GEMM flops per token and layer, 2 per multiply-add: Q and the output projection 2C^2 each, K and V
    # 2C*KV each (C each without grouped-query attention), the MLP 4CF (GELU: two GEMMs) or 6CF (SwiGLU: gate,
    # up and down).
    mlp = 6.0 * C * Fh if m.get("arch", "gpt") == "llama" else 4.0 * C * Fh
    linear = 4.0 * C * C + 4.0 * C * KV + mlp
    # Causal attention 2SC: the scores and the weighted values, 2SC each over all S keys, halved by the mask.
    # Plus 2CV for the logits. Backward costs twice the forward.
    per_token = L * (linear + 2.0 * S * C) + 2.0 * C * V
    return 3.0 * per_token * float(tokens)


def peak_tflops(device_name, override):
    """Dense bf16 peak for MFU, as megatrain's: H100 / H200 989.4, A100 312; None when unknown."""
    if override:
        return override
    name = device_name.upper()
    if "H100" in name or "H200" in name:
        return 989.4
    if "A100" in name:
        return 312.0
    return None


# ---- model -------------------------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        C, Fh = m["hidden_size"], m["ffn_hidden_size"]
        self.heads = m["num_heads"]
        self.p, self.p_attn = m["dropout"], m["attention_dropout"]
        self.ln1 = nn.LayerNorm(C, eps=m["layernorm_eps"])
        self.qkv = nn.Linear(C, 3 * C)     # (3C, C)
        self.proj = nn.Linear(C, C)        # (C, C), scaled init
        self.ln2 = nn.LayerNorm(C, eps=m["layernorm_eps"])
        self.fc1 = nn.Linear(C, Fh)        # (F, C)
        self.fc2 = nn.Linear(Fh, C)        # (C, F), scaled init

    def forward(self, x):                  # x: (B, T, C)
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p_attn if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + F.dropout(self.proj(y), self.p, self.training)
        h = F.gelu(self.fc1(self.ln2(x)), approximate="tanh")
        return x + F.dropout(self.fc2(h), self.p, self.training)


class GPT(nn.Module):
    def __init__(self, m):
        super().__init__()
        C, V = m["hidden_size"], m["padded_vocab_size"]
        self.vocab_size, self.p = m["vocab_size"], m["dropout"]
        self.wte = nn.Embedding(V, C)                              # (V, C), tied with the head
        self.wpe = nn.Embedding(m["max_position_embeddings"], C)   # (P, C)
        self.blocks = nn.ModuleList(Block(m) for _ in range(m["num_layers"]))
        self.lnf = nn.LayerNorm(C, eps=m["layernorm_eps"])
        self.lm_head = None if m["tie_embeddings"] else nn.Linear(C, V, bias=False)
        std = m["init_std"]
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                scaled = name.endswith("proj.weight") or name.endswith("fc2.weight")  # Megatron's scaled init
                nn.init.normal_(p, 0.0, std / math.sqrt(2.0 * m["num_layers"]) if scaled else std)

    def forward(self, tokens, targets):    # (B, T) int64 each
        T = tokens.shape[1]
        pos = torch.arange(T, device=tokens.device)
        x = F.dropout(self.wte(tokens) + self.wpe(pos), self.p, self.training)
        for block in self.blocks:
            x = block(x)
        x = self.lnf(x)
        logits = F.linear(x, self.wte.weight if self.lm_head is None else self.lm_head.weight)  # (B, T, V padded)
        # Padding columns are not tokens.
        logits = logits[..., : self.vocab_size]
        return F.cross_entropy(logits.reshape(-1, self.vocab_size), targets.reshape(-1))


# ---- llama -------------------------------------------------------------------------------------------------

def _sdpa_has_gqa():
    """Whether this torch's scaled_dot_product_attention takes enable_gqa (2.5 and later)."""
    try:
        q, kv = torch.zeros(1, 2, 1, 2), torch.zeros(1, 1, 1, 2)
        F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        return True
    except TypeError:
        return False


SDPA_GQA = _sdpa_has_gqa()


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in fp32 and rounded once (as megatrain's rmsnorm)."""

    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))   # (C)

    def forward(self, x):                          # x: (B, T, C)
        if hasattr(F, "rms_norm"):                 # torch 2.4 and later: fused under torch.compile
            return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


def rope_tables(seq, head_dim, theta):
    """cos, sin (T, D/2) f32 as megatrain's rope_: inv_freq_i = float(1 / theta^(2i/D)) in double, the angle
    float(p) * inv_freq_i in f32, its cos and sin in double rounded to f32."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    inv_freq = (1.0 / theta ** (2.0 * i / head_dim)).float()                       # (D/2)
    angle = torch.arange(seq, dtype=torch.float32)[:, None] * inv_freq[None, :]    # (T, D/2) f32
    return angle.double().cos().float(), angle.double().sin().float()


def apply_rope(x, cos, sin):
    """Rotate-half RoPE on x (B, T, n, D): the pair (x_i, x_{i+D/2}) by the angle of position t, in fp32."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]                            # (1, T, 1, D/2)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


class LlamaBlock(nn.Module):
    # Weight rows ordered as HF's (q | k | v, gate | up) rather than megatrain's per-group and interleaved
    # orders: the same GEMMs and flops, contiguous slices for PyTorch.
    def __init__(self, m):
        super().__init__()
        C, Fh = m["hidden_size"], m["ffn_hidden_size"]
        self.heads, self.groups = m["num_heads"], kv_heads(m)
        self.D = C // self.heads
        self.p, self.p_attn = m["dropout"], m["attention_dropout"]
        self.ln1 = RMSNorm(C, m["layernorm_eps"])
        self.qkv = nn.Linear(C, (self.heads + 2 * self.groups) * self.D, bias=False)   # ((H + 2G) D, C)
        self.proj = nn.Linear(C, C, bias=False)            # (C, H D), scaled init (HF o_proj)
        self.ln2 = RMSNorm(C, m["layernorm_eps"])
        self.fc1 = nn.Linear(C, 2 * Fh, bias=False)        # (2F, C): gate rows, then up rows
        self.fc2 = nn.Linear(Fh, C, bias=False)            # (C, F), scaled init (HF down_proj)

    def forward(self, x, cos, sin):        # x: (B, T, C); cos, sin: (T, D/2)
        B, T, C = x.shape
        H, G, D = self.heads, self.groups, self.D
        q, k, v = self.qkv(self.ln1(x)).split((H * D, G * D, G * D), dim=-1)
        q = apply_rope(q.view(B, T, H, D), cos, sin).transpose(1, 2)              # (B, H, T, D)
        k = apply_rope(k.view(B, T, G, D), cos, sin).transpose(1, 2)              # (B, G, T, D)
        v = v.view(B, T, G, D).transpose(1, 2)                                     # (B, G, T, D)
        p_attn = self.p_attn if self.training else 0.0
        if G == H:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p_attn, is_causal=True)
        elif SDPA_GQA:                     # query head h reads key/value head h // (H / G)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p_attn, is_causal=True, enable_gqa=True)
        else:
            k, v = (t.repeat_interleave(H // G, dim=1) for t in (k, v))
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p_attn, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + F.dropout(self.proj(y), self.p, self.training)
        gate, up = self.fc1(self.ln2(x)).chunk(2, dim=-1)                          # (B, T, F) each
        return x + F.dropout(self.fc2(F.silu(gate) * up), self.p, self.training)


class Llama(nn.Module):
    def __init__(self, m):
        super().__init__()
        C, V = m["hidden_size"], m["padded_vocab_size"]
        self.vocab_size, self.p = m["vocab_size"], m["dropout"]
        self.wte = nn.Embedding(V, C)                              # (V, C)
        self.blocks = nn.ModuleList(LlamaBlock(m) for _ in range(m["num_layers"]))
        self.lnf = RMSNorm(C, m["layernorm_eps"])
        self.lm_head = None if m["tie_embeddings"] else nn.Linear(C, V, bias=False)   # (V, C) when untied
        cos, sin = rope_tables(m["seq_length"], C // m["num_heads"], float(m["rotary_base"]))
        self.register_buffer("cos", cos, persistent=False)        # (T, D/2)
        self.register_buffer("sin", sin, persistent=False)
        std = m["init_std"]
        for name, p in self.named_parameters():
            if p.dim() >= 2:               # norms keep their ones; Megatron's scaled init on the residual feeds
                scaled = name.endswith("proj.weight") or name.endswith("fc2.weight")
                nn.init.normal_(p, 0.0, std / math.sqrt(2.0 * m["num_layers"]) if scaled else std)

    def forward(self, tokens, targets):    # (B, T) int64 each
        T = tokens.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = F.dropout(self.wte(tokens), self.p, self.training)
        for block in self.blocks:
            x = block(x, cos, sin)
        x = self.lnf(x)
        logits = F.linear(x, self.wte.weight if self.lm_head is None else self.lm_head.weight)  # (B, T, V padded)
        logits = logits[..., : self.vocab_size]
        return F.cross_entropy(logits.reshape(-1, self.vocab_size), targets.reshape(-1))


# ---- training ----------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="a megatrain YAML config (its model and optimizer sections)")
    ap.add_argument("--tiny", action="store_true", help="gpt-tiny's shape (2 layers, hidden 64, seq 64)")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--seq", type=int, help="sequence length (model.seq_length)")
    ap.add_argument("--dropout", type=float, help="hidden dropout (default: the config's)")
    ap.add_argument("--attention-dropout", type=float, help="attention dropout (default: --dropout, else the config's)")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--global-batch", type=int, default=0, help="0: one microbatch per iteration")
    ap.add_argument("--warmup", type=int, default=5, help="untimed iterations first (compilation happens here)")
    ap.add_argument("--iters", type=int, default=20, help="timed iterations")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="autocast dtype (fp32: no autocast)")
    ap.add_argument("--compile", dest="compile", action="store_true", default=None, help="torch.compile (default on cuda)")
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="peak for MFU (default: from the device name)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.attention_dropout is None and args.dropout is not None:
        args.attention_dropout = args.dropout
    m, o = resolve(args)
    B = args.micro_batch
    G = args.global_batch or B
    if G % B:
        sys.exit(f"torch_baseline: --global-batch {G} is not a multiple of --micro-batch {B}")
    M, S = G // B, m["seq_length"]
    compile_ = args.device == "cuda" if args.compile is None else args.compile

    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("torch_baseline: CUDA is not available to torch (use --device cpu for a smoke test)")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        device_name = torch.cuda.get_device_name(dev)
    else:
        device_name = "cpu"

    model = (Llama(m) if m["arch"] == "llama" else GPT(m)).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]   # biases and norms, as megatrain
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                            **({"fused": True} if args.device == "cuda" else {}))
    model.train()
    forward = torch.compile(model) if compile_ else model
    amp = (torch.autocast(device_type=args.device, dtype=torch.bfloat16) if args.dtype == "bf16"
           else torch.autocast(device_type=args.device, enabled=False))
    log(f"torch_baseline: torch {torch.__version__} on {device_name}: {m['arch']}, {n_params} parameters, layers "
        f"{m['num_layers']}, hidden {m['hidden_size']}, heads {m['num_heads']}"
        + (f" ({kv_heads(m)} key/value heads, enable_gqa {SDPA_GQA}), rotary base {m['rotary_base']}, tied "
           f"{m['tie_embeddings']}" if m["arch"] == "llama" else "") + f", ffn {m['ffn_hidden_size']}, vocab "
        f"{m['vocab_size']} padded to {m['padded_vocab_size']}, seq {S}, micro batch {B}, global batch {G}, "
        f"dropout {m['dropout']}/{m['attention_dropout']}, {args.dtype}, compile {compile_}")

    def step():
        for _ in range(M):
            tokens = torch.randint(0, m["vocab_size"], (B, S + 1), device=dev)
            with amp:
                loss = forward(tokens[:, :-1], tokens[:, 1:]) / M
            loss.backward()
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    t_start = time.perf_counter()
    for i in range(args.warmup):
        try:
            step()
        except Exception as e:  # a broken compiler stack: measure eager and say so in the JSON
            if not (compile_ and i == 0):
                raise
            log(f"torch_baseline: torch.compile failed ({type(e).__name__}: {str(e)[:300]}); measuring eager mode")
            compile_, forward = False, model
            opt.zero_grad(set_to_none=True)
            step()
    sync()
    warmup_s = time.perf_counter() - t_start
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0, c0 = time.perf_counter(), time.process_time()
    loss = None
    for _ in range(args.iters):
        loss = step()
    sync()
    seconds = time.perf_counter() - t0
    cpu_seconds = time.process_time() - c0  # this process's CPU time: steadier than wall time on a shared machine

    ms = seconds / max(args.iters, 1) * 1000.0
    tokens_per_iter = G * S
    tflops = model_flops_per_iteration(m, tokens_per_iter) / (ms / 1000.0) / 1e12
    peak = peak_tflops(device_name, args.peak_tflops) if args.device == "cuda" else None
    result = {
        "impl": "pytorch", "torch": torch.__version__, "device": device_name, "compiled": compile_,
        "dtype": args.dtype, "arch": m["arch"], "layers": m["num_layers"], "hidden": m["hidden_size"],
        "heads": m["num_heads"], "kv_heads": kv_heads(m), "tied": m["tie_embeddings"],
        "ffn": m["ffn_hidden_size"], "vocab": m["vocab_size"], "padded_vocab": m["padded_vocab_size"], "seq": S,
        "micro_batch": B, "global_batch": G, "accumulation": M, "attention": "sdpa", "dropout": m["dropout"], "attention_dropout": m["attention_dropout"],
        "threads": torch.get_num_threads(), "parameters": n_params, "warmup": args.warmup, "iters": args.iters, "warmup_s": round(warmup_s, 3),
        "ms_per_iter": round(ms, 3), "cpu_ms_per_iter": round(cpu_seconds / max(args.iters, 1) * 1000.0, 3),
        "tokens_per_s": round(tokens_per_iter / (ms / 1000.0), 1),
        "tflops": round(tflops, 6), "mfu": round(tflops / peak, 6) if peak else None,
        "peak_bytes": torch.cuda.max_memory_allocated(dev) if args.device == "cuda" else None,
        "loss": float(loss.item()) * M if loss is not None else None,
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
