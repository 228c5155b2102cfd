#!/usr/bin/env bash
# `data prepare --format chat` gives exactly transformers' apply_chat_template(messages, tokenize=True) ids for the
# ChatML and Llama 3 templates (a tiny byte-level BPE trained offline with the `tokenizers` package, its
# tokenizer_config.json holding the template), and its loss mask marks exactly the assistants' contents and end
# tokens (tests/interop/check_chat_template.py). Skips (77), saying so, without the interop Python
# (scripts/python-env.sh).
source "$(dirname "$0")/lib/common.bash"
require_interop_python transformers tokenizers
"$PY" "$SRC/tests/interop/check_chat_template.py" "$MT" chat | tee check.log
grep -q "^total: 0 mismatches$" check.log || fail "megatrain and apply_chat_template disagree"
echo "PASS"
