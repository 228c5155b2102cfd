#!/usr/bin/env bash
# Golden values from transformers, checked on every run without Python packages: tests/data/hf/ holds a tiny
# random LlamaForCausalLM (grouped-query attention, untied, rope_theta 5000) and GPT2LMHeadModel saved by
# transformers, and golden.txt their mean fp32 losses on corpus.txt (tests/interop/make_hf_golden.py made them).
# `megatrain ckpt import` + `megatrain eval` must give each within 1e-5 relative; then the imported Llama's
# own export (`ckpt export --format hf`) imported again evaluates to the same loss.
source "$(dirname "$0")/lib/common.bash"
GOLD="$SRC/tests/data/hf"
"$MT" data prepare --input "$GOLD/corpus.txt" --output corpus --tokenizer byte >/dev/null
mean_loss() { sed -nE 's/.*mean loss ([0-9.]+).*/\1/p'; }
check() {  # name checkpoint expected
  local ours
  ours=$("$MT" eval --checkpoint "$2" --data corpus --samples 6 --device cpu | mean_loss)
  python3 -c "import sys; a, b = float('$ours'), float('$3'); print(f'$1: megatrain {a} transformers {b} (relative {abs(a - b) / b:.1e})'); sys.exit(abs(a - b) > 1e-5 * b)" \
    || fail "$1: the loss differs from transformers' golden value"
}
while read -r name loss; do
  [ "${name:0:1}" = "#" ] && continue
  "$MT" ckpt import "$GOLD/$name" --format hf --output "imp_$name" >"import_$name.log" 2>&1 \
    || { cat "import_$name.log"; fail "$name: import failed"; }
  check "$name" "imp_$name" "$loss"
  "$MT" ckpt export "imp_$name" --format hf --output "exp_$name" >/dev/null
  "$MT" ckpt import "exp_$name" --format hf --output "again_$name" >/dev/null
  check "$name (exported and imported again)" "again_$name" "$loss"
done <"$GOLD/golden.txt"
echo PASS
