"""Checks a `megatrain ckpt export --format hf` of a SentencePiece-trained checkpoint: AutoTokenizer on the export
must encode every document of the generated corpus (tokenizer_corpus.py) to the ids that the `sentencepiece`
package gives for the model and that `megatrain data prepare` wrote, decode ids to the text sentencepiece
decodes them to, and name the model's pieces, special tokens and ids.

Unigram models: SentencePiece sums path scores in float32, `tokenizers` in float64, so segmentations whose
scores tie (the same pieces in another order) or differ below float32 resolution can be broken differently.
Such documents are counted and shown apart; any other difference fails (with --exact, for BPE, any difference).
Usage: check_spm_export.py EXPORT_DIR MODEL DATA_PREFIX EOD [--docs N]"""
import argparse
import json
import os
import sys
from fractions import Fraction

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_corpus  # noqa: E402
from indexed_file import read_indexed  # noqa: E402
import sentencepiece as spm  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402


def float32_tie(sp, a, b):
    """Whether id lists a and b (segmentations of one text) score the same up to float32 summation error."""
    if sorted(i for i in a if sp.is_unknown(i)) != sorted(i for i in b if sp.is_unknown(i)):
        return False
    sa = sum(Fraction(sp.get_score(i)) for i in a if not sp.is_unknown(i))
    sb = sum(Fraction(sp.get_score(i)) for i in b if not sp.is_unknown(i))
    magnitude = sum(abs(Fraction(sp.get_score(i))) for i in a + b)
    return abs(sa - sb) <= magnitude * Fraction(1, 2 ** 23)  # one float32 ulp per addition, summed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("export")
    p.add_argument("model")
    p.add_argument("prefix")
    p.add_argument("eod", type=int)
    p.add_argument("--docs", type=int, default=2000)
    p.add_argument("--seed", type=int, default=99)
    p.add_argument("--exact", action="store_true", help="no float32 ties allowed (BPE: no scores are summed)")
    a = p.parse_args()
    name = os.path.basename(a.model)
    sp = spm.SentencePieceProcessor(model_file=a.model)
    tok = AutoTokenizer.from_pretrained(a.export)
    n = sp.get_piece_size()

    # The vocabulary and the special tokens.
    assert len(tok) == n, (len(tok), n)
    pieces = tok.convert_ids_to_tokens(list(range(n)))
    bad_pieces = [i for i in range(n) if pieces[i] != sp.id_to_piece(i)]
    assert not bad_pieces, [(i, pieces[i], sp.id_to_piece(i)) for i in bad_pieces[:5]]
    assert tok.eos_token_id == a.eod, (tok.eos_token_id, a.eod)
    assert tok.unk_token_id == sp.unk_id(), (tok.unk_token_id, sp.unk_id())
    if sp.bos_id() >= 0:
        assert tok.bos_token_id == sp.bos_id(), (tok.bos_token_id, sp.bos_id())
    gen = json.load(open(os.path.join(a.export, "generation_config.json")))
    assert gen["eos_token_id"] == a.eod and gen["bos_token_id"] == (sp.bos_id() if sp.bos_id() >= 0 else a.eod), gen
    # config.json states the same ids (transformers reads them from there too, e.g. model.config.bos_token_id).
    cfg = json.load(open(os.path.join(a.export, "config.json")))
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (gen["bos_token_id"], gen["eos_token_id"]), (cfg, gen)

    docs = tokenizer_corpus.documents(a.seed, a.docs)
    texts = [tokenizer_corpus.as_python_text(d) for d in docs]
    # Special-token texts and whitespace edge cases beside the corpus (not in megatrain's data).
    extra = ["<s> </s> <unk> <pad>", "x<s>y", " ", "  a  b  ", "\ta", " \u3000 x", "a\n\n b "]
    want = sp.encode(texts + extra, out_type=int)
    ours = read_indexed(a.prefix)
    assert len(ours) == len(docs), (len(ours), len(docs))
    prepare_bad = sum(list(o) != w + [a.eod] for o, w in zip(ours, want))

    mismatches, ties, decode_bad, shown = 0, 0, 0, 0
    for text, w in zip(texts + extra, want):
        got = tok.encode(text, add_special_tokens=False)
        if got != w:
            mismatches += 1
            tie = float32_tie(sp, w, got)
            ties += tie
            if shown < 4 or not tie:
                shown += 1
                k = next((j for j in range(min(len(w), len(got))) if w[j] != got[j]), min(len(w), len(got)))
                print(f"{name}: {'float32 tie' if tie else 'MISMATCH'} at token {k}: sentencepiece "
                      f"{[sp.id_to_piece(i) for i in w[k:k + 4]]} transformers "
                      f"{[sp.id_to_piece(i) for i in got[k:k + 4]]}; text {text[:80]!r}")
        back, sp_back = tok.decode(w), sp.decode(w)
        if back != sp_back:
            decode_bad += 1
            if decode_bad <= 3:
                print(f"{name}: decode differs: transformers {back[:80]!r} sentencepiece {sp_back[:80]!r}")
    tokens = sum(len(w) for w in want)
    print(f"{name}: {len(want)} documents, {tokens} tokens, {mismatches} mismatches "
          f"({ties} of them float32 score ties, {mismatches - ties} other); "
          f"{decode_bad} decode differences; data prepare: {prepare_bad} documents differ")
    ok = (mismatches == 0 if a.exact else mismatches == ties) and decode_bad == 0 and prepare_bad == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
