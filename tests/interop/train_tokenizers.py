"""Trains the small tokenizers the tokenizer tests use, with Hugging Face's `tokenizers` on the generated corpus
(tokenizer_corpus.py); the machines reach no model hub. Writes into OUTDIR:
  gpt2-vocab.json, gpt2-merges.txt   GPT-2-style byte-level BPE, as GPT-2 ships its files
  gpt2-tokenizer.json                 the same tokenizer as tokenizer.json, merges in the legacy "a b" form
  llama3-tokenizer.json               Llama-3-style: Split(Llama-3 regex, Isolated) + ByteLevel(use_regex=False),
                                      special tokens, added tokens (normalized, single_word, lstrip, rstrip),
                                      ignore_merges, [a, b] merges
  llama3-bos-tokenizer.json           the same with Llama-3's post-processor: Sequence[ByteLevel, TemplateProcessing
                                      "<|begin_of_text|> $A"], which puts BOS before every encoded text
Usage: train_tokenizers.py OUTDIR [VOCAB_SIZE]"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_corpus  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

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


def main(outdir, vocab_size):
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


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 400)
