#!/usr/bin/env bash
# The progress line of a long job (issue 30, item 16): `data prepare --progress` prints it on standard error even
# under a pipe (here its last line: the inputs take less than the line's interval); by default, with standard
# error not a terminal, and with --quiet, nothing is printed there; --progress and --quiet exclude each other.
# ckpt export --progress and ckpt import --progress report their tensors the same way.
source "$(dirname "$0")/lib/common.bash"
mapfile -t inputs < <(find /usr/share/common-licenses -type f | sort)
"$MT" data prepare --input "${inputs[@]}" --output a --tokenizer byte --progress 2>err.txt | cat >out.txt ||
  fail "data prepare --progress failed: $(cat err.txt)"
grep -Eq '^data prepare: done: [0-9]+ documents, [0-9]+ tokens, [0-9.]+ MB in [0-9]+s, [0-9.]+ MB/s$' err.txt ||
  fail "no progress line on standard error: $(cat err.txt)"
grep -q "data prepare:" out.txt && fail "the progress line went to standard output"
grep -q "^wrote a.bin" out.txt || fail "the summary is missing from standard output: $(cat out.txt)"

"$MT" data prepare --input "${inputs[@]}" --output b --tokenizer byte 2>err.txt | cat >/dev/null ||
  fail "data prepare failed: $(cat err.txt)"
[ ! -s err.txt ] || fail "data prepare printed on a standard error that is not a terminal: $(cat err.txt)"
"$MT" data prepare --input "${inputs[@]}" --output c --tokenizer byte --quiet 2>err.txt >/dev/null ||
  fail "data prepare --quiet failed: $(cat err.txt)"
[ ! -s err.txt ] || fail "data prepare --quiet printed: $(cat err.txt)"
if "$MT" data prepare --input "${inputs[@]}" --output d --tokenizer byte --quiet --progress >/dev/null 2>err.txt; then
  fail "--quiet --progress was accepted"
fi
grep -q -- "--quiet excludes --progress\|--progress excludes --quiet" err.txt || fail "unclear refusal: $(cat err.txt)"

write_config
"$MT" --config tiny.yaml --set training.train_iters=6 --set data.train=[a] --set checkpoint.save_dir=ckpt \
  >/dev/null 2>&1 || fail "training on the prepared data failed"
"$MT" ckpt export ckpt --output hf --progress >/dev/null 2>err.txt || fail "ckpt export failed: $(cat err.txt)"
grep -Eq '^ckpt export: done: ([0-9]+)/\1 tensors, [0-9.]+ MB in [0-9]+s, [0-9.]+ MB/s$' err.txt ||
  fail "no export progress line: $(cat err.txt)"
"$MT" ckpt export ckpt --output hf2 >/dev/null 2>err.txt || fail "ckpt export failed: $(cat err.txt)"
[ ! -s err.txt ] || fail "ckpt export printed on a standard error that is not a terminal: $(cat err.txt)"
"$MT" ckpt import hf --output imported --progress >/dev/null 2>err.txt || fail "ckpt import failed: $(cat err.txt)"
grep -Eq '^ckpt import: read: done: ([0-9]+)/\1 tensors, [0-9.]+ MB in' err.txt || fail "no import read line: $(cat err.txt)"
grep -Eq '^ckpt import: save: done: ([0-9]+)/\1 tensors, [0-9.]+ MB in' err.txt || fail "no import save line: $(cat err.txt)"
echo "PASS: progress lines with --progress, none under a pipe or with --quiet"
