#!/usr/bin/env python3
"""Regenerates tests/data/hf/: two tiny random transformers models saved by save_pretrained (a LlamaForCausalLM
with grouped-query attention, untied, rope_theta 5000; a GPT2LMHeadModel, tied) and golden.txt, transformers'
mean loss of each over the first 6 samples of 64 + 1 tokens of corpus.txt prepared with `megatrain data
prepare --tokenizer byte`. tests/e2e/hf_golden.sh imports both with `megatrain ckpt import` and checks `megatrain
eval` against these losses on every CI run, with no Python packages.
Usage: make_hf_golden.py MEGATRAIN OUTDIR   (needs torch and transformers, e.g. /work/.venv-torch)"""
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(HERE, "hf_tiny_model.py")
WORDS = ("the model reads every token once and the pipeline keeps its stages busy while gradients travel "
         "between ranks a checkpoint holds each tensor by name so any layout can load it again").split()


def run(*args):
    return subprocess.run([sys.executable, TINY, *args], check=True, capture_output=True, text=True).stdout.strip()


def main(megatrain, outdir):
    rng = random.Random(7)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + "." for _ in range(30)]
    corpus = os.path.join(outdir, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("\n".join(lines) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "corpus")
        subprocess.run([megatrain, "data", "prepare", "--input", corpus, "--output", prefix, "--tokenizer", "byte"],
                       check=True, capture_output=True)
        run("make", "llama", os.path.join(outdir, "llama"), "--hidden", "16", "--heads", "4", "--groups", "2")
        run("make", "gpt2", os.path.join(outdir, "gpt2"), "--hidden", "16", "--heads", "4", "--tie")
        golden = [f"{name} {run('loss', os.path.join(outdir, name), prefix, '64', '6')}" for name in ("llama", "gpt2")]
    with open(os.path.join(outdir, "golden.txt"), "w") as f:
        f.write("# transformers' mean loss (fp32) over samples 0-5 of 64 + 1 byte tokens of corpus.txt\n")
        f.write("\n".join(golden) + "\n")
    print("\n".join(golden))


if __name__ == "__main__":
    main(*sys.argv[1:])
