#!/usr/bin/env python3
"""Regenerates tests/data/rope/frequencies.txt: transformers' rotary inverse frequencies (LlamaRotaryEmbedding's, for the
rope_types default, linear, llama3 and yarn) and the attention factor for a few head dims and parameter sets, written
as the fp32 bit patterns. tests/unit/core/base/test_rope_scaling.cpp checks core/base/rope_scaling.cpp against them
on every CI run, with no Python packages.
Usage: make_rope_golden.py OUTFILE   (needs torch and transformers: build/interop-venv)"""
import struct
import sys

import transformers
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

CASES = [
    # name, head_dim, theta, max_position_embeddings, rope parameters (without rope_theta)
    ("default-64", 64, 10000.0, 2048, {"rope_type": "default"}),
    ("default-128-500k", 128, 500000.0, 8192, {"rope_type": "default"}),
    ("linear-64", 64, 10000.0, 4096, {"rope_type": "linear", "factor": 2.0}),
    ("llama3-128", 128, 500000.0, 131072,
     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}),
    ("llama3-64-32", 64, 500000.0, 131072,
     {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}),
    ("llama3-8-tiny", 8, 5000.0, 256,
     {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 32}),
    ("yarn-128", 128, 1000000.0, 131072,
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    ("yarn-64-mscale", 64, 10000.0, 163840,
     {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
      "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
    ("yarn-8-tiny", 8, 5000.0, 256,
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": 1.25,
      "truncate": False}),
]


def bits(x):
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


def main(out):
    lines = [f"# rope frequencies from transformers {transformers.__version__} (tests/interop/make_rope_golden.py):",
             "# name head_dim theta parameters (megatrain's model.rope_scaling keys) attention_factor_bits inv_freq_bits..."]
    ours = {"rope_type": "type", "factor": "factor", "low_freq_factor": "low_freq_factor",
            "high_freq_factor": "high_freq_factor", "original_max_position_embeddings":
            "original_max_position_embeddings", "attention_factor": "attention_factor", "beta_fast": "beta_fast",
            "beta_slow": "beta_slow", "mscale": "mscale", "mscale_all_dim": "mscale_all_dim", "truncate": "truncate"}
    for name, dim, theta, positions, params in CASES:
        cfg = LlamaConfig(hidden_size=dim * 2, num_attention_heads=2, head_dim=dim,
                          max_position_embeddings=positions, rope_parameters={"rope_theta": theta, **params})
        rotary = LlamaRotaryEmbedding(cfg)  # what the model rotates by
        inv_freq, attention = rotary.inv_freq, rotary.attention_scaling
        keys = ",".join(f"{ours[k]}={'none' if v == 'default' else str(v).lower() if isinstance(v, bool) else v}"
                        for k, v in params.items())
        lines.append(" ".join([name, str(dim), repr(theta), keys, f"{bits(attention):08x}"] +
                              [f"{bits(v):08x}" for v in inv_freq.tolist()]))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
