"""Trains the small SentencePiece models the tokenizer tests use, with the Python `sentencepiece` package on the
generated corpus (tokenizer_corpus.py; invalid UTF-8 decoded with errors="replace"). Writes into OUTDIR:
  spm-bpe.model      BPE (VOCAB_SIZE + 100 pieces), byte_fallback (Llama-2 style: bytes outside the vocabulary
                     become <0xNN> pieces), whitespace kept as it is
  spm-unigram.model  unigram, no byte fallback (unknown characters become <unk>), extra whitespace removed
                     (no NFKC normalization: its table would make each model ~240 KB)
  spm-noeos.model    unigram without an eos piece (eos_id=-1): data prepare refuses it without --eod-token
Usage: train_sentencepiece.py OUTDIR [VOCAB_SIZE]"""
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_corpus  # noqa: E402
import sentencepiece as spm  # noqa: E402


def sentences():
    # SentencePiece trains on lines; documents are split at newlines, long ones are left to its length limit.
    out = []
    for d in tokenizer_corpus.documents(1234, 1500):
        out += [s for s in tokenizer_corpus.as_python_text(d).split("\n") if s.strip()]
    return out


def train(path, **options):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences()), model_writer=model, minloglevel=2,
                                   hard_vocab_limit=False, num_threads=1, **options)
    with open(path, "wb") as f:
        f.write(model.getvalue())


def main(outdir, vocab_size):
    os.makedirs(outdir, exist_ok=True)
    train(os.path.join(outdir, "spm-bpe.model"), model_type="bpe", vocab_size=vocab_size + 100, byte_fallback=True,
          character_coverage=0.98, normalization_rule_name="identity", remove_extra_whitespaces=False)
    train(os.path.join(outdir, "spm-unigram.model"), model_type="unigram", vocab_size=vocab_size,
          normalization_rule_name="identity", character_coverage=0.98)
    train(os.path.join(outdir, "spm-noeos.model"), model_type="unigram", vocab_size=vocab_size, eos_id=-1,
          normalization_rule_name="identity", character_coverage=0.98)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 400)
