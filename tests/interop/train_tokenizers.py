"""Trains the small tokenizers the tokenizer tests use, with Hugging Face's `tokenizers` on the generated corpus
(tokenizer_corpus.py); the machines reach no model hub. Writes into OUTDIR:
  gpt2-vocab.json, gpt2-merges.txt   GPT-2-style byte-level BPE, as GPT-2 ships its files
  gpt2-tokenizer.json                 the same tokenizer as tokenizer.json, merges in the legacy "a b" form
  llama3-tokenizer.json               Llama-3-style: Split(Llama-3 regex, Isolated) + ByteLevel(use_regex=False),
                                      special tokens, added tokens (normalized, single_word, lstrip, rstrip),
                                      ignore_merges, [a, b] merges
  llama3-bos-tokenizer.json           the same with Llama-3's post-processor: Sequence[ByteLevel, TemplateProcessing
                                      "<|begin_of_text|> $A"], which puts BOS before every encoded text
  norm-nfkc-lower-tokenizer.json      byte-level BPE (GPT-2 style) with the normalizer Sequence[NFKC, Lowercase], an
                                      added token with normalized=true ("[[Tool]]", matched as "[[tool]]" on the
                                      lowercased text) and special ones with normalized=false ("<MASK>", lstrip)
  norm-nfd-strip-tokenizer.json       byte-level BPE (Llama-3 style) with Sequence[NFD, Replace(Regex \s+, " "),
                                      Replace(Regex \p{Mn}+, ""), Strip], the same added tokens
And, when the sentencepiece package is present, from tests/data/tokenizer/spm-bpe.model (or SPM_MODEL):
  llama2-tokenizer.json               SentencePiece-style BPE as transformers' LlamaConverter writes it (legacy):
                                      normalizer Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer,
                                      BPE over characters with byte_fallback, fuse_unk and unk_token "<unk>", the
                                      decoder Replace/ByteFallback/Fuse/Strip, post-processor "<s> $A"
  llama2-metaspace-tokenizer.json     the same the non-legacy way: no normalizer, pre_tokenizer
                                      Metaspace(prepend_scheme="first", split=False), decoder Metaspace
Usage: train_tokenizers.py OUTDIR [VOCAB_SIZE [SPM_MODEL]]"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_corpus  # noqa: E402
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,  # noqa: E402
                        processors, trainers)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_3|>", "<|eot_id|>"]


def training_text():
    # The repeated line makes merges across the characters where regex engines disagree on \s: Oniguruma (HF's)
    # counts U+0085 as space but not U+180E, so "!\u180e" is one piece and " \u0085\n" another; an engine that
    # splits them otherwise gives other ids (see pretokenizer.cpp).
    return [tokenizer_corpus.as_python_text(d) for d in tokenizer_corpus.documents(1234, 3000)] + \
        ["x!\u180e!\u180e y \u0085\n"] * 3000


def train(tok, vocab_size, specials):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(), trainer)
    return tok


def spm_bpe_files(outdir, spm_model):
    """The Llama-2-style tokenizer.json files from a SentencePiece BPE model (see the module docstring). The merges
    are those transformers' generate_merges derives from the vocabulary: every split of a piece into two pieces,
    in the order of the merged piece's id (a SentencePiece BPE model lists pieces by merge order)."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=spm_model)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = []
    for piece, pid in vocab.items():
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        merges += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges.sort(key=lambda m: (vocab[m[0] + m[1]], len(m[0]), len(m[1])))
    specials = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    tok.post_processor = processors.TemplateProcessing(single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
                                                       special_tokens=[("<s>", vocab["<s>"])])
    legacy = Tokenizer.from_str(tok.to_str())
    legacy.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    legacy.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                        decoders.Strip(content=" ", left=1, right=0)])
    legacy.save(os.path.join(outdir, "llama2-tokenizer.json"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.save(os.path.join(outdir, "llama2-metaspace-tokenizer.json"))


def norm_files(outdir, vocab_size):
    """The byte-level BPE files with Unicode normalizers (see the module docstring)."""
    added = [AddedToken("[[Tool]]", normalized=True, special=False),
             AddedToken("<r>", rstrip=True, normalized=False, special=False)]
    specials = [AddedToken("<MASK>", lstrip=True, normalized=False, special=True)]

    lower = Tokenizer(models.BPE())
    lower.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    lower.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    lower.decoder = decoders.ByteLevel()
    train(lower, vocab_size, ["<|endoftext|>"])
    lower.add_tokens(added)
    lower.add_special_tokens(specials)
    lower.save(os.path.join(outdir, "norm-nfkc-lower-tokenizer.json"))

    strip = Tokenizer(models.BPE())
    strip.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Replace(Regex(r"\s+"), " "),
                                             normalizers.Replace(Regex(r"\p{Mn}+"), ""), normalizers.Strip()])
    strip.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    strip.decoder = decoders.ByteLevel()
    train(strip, vocab_size, ["<|endoftext|>"])
    strip.add_tokens(added)
    strip.add_special_tokens(specials)
    strip.save(os.path.join(outdir, "norm-nfd-strip-tokenizer.json"))


def main(outdir, vocab_size, spm_model=None):
    os.makedirs(outdir, exist_ok=True)
    gpt2 = Tokenizer(models.BPE())
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    gpt2.decoder = decoders.ByteLevel()
    train(gpt2, vocab_size, ["<|endoftext|>"])
    with tempfile.TemporaryDirectory() as d:
        vocab, merges = gpt2.model.save(d)
        os.replace(vocab, os.path.join(outdir, "gpt2-vocab.json"))
        os.replace(merges, os.path.join(outdir, "gpt2-merges.txt"))
    spec = json.loads(gpt2.to_str())
    spec["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    with open(os.path.join(outdir, "gpt2-tokenizer.json"), "w") as f:
        json.dump(spec, f, ensure_ascii=False)

    llama = Tokenizer(models.BPE())
    llama.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    llama.decoder = decoders.ByteLevel()
    train(llama, vocab_size, LLAMA3_SPECIALS)
    llama.add_tokens([AddedToken("[[tool]]", normalized=True, special=False),
                      AddedToken("[[sw]]", single_word=True, normalized=True, special=False),
                      AddedToken("<r>", rstrip=True, normalized=False, special=False)])
    llama.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    spec = json.loads(llama.to_str())
    spec["model"]["ignore_merges"] = True
    with open(os.path.join(outdir, "llama3-tokenizer.json"), "w") as f:
        json.dump(spec, f, ensure_ascii=False)

    # As Meta's Llama-3 tokenizer.json has it (ByteLevel there only trims offsets).
    bos = "<|begin_of_text|>"
    llama.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                      special_tokens=[(bos, llama.token_to_id(bos))])])
    spec = json.loads(llama.to_str())
    spec["model"]["ignore_merges"] = True
    with open(os.path.join(outdir, "llama3-bos-tokenizer.json"), "w") as f:
        json.dump(spec, f, ensure_ascii=False)

    norm_files(outdir, vocab_size)

    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    spm_bpe_files(outdir, spm_model or os.path.join(here, "..", "data", "tokenizer", "spm-bpe.model"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 400, sys.argv[3] if len(sys.argv) > 3 else None)
