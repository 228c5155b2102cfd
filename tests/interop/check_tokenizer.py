"""Compares `megatrain data prepare` token ids with Hugging Face's `tokenizers`, document by document.

For each tokenizer set (the committed fixtures in tests/data/tokenizer and, with --vocab, a larger one trained
here) and each way of loading it (gpt2: vocab.json + merges.txt; hf: the GPT-2-style and the Llama-3-style
tokenizer.json, the latter also with Llama-3's post-processor), megatrain tokenizes a generated corpus
(tokenizer_corpus.py, written as JSON lines, invalid UTF-8 included) and the Python package encodes the same
documents (invalid UTF-8 decoded with errors="replace"; add_special_tokens=True, the default of both, and False
where megatrain is given --no-special-tokens) plus the end-of-document id. Every document's ids must agree.
Usage: check_tokenizer.py MEGATRAIN FIXTURE_DIR WORKDIR [--docs N] [--vocab V] [--workers W]"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_corpus  # noqa: E402
from id_compare import count_mismatches  # noqa: E402
from indexed_file import read_indexed  # noqa: E402
import train_tokenizers  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

def gpt2_from_files(vocab, merges):
    tok = Tokenizer(models.BPE.from_file(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok


def compare(name, megatrain, args, reference, eod, corpus, docs, workdir, workers):
    specials = "--no-special-tokens" not in args
    prefix = os.path.join(workdir, name)
    cmd = [megatrain, "data", "prepare", "--input", corpus, "--output", prefix, "--workers", str(workers)] + args
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    ours = read_indexed(prefix)
    texts = [tokenizer_corpus.as_python_text(d) for d in docs]
    theirs = [e.ids + [eod] for e in reference.encode_batch(texts, add_special_tokens=specials)]
    return count_mismatches(name, ours, theirs, texts, "tokenizers", near=reference.decode)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("megatrain")
    p.add_argument("fixtures")
    p.add_argument("workdir")
    p.add_argument("--docs", type=int, default=2000)
    p.add_argument("--vocab", type=int, default=2000, help="also train and check a tokenizer this large (0: no)")
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    docs = tokenizer_corpus.documents(99, a.docs) + [t.encode() for t in tokenizer_corpus.NORMALIZATION_CASES]
    corpus = tokenizer_corpus.write_jsonl(os.path.join(a.workdir, "corpus.jsonl"), docs)
    sets = [("fixture", a.fixtures)]
    if a.vocab:
        big = os.path.join(a.workdir, f"vocab{a.vocab}")
        spm_model = None
        try:  # a larger SentencePiece BPE for the Llama-2-style files, when the package is here
            import train_sentencepiece
            train_sentencepiece.main(big, a.vocab)
            spm_model = os.path.join(big, "spm-bpe.model")
        except ImportError:
            pass
        train_tokenizers.main(big, a.vocab, spm_model)
        sets.append((f"vocab{a.vocab}", big))
    total = [0, 0, 0]
    for label, d in sets:
        vocab, merges = os.path.join(d, "gpt2-vocab.json"), os.path.join(d, "gpt2-merges.txt")
        gpt2_json, llama_json = os.path.join(d, "gpt2-tokenizer.json"), os.path.join(d, "llama3-tokenizer.json")
        bos_json = os.path.join(d, "llama3-bos-tokenizer.json")
        llama_eod = Tokenizer.from_file(llama_json).token_to_id("<|end_of_text|>")
        ref = gpt2_from_files(vocab, merges)
        runs = [
            (f"{label}-gpt2", ["--tokenizer", "gpt2", "--vocab-file", vocab, "--merge-file", merges], ref,
             ref.token_to_id("<|endoftext|>")),
            (f"{label}-hf-gpt2", ["--tokenizer", "hf", "--tokenizer-file", gpt2_json], Tokenizer.from_file(gpt2_json),
             ref.token_to_id("<|endoftext|>")),
            (f"{label}-hf-llama3", ["--tokenizer", "hf", "--tokenizer-file", llama_json],
             Tokenizer.from_file(llama_json), llama_eod),
            (f"{label}-hf-llama3-bos", ["--tokenizer", "hf", "--tokenizer-file", bos_json],
             Tokenizer.from_file(bos_json), llama_eod),
            (f"{label}-hf-llama3-bos-no-specials", ["--tokenizer", "hf", "--tokenizer-file", bos_json,
                                                    "--no-special-tokens"], Tokenizer.from_file(bos_json), llama_eod),
        ]
        # SentencePiece-style BPE (train_tokenizers.spm_bpe_files): Llama-2's legacy normalizer, Metaspace with each
        # prepend_scheme and split.
        if os.path.exists(os.path.join(d, "llama2-tokenizer.json")):
            llama2 = os.path.join(d, "llama2-tokenizer.json")
            runs.append((f"{label}-hf-llama2", ["--tokenizer", "hf", "--tokenizer-file", llama2],
                         Tokenizer.from_file(llama2), Tokenizer.from_file(llama2).token_to_id("</s>")))
            runs.append((f"{label}-hf-llama2-no-specials", ["--tokenizer", "hf", "--tokenizer-file", llama2,
                                                            "--no-special-tokens"], Tokenizer.from_file(llama2), Tokenizer.from_file(llama2).token_to_id("</s>")))
            # Without byte_fallback: characters outside the vocabulary are <unk>, runs of them one with fuse_unk.
            spec = json.load(open(llama2, encoding="utf-8"))
            for fuse in (True, False):
                spec["model"].update(byte_fallback=False, fuse_unk=fuse)
                path = os.path.join(a.workdir, f"{label}-llama2-unk-{fuse}.json")
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(spec, f, ensure_ascii=False)
                runs.append((f"{label}-hf-llama2-unk{'-fused' if fuse else ''}",
                             ["--tokenizer", "hf", "--tokenizer-file", path], Tokenizer.from_file(path),
                             Tokenizer.from_file(path).token_to_id("</s>")))
            meta = json.load(open(os.path.join(d, "llama2-metaspace-tokenizer.json"), encoding="utf-8"))
            for scheme, split in [("first", False), ("always", True), ("never", True), ("first", True)]:
                meta["pre_tokenizer"].update(prepend_scheme=scheme, split=split)
                path = os.path.join(a.workdir, f"{label}-metaspace-{scheme}-{split}.json")
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(meta, f, ensure_ascii=False)
                runs.append((f"{label}-hf-llama2-metaspace-{scheme}{'-split' if split else ''}",
                             ["--tokenizer", "hf", "--tokenizer-file", path], Tokenizer.from_file(path), Tokenizer.from_file(path).token_to_id("</s>")))
        # Unicode normalizers (train_tokenizers.norm_files): NFKC + Lowercase, NFD + Replace(Regex) + Strip; each also
        # with the other normal forms in place of the first step.
        for norm in ("nfkc-lower", "nfd-strip"):
            path = os.path.join(d, f"norm-{norm}-tokenizer.json")
            if not os.path.exists(path):
                continue
            runs.append((f"{label}-hf-norm-{norm}", ["--tokenizer", "hf", "--tokenizer-file", path],
                         Tokenizer.from_file(path), Tokenizer.from_file(path).token_to_id("<|endoftext|>")))
            spec = json.load(open(path, encoding="utf-8"))
            for form in ("NFC", "NFKD") if norm == "nfkc-lower" else ("NFKC",):
                spec["normalizer"]["normalizers"][0] = {"type": form}
                variant = os.path.join(a.workdir, f"{label}-norm-{norm}-{form}.json")
                with open(variant, "w", encoding="utf-8") as f:
                    json.dump(spec, f, ensure_ascii=False)
                runs.append((f"{label}-hf-norm-{norm}-{form}", ["--tokenizer", "hf", "--tokenizer-file", variant],
                             Tokenizer.from_file(variant), Tokenizer.from_file(variant).token_to_id("<|endoftext|>")))
        # ByteLevel's add_prefix_space, which the committed files leave off.
        spec = json.load(open(gpt2_json, encoding="utf-8"))
        spec["pre_tokenizer"]["add_prefix_space"] = True
        prefix_json = os.path.join(a.workdir, f"{label}-prefix-tokenizer.json")
        with open(prefix_json, "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False)
        runs.append((f"{label}-hf-gpt2-prefix-space", ["--tokenizer", "hf", "--tokenizer-file", prefix_json],
                     Tokenizer.from_file(prefix_json), ref.token_to_id("<|endoftext|>")))
        for name, args, reference, eod in runs:
            for i, n in enumerate(compare(name, a.megatrain, args, reference, eod, corpus, docs, a.workdir, a.workers)):
                total[i] += n
    print(f"total: {total[0]} documents, {total[1]} tokens, {total[2]} mismatches")
    sys.exit(1 if total[2] else 0)


if __name__ == "__main__":
    main()
