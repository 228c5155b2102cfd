#!/usr/bin/env bash
# `data prepare --format chat` (issue 28): a JSONL of conversations (`messages`, or `prompt`/`response`) rendered by
# the ChatML template, which --chat-template auto finds in tokenizer_config.json, into PREFIX.bin/.idx (the tokens)
# and PREFIX_mask.bin/.idx (u8, 1 on the assistant's content and end token); both read back with `data inspect` and
# with Python, same document lengths, mask only 0/1, and the masked tokens those of the answers. Bad lines, a
# template it does not render and a tokenizer without the template's tokens are refused, naming what is wrong.
source "$(dirname "$0")/lib/common.bash"

source "$SRC/tests/e2e/lib/sft.bash"
write_chatml_tokenizer  # tok/: ChatML specials on the Llama-3-style fixture

cat > chat.jsonl <<'JSONL'
{"prompt": "What is 2+2?", "response": "4"}

{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"}, {"role": "assistant", "content": "Red."}]}
JSONL
prep=(data prepare --input chat.jsonl --tokenizer hf --tokenizer-file tok/tokenizer.json --format chat)
"$MT" "${prep[@]}" --output sft | tee prepare.txt
grep -q "2 documents" prepare.txt || fail "expected 2 documents"
grep -q "loss mask sft_mask.bin / sft_mask.idx: .* learned (chatml template)" prepare.txt || fail "no loss mask line"

"$MT" data inspect sft --decode 2 | tee inspect.txt
grep -qF '<|im_start|>assistant' inspect.txt || fail "inspect --decode does not show the rendered chat"
"$MT" data inspect sft_mask --verify | tee inspect_mask.txt
grep -q "dtype *uint8" inspect_mask.txt || fail "the mask is not stored as u8"

python3 - "$SRC/tests/interop" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
from indexed_file import read_indexed
tokens, mask = read_indexed("sft"), read_indexed("sft_mask")
assert [len(d) for d in tokens] == [len(d) for d in mask], "token and mask documents differ in length"
assert all(m in (0, 1) for d in mask for m in d), "mask values other than 0/1"
vocab = json.load(open("tok/tokenizer.json"))["model"]["vocab"]
text = {i: p for p, i in vocab.items()}
def learned(d):
    return "".join(text[t] for t, m in zip(tokens[d], mask[d]) if m).replace("\u0120", " ")
assert learned(0) == "4<|im_end|>", learned(0)
assert learned(1) == "Blue.<|im_end|>Red.<|im_end|>", learned(1)
for d in range(2):
    assert tokens[d][0] == 2 and mask[d][0] == 0, "a document starts with <|im_start|>, not learned"
    assert tokens[d][-2:] == [3, vocab["\u010a"]], "a document ends with <|im_end|> \\n and no end-of-document"
print("ok: tokens and mask agree; learned:", learned(0), "|", learned(1))
PY

printf '%s\n' '{"prompt": "p", "response": "r"}' '{"messages": [{"role": "user", "content": "p"}]}' > bad.jsonl
expect_error "bad.jsonl:2: the conversation has no assistant message" data prepare --input bad.jsonl --output x \
  --tokenizer hf --tokenizer-file tok/tokenizer.json --format chat
printf '%s\n' '{"messages": [{"role": "tool", "content": "p"}]}' > bad.jsonl
expect_error "bad.jsonl:1: messages\[0\]: unknown role \"tool\"" data prepare --input bad.jsonl --output x \
  --tokenizer hf --tokenizer-file tok/tokenizer.json --format chat
[ ! -e x.bin ] && [ ! -e x_mask.bin ] || fail "a refused prepare left output behind"
expect_error "special token <|im_start|>" data prepare --input chat.jsonl --output x --tokenizer byte \
  --format chat --chat-template chatml
expect_error "special token <|start_header_id|>" "${prep[@]}" --output x --chat-template llama3
expect_error "already exists" "${prep[@]}" --output sft
cp -r tok other
echo '{"chat_template": "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }}{% endfor %}"}' \
  > other/tokenizer_config.json
expect_error "is neither ChatML nor Llama 3" data prepare --input chat.jsonl --output x --tokenizer hf \
  --tokenizer-file other/tokenizer.json --format chat
# The text format is unchanged: the JSON lines' "text" member, EOD appended, no mask.
echo '{"text": "hello"}' > text.jsonl
"$MT" data prepare --input text.jsonl --output plain --tokenizer byte >/dev/null
[ -e plain.bin ] && [ ! -e plain_mask.bin ] || fail "text format wrote a mask"
echo "PASS"
