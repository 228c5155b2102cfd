#!/usr/bin/env bash
# `ckpt export --format hf` carries the training data's tokenizer: for data prepared with the byte tokenizer,
# the GPT-2 fixture (--tokenizer gpt2) and the Llama-3 style tokenizer.json fixture (--tokenizer hf) of
# tests/data/tokenizer, a checkpoint trained on it records tokenizer.yaml, and transformers' AutoTokenizer.from_pretrained on the export encodes texts to exactly the
# ids `data prepare` wrote and decodes them back; config.json / generation_config.json name the eod id (and the
# post-processor's <|begin_of_text|> as bos when the data has it).
# The hf-tokenizer checkpoint is a Llama (model.arch: llama, grouped-query attention): its LlamaForCausalLM export
# carries the tokenizer the same way. `pipeline("text-generation")` on each export continues a prompt with text.
# Needs the interop Python (transformers, tokenizers, torch: scripts/python-env.sh); exits 77 (skipped) without it.
source "$(dirname "$0")/lib/common.bash"
require_interop_python tokenizers transformers torch
T="$SRC/tests/data/tokenizer"

# A few distinct texts first (the ones checked), then filler so that there is enough to train on.
python3 - <<'PY'
import json
texts = ["Hello, world!", "  two leading spaces,\ttabs\nand newlines\n", "ünïcödé ✓ 日本語 🙂", "a aa aaa aaaa",
         "The quick brown fox jumps over the lazy dog."]
with open("corpus.jsonl", "w") as f:
    for t in texts:
        f.write(json.dumps({"text": t}) + "\n")
    for i in range(300):
        f.write(json.dumps({"text": f"document {i}: " + " ".join(texts)}) + "\n")
json.dump(texts, open("texts.json", "w"))
PY
write_config
mkdir -p data
"$MT" data prepare --input corpus.jsonl --output data/byte --tokenizer byte >/dev/null
"$MT" data prepare --input corpus.jsonl --output data/gpt2 --tokenizer gpt2 \
      --vocab-file "$T/gpt2-vocab.json" --merge-file "$T/gpt2-merges.txt" >/dev/null
"$MT" data prepare --input corpus.jsonl --output data/hf --tokenizer hf --tokenizer-file "$T/llama3-tokenizer.json" >/dev/null
# A post-processor that puts <|begin_of_text|> before each document: with it (the default), the export's bos is
# that token and AutoTokenizer's encode() adds it as the data has it; without (--no-special-tokens) the export
# drops the post-processor, so encode() again gives the data's ids.
"$MT" data prepare --input corpus.jsonl --output data/hfbos --tokenizer hf \
      --tokenizer-file "$T/llama3-bos-tokenizer.json" >/dev/null
"$MT" data prepare --input corpus.jsonl --output data/hfnobos --tokenizer hf \
      --tokenizer-file "$T/llama3-bos-tokenizer.json" --no-special-tokens >/dev/null

for kind in byte gpt2 hf hfbos hfnobos; do
  rm -rf ckpt hf run
  arch=(); [[ $kind = hf* ]] && arch=(--set model.arch=llama --set model.num_query_groups=2)
  "$MT" --config tiny.yaml --set training.train_iters=2 --set optimizer.warmup_iters=1 --set checkpoint.save_dir=ckpt \
        --set "data.train=[data/$kind]" --set model.vocab_size=auto "${arch[@]}" >/dev/null
  [ -f ckpt/iter_0000002/tokenizer.yaml ] || fail "$kind: the checkpoint has no tokenizer.yaml"
  cmp -s ckpt/iter_0000002/tokenizer.yaml "data/$kind.tokenizer.yaml" || fail "$kind: tokenizer.yaml is not the sidecar"
  "$MT" ckpt export ckpt --format hf --output hf
  "$PY" - "$kind" "data/$kind" "$SRC/tests/interop" <<'PY' || fail "$kind: the exported tokenizer disagrees"
import json, sys
sys.path.insert(0, sys.argv[3])
from indexed_file import read_indexed
from transformers import AutoTokenizer
kind, prefix = sys.argv[1], sys.argv[2]
sidecar = {l.split(":", 1)[0]: l.split(":", 1)[1].strip() for l in open(prefix + ".tokenizer.yaml") if ":" in l and not l.startswith(" ")}
eod = int(sidecar["eod"])
texts = json.load(open("texts.json"))
docs = read_indexed(prefix)
tok = AutoTokenizer.from_pretrained("hf")
bad = 0
# hfbos / hfnobos: AutoTokenizer's default encode() (specials added as its post-processor says) must give the data.
specials = kind in ("hfbos", "hfnobos")
bos = docs[0][0] if kind == "hfbos" else eod
for text, doc in zip(texts, docs):
    assert doc[-1] == eod, f"document does not end with eod {eod}: {doc}"
    want = doc[:-1]
    got = tok.encode(text) if specials else tok.encode(text, add_special_tokens=False)
    back = tok.decode(want[1:] if kind == "hfbos" else want)
    ok = got == want and back == text and (kind != "hfbos" or want[0] == bos)
    bad += not ok
    print(f"{kind}: {'ok' if ok else 'MISMATCH'} {text!r} -> {want}" + ("" if ok else f" transformers {got} decodes {back!r}"))
assert tok.eos_token_id == eod and tok.bos_token_id == bos, (tok.eos_token_id, tok.bos_token_id, eod, bos)
assert tok.decode([eod]) == tok.eos_token, (tok.decode([eod]), tok.eos_token)
cfg = json.load(open("hf/config.json"))
gen = json.load(open("hf/generation_config.json"))
assert cfg["eos_token_id"] == eod and cfg["bos_token_id"] == bos, cfg
assert gen["eos_token_id"] == eod and gen["bos_token_id"] == bos, gen
if kind == "hfnobos":
    assert json.load(open("hf/tokenizer.json"))["post_processor"] is None, "the post-processor was kept"
assert json.load(open("hf/tokenizer_config.json"))["model_max_length"] == 32
sys.exit(bad != 0)
PY
  check_text_generation "$PY" "$kind" || fail "$kind: pipeline(\"text-generation\") on the export failed"
  if [ "$kind" = gpt2 ]; then
    cmp "$T/gpt2-vocab.json" hf/vocab.json && cmp "$T/gpt2-merges.txt" hf/merges.txt || fail "gpt2: vocab/merges not copied"
  fi
  [ "$kind" != hf ] || cmp "$T/llama3-tokenizer.json" hf/tokenizer.json || fail "hf: tokenizer.json not copied"
  [ "$kind" != hfbos ] || cmp "$T/llama3-bos-tokenizer.json" hf/tokenizer.json || fail "hfbos: tokenizer.json not copied"
done

# --tokenizer-sidecar exports the named sidecar; a checkpoint without tokenizer.yaml exports no tokenizer.
rm -rf hf2 && "$MT" ckpt export ckpt --format hf --output hf2 --tokenizer-sidecar data/gpt2.tokenizer.yaml >/dev/null
cmp "$T/gpt2-vocab.json" hf2/vocab.json || fail "--tokenizer-sidecar did not export the named tokenizer"
rm ckpt/iter_0000002/tokenizer.yaml
# (into a file first: grep -q leaving early would break the pipe under pipefail)
rm -rf hf3 && "$MT" ckpt export ckpt --format hf --output hf3 >export3.txt
grep -q "no tokenizer" export3.txt || { cat export3.txt; fail "no 'no tokenizer' note"; }
[ ! -e hf3/tokenizer.json ] || fail "a tokenizer.json without a tokenizer"
echo "ok"
