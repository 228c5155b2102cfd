#!/usr/bin/env python3
"""Tiny random transformers models and their losses, for the `megatrain ckpt import/export --format hf` checks.

    hf_tiny_model.py make {gpt2|llama|mistral|qwen2|qwen3|mixtral|qwen2_moe|qwen3_moe} OUT [--tie] [--heads H]
                     [--groups G] [--vocab V] [--positions P] [--keep-gate] [--rope default|linear|llama3|yarn]
                     [--head-dim D] [--window W] [--full-layers N]
    hf_tiny_model.py loss MODEL_DIR DATA_PREFIX SEQ_LENGTH SAMPLES
    hf_tiny_model.py load-strict MODEL_DIR

make: a GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM,
Qwen2MoeForCausalLM or Qwen3MoeForCausalLM saved with save_pretrained
(safetensors, float32) whose every weight is random (norm weights 1 + noise, biases noise), so a misplaced row,
transpose or norm parameter changes the loss. loss: the mean next-token loss in float32 on the CPU over samples read in file order from a Megatron
indexed dataset (sample j is tokens [j*S, j*S + S] of the concatenated documents, as `megatrain eval` reads
them), printed with full precision. mixtral: 4 experts, top 2, every layer MoE. qwen2_moe: layer 0 dense
(mlp_only_layers), layer 1 MoE with 4 experts, top 2, norm_topk_prob false, and a shared expert; its q/k/v biases
and shared_expert_gate are zeros (what megatrain's ungated shared expert and bias-free attention map to), unless
--keep-gate leaves the gate random. load-strict: from_pretrained with no missing, unexpected or mismatched
weights (the architecture config.json names), else exit 1. --window: mistral's and mixtral's sliding_window (0:
null), or with qwen2 / qwen3 / qwen3_moe use_sliding_window and the window (qwen2, qwen3: over the layers from
--full-layers, max_window_layers, on).
Needs torch and transformers (tests/e2e/hf_import_interop.sh says where it looks for them).
"""
import argparse
import os
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import indexed_file  # noqa: E402


def read_tokens(prefix):
    return np.array(indexed_file.read_tokens(prefix), dtype=np.int64)


# --rope: Llama's rotary scaling, its original context a quarter of the tiny models' 64 positions so that every
# type changes the low frequencies the test's sequences reach.
ROPE = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
}


def qwen_window(args):
    """Qwen2Config's / Qwen3Config's window keys: off, or --window over the layers from --full-layers on."""
    if not args.window:
        return dict(use_sliding_window=False)
    return dict(use_sliding_window=True, sliding_window=args.window, max_window_layers=args.full_layers)


def make(args):
    torch.manual_seed(args.seed)
    common = dict(vocab_size=args.vocab, bos_token_id=args.vocab - 1, eos_token_id=args.vocab - 1,
                  tie_word_embeddings=args.tie)
    if args.arch == "gpt2":
        cfg = transformers.GPT2Config(n_embd=args.hidden, n_layer=2, n_head=args.heads, n_positions=args.positions,
                                      n_inner=4 * args.hidden, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, **common)
        model = transformers.GPT2LMHeadModel(cfg)
    elif args.arch == "mixtral":
        cfg = transformers.MixtralConfig(hidden_size=args.hidden, intermediate_size=args.hidden, num_hidden_layers=2,
                                         num_attention_heads=args.heads, num_key_value_heads=args.groups,
                                         max_position_embeddings=args.positions, rms_norm_eps=1e-5,
                                         rope_theta=5000.0, num_local_experts=4, num_experts_per_tok=2,
                                         router_aux_loss_coef=0.02, sliding_window=args.window or None, **common)
        model = transformers.MixtralForCausalLM(cfg)
    elif args.arch == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                                          num_hidden_layers=2, num_attention_heads=args.heads,
                                          num_key_value_heads=args.groups, max_position_embeddings=args.positions,
                                          rms_norm_eps=1e-5, rope_theta=5000.0, num_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=args.hidden // 2,
                                          shared_expert_intermediate_size=args.hidden, norm_topk_prob=False,
                                          decoder_sparse_step=1, mlp_only_layers=[0], use_sliding_window=False,
                                          router_aux_loss_coef=0.01, **common)
        model = transformers.Qwen2MoeForCausalLM(cfg)
    elif args.arch == "qwen3_moe":  # Qwen3's attention (head_dim 12), layer 0 dense, layer 1 4 experts top 2
        cfg = transformers.Qwen3MoeConfig(hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                                          num_hidden_layers=2, num_attention_heads=args.heads,
                                          num_key_value_heads=args.groups, head_dim=args.head_dim or 12,
                                          max_position_embeddings=args.positions, rms_norm_eps=1e-5,
                                          rope_parameters={"rope_theta": 5000.0, **ROPE[args.rope]},
                                          num_experts=4, num_experts_per_tok=2, moe_intermediate_size=args.hidden // 2,
                                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0],
                                          router_aux_loss_coef=0.01, **qwen_window(args), **common)
        model = transformers.Qwen3MoeForCausalLM(cfg)
    elif args.arch == "mistral":  # Llama's layers, every one in a sliding window of --window tokens
        cfg = transformers.MistralConfig(hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                                         num_hidden_layers=2, num_attention_heads=args.heads,
                                         num_key_value_heads=args.groups, max_position_embeddings=args.positions,
                                         rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
                                         sliding_window=args.window or None, **common)
        model = transformers.MistralForCausalLM(cfg)
    elif args.arch == "qwen3":  # QK-norm, a head_dim apart from hidden / heads (--head-dim), a window with --window
        cfg = transformers.Qwen3Config(hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=2,
                                       num_attention_heads=args.heads, num_key_value_heads=args.groups,
                                       head_dim=args.head_dim or args.hidden // args.heads,
                                       max_position_embeddings=args.positions, rms_norm_eps=1e-5,
                                       rope_parameters={"rope_theta": 5000.0, **ROPE[args.rope]},
                                       **qwen_window(args), **common)
        model = transformers.Qwen3ForCausalLM(cfg)
    elif args.arch == "qwen2":  # q/k/v biases (random like every weight), a window with --window
        cfg = transformers.Qwen2Config(hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=2,
                                       num_attention_heads=args.heads, num_key_value_heads=args.groups,
                                       max_position_embeddings=args.positions, rms_norm_eps=1e-5, rope_theta=5000.0,
                                       **qwen_window(args), **common)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        rope = {"rope_theta": 5000.0, **ROPE[args.rope]}  # not the default theta: rotary_base must carry over
        cfg = transformers.LlamaConfig(hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=2,
                                       num_attention_heads=args.heads, num_key_value_heads=args.groups,
                                       max_position_embeddings=args.positions, rms_norm_eps=1e-5,
                                       rope_parameters=rope, **common)
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn_like(p) * args.std
            p.copy_(1 + noise if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight", "norm.weight",
                                                "layernorm.weight", "q_norm.weight", "k_norm.weight")) else noise)
            if args.arch == "qwen2_moe" and (name.endswith("_proj.bias") or
                                             (name.endswith("shared_expert_gate.weight") and not args.keep_gate)):
                p.zero_()
    model.save_pretrained(args.out, safe_serialization=True)


def loss(args):
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    S, K = args.seq_length, args.samples
    tokens = read_tokens(args.data)
    total = 0.0
    with torch.no_grad():
        for j in range(K):
            window = torch.tensor(tokens[j * S:j * S + S + 1]).unsqueeze(0)
            logits = model(window[:, :-1]).logits.double()
            total += torch.nn.functional.cross_entropy(logits[0], window[0, 1:], reduction="sum").item()
    print(repr(total / (K * S)))


def load_strict(args):
    cfg = transformers.AutoConfig.from_pretrained(args.model)
    cls = getattr(transformers, cfg.architectures[0])
    _, info = cls.from_pretrained(args.model, output_loading_info=True)
    missing = [k for k in info["missing_keys"] if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    if missing or info["unexpected_keys"] or info["mismatched_keys"]:
        print(f"FAIL: {cls.__name__}: missing {missing}, unexpected {info['unexpected_keys']}, "
              f"mismatched {info['mismatched_keys']}")
        sys.exit(1)
    print(f"OK: {cls.__name__} loaded strictly from {args.model}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("arch", choices=["gpt2", "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"])
    m.add_argument("out")
    m.add_argument("--tie", action="store_true")
    m.add_argument("--hidden", type=int, default=32)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--groups", type=int, default=2)
    m.add_argument("--vocab", type=int, default=257)
    m.add_argument("--positions", type=int, default=64)
    m.add_argument("--std", type=float, default=0.2)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--keep-gate", action="store_true")
    m.add_argument("--rope", choices=sorted(ROPE), default="default", help="llama, qwen3: rotary scaling")
    m.add_argument("--head-dim", type=int, default=0, help="qwen3: head_dim (0: hidden / heads)")
    m.add_argument("--window", type=int, default=0, help="mistral, mixtral, qwen*: the sliding window (0: none)")
    m.add_argument("--full-layers", type=int, default=0, help="qwen2, qwen3: max_window_layers")
    l_ = sub.add_parser("loss")
    l_.add_argument("model")
    l_.add_argument("data")
    l_.add_argument("seq_length", type=int)
    l_.add_argument("samples", type=int)
    s = sub.add_parser("load-strict")
    s.add_argument("model")
    args = ap.parse_args()
    {"make": make, "loss": loss, "load-strict": load_strict}[args.cmd](args)


if __name__ == "__main__":
    main()
