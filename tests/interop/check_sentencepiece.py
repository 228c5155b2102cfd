"""Compares `megatrain data prepare --tokenizer sentencepiece` token ids with the Python `sentencepiece` package,
document by document, for the committed fixture models (tests/data/tokenizer/spm-*.model) and, with --vocab, a
BPE and a unigram model trained here. megatrain tokenizes the generated corpus (tokenizer_corpus.py, JSON lines,
invalid UTF-8 included); the package encodes the same documents decoded with errors="replace"
(encode(text, out_type=int): no BOS/EOS) plus the model's eos id. Every document's ids must agree.
Usage: check_sentencepiece.py MEGATRAIN FIXTURE_DIR WORKDIR [--docs N] [--vocab V] [--workers W]"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_corpus  # noqa: E402
from id_compare import count_mismatches  # noqa: E402
from indexed_file import read_indexed  # noqa: E402
import train_sentencepiece  # noqa: E402
import sentencepiece as spm  # noqa: E402


def compare(name, megatrain, model, corpus, docs, workdir, workers):
    prefix = os.path.join(workdir, name)
    cmd = [megatrain, "data", "prepare", "--input", corpus, "--output", prefix, "--workers", str(workers),
           "--tokenizer", "sentencepiece", "--tokenizer-model", model]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    ours = read_indexed(prefix)
    sp = spm.SentencePieceProcessor(model_file=model)
    texts = [tokenizer_corpus.as_python_text(d) for d in docs]
    theirs = [ids + [sp.eos_id()] for ids in sp.encode(texts, out_type=int)]
    return count_mismatches(name, ours, theirs, texts, "sentencepiece")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("megatrain")
    p.add_argument("fixtures")
    p.add_argument("workdir")
    p.add_argument("--docs", type=int, default=2000)
    p.add_argument("--vocab", type=int, default=0, help="also train and check models this large (0: no)")
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    docs = tokenizer_corpus.documents(99, a.docs)
    corpus = tokenizer_corpus.write_jsonl(os.path.join(a.workdir, "spm-corpus.jsonl"), docs)
    models = [(f"fixture-{k}", os.path.join(a.fixtures, f"spm-{k}.model")) for k in ("bpe", "unigram")]
    if a.vocab:
        big = os.path.join(a.workdir, f"spm-vocab{a.vocab}")
        train_sentencepiece.main(big, a.vocab)
        models += [(f"vocab{a.vocab}-{k}", os.path.join(big, f"spm-{k}.model")) for k in ("bpe", "unigram")]
    total = [0, 0, 0]
    for name, model in models:
        for i, n in enumerate(compare(name, a.megatrain, model, corpus, docs, a.workdir, a.workers)):
            total[i] += n
    print(f"total: {total[0]} documents, {total[1]} tokens, {total[2]} mismatches")
    sys.exit(1 if total[2] else 0)


if __name__ == "__main__":
    main()
