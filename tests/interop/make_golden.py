"""Regenerates tests/data/tokenizer/: the small tokenizers (train_tokenizers.py, vocabulary 400), a fixed corpus
(corpus.jsonl: every fragment of tokenizer_corpus.py, then 37 documents of at most 400 bytes from
it, invalid UTF-8 included, then the NORMALIZATION_CASES) and the ids
Hugging Face's `tokenizers` gives each document (expected-<name>.txt: one line per document, ids separated by
spaces, no end-of-document id; invalid UTF-8 decoded with errors="replace"; add_special_tokens=True, the
default, which only the tokenizers with a post-processor (llama3-bos, llama2*) are affected by).
tests/unit/core/data/test_tokenizer.cpp checks megatrain against these files on every build.
Usage: make_golden.py OUTDIR"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_tokenizer  # noqa: E402
import tokenizer_corpus  # noqa: E402
import train_tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def main(outdir):
    train_tokenizers.main(outdir, 400)
    c = tokenizer_corpus
    docs = [" ".join(c.FRAGMENTS).encode(), "x".join(c.SPACES + c.CONTROLS).encode(), b"x".join(c.INVALID)]
    docs += c.documents(7, 37, invalid_fraction=0.3, max_bytes=400)
    docs += [t.encode() for t in c.NORMALIZATION_CASES]
    tokenizer_corpus.write_jsonl(os.path.join(outdir, "corpus.jsonl"), docs)
    texts = [tokenizer_corpus.as_python_text(d) for d in docs]
    refs = {
        "gpt2": check_tokenizer.gpt2_from_files(os.path.join(outdir, "gpt2-vocab.json"),
                                                os.path.join(outdir, "gpt2-merges.txt")),
        "hf-gpt2": Tokenizer.from_file(os.path.join(outdir, "gpt2-tokenizer.json")),
        "hf-llama3": Tokenizer.from_file(os.path.join(outdir, "llama3-tokenizer.json")),
        "hf-llama3-bos": Tokenizer.from_file(os.path.join(outdir, "llama3-bos-tokenizer.json")),
        "hf-llama2": Tokenizer.from_file(os.path.join(outdir, "llama2-tokenizer.json")),
        "hf-llama2-metaspace": Tokenizer.from_file(os.path.join(outdir, "llama2-metaspace-tokenizer.json")),
        "hf-norm-nfkc-lower": Tokenizer.from_file(os.path.join(outdir, "norm-nfkc-lower-tokenizer.json")),
        "hf-norm-nfd-strip": Tokenizer.from_file(os.path.join(outdir, "norm-nfd-strip-tokenizer.json")),
    }
    for name, tok in refs.items():
        with open(os.path.join(outdir, f"expected-{name}.txt"), "w") as f:
            for e in tok.encode_batch(texts, add_special_tokens=True):
                f.write(" ".join(map(str, e.ids)) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
