#!/usr/bin/env bash
# Qwen2 / Qwen2.5 to and from transformers' Qwen2ForCausalLM (issue 44, item 2): Llama's layers with biases on q, k
# and v (model.qkv_bias), sharded with their column-parallel weights.
# - A tiny random Qwen2ForCausalLM made by transformers (every weight and bias random, grouped-query attention,
#   untied, and a tied twin) imports with transformers' mean loss (fp32, within 1e-5 relative).
# - It trains from the import on one rank, in TP2 x PP2 (sequence parallel) and in CP2 with the same losses (within
#   1e-5); the trained checkpoint exports to a Qwen2ForCausalLM that transformers loads strictly with `megatrain
#   eval`'s loss, and greedy `generate` of 20 tokens on 5 prompts equals transformers' generate on the export.
# - Bad input is refused by name: use_sliding_window true (not modelled yet), model.qkv_bias with model.arch gpt.
# Skips (77), saying so, without the interop Python (scripts/python-env.sh).
source "$(dirname "$0")/lib/common.bash"
require_interop_python torch transformers
TINY="$SRC/tests/interop/hf_tiny_model.py"
prepare_data
mean_loss() { sed -nE 's/.*mean loss ([0-9.]+).*/\1/p'; }
close() {  # NAME LOSS REFERENCE: within 1e-5 relative
  python3 -c "import sys; a, b = float('$2'), float('$3'); print(f'$1: {a} vs {b}, diff {abs(a - b):.3g}'); sys.exit(abs(a - b) > 1e-5 * abs(b))" ||
    fail "$1: the losses differ"
}

# Import, untied and tied: megatrain eval = transformers' loss.
for tie in "" --tie; do
  name=made${tie:+_tied}
  "$PY" "$TINY" make qwen2 "$name" --heads 4 --groups 2 $tie >make.log 2>&1 ||
    { cat make.log; fail "transformers could not make a Qwen2"; }
  "$MT" ckpt import "$name" --format hf --output "$name.imp" >import.log 2>&1 || { cat import.log; fail "$name: import failed"; }
  grep -q "qkv_bias: true" "$name.imp/model.yaml" || fail "$name: the import's model.yaml lacks qkv_bias"
  ours=$("$MT" eval --checkpoint "$name.imp" --data data/text_document --samples 6 --device cpu | mean_loss)
  theirs=$("$PY" "$TINY" loss "$name" data/text_document 64 6 2>py.err) || { cat py.err >&2; fail "transformers failed"; }
  close "import $name (megatrain eval vs transformers)" "$ours" "$theirs"
done

# Training from the import: one rank, TP2 x PP2 with sequence parallelism, CP2 alike.
{ grep -v '^#' made.imp/model.yaml | sed 's/seq_length: 64/seq_length: 32/'; cat <<'YAML'
training: {micro_batch_size: 4, global_batch_size: 8, train_iters: 4, precision: fp32, seed: 1234, device: cpu}
optimizer: {lr: 2.0e-3, min_lr: 2.0e-3, warmup_iters: 0, weight_decay: 0.0, decay: constant}
data: {train: [data/text_document], split: [95, 5, 0]}
checkpoint: {save_dir: "", load: made.imp}
logging: {dir: run, interval: 1}
YAML
} >ft.yaml
"$MT" --config ft.yaml --set logging.dir=one --set checkpoint.save_dir=ckpt >one.log 2>&1 ||
  { tail one.log; fail "training from the import failed"; }
grep -q "resumed from made.imp" one.log || fail "the run did not load the import"
"$MT" --config ft.yaml --nproc 4 --set parallel.tensor=2 --set parallel.pipeline=2 \
      --set parallel.sequence_parallel=true --set logging.dir=tp2pp2 >tp2pp2.log 2>&1 ||
  { tail tp2pp2.log; fail "TP2 x PP2 training from the import failed"; }
same_losses one/metrics.jsonl tp2pp2/metrics.jsonl 1 4 1e-5 || fail "TP2 x PP2 losses differ from one rank's"
"$MT" --config ft.yaml --nproc 2 --set parallel.context=2 --set logging.dir=cp2 >cp2.log 2>&1 ||
  { tail cp2.log; fail "CP2 training from the import failed"; }
same_losses one/metrics.jsonl cp2/metrics.jsonl 1 4 1e-5 || fail "CP2 losses differ from one rank's"

# Export of the trained checkpoint: a Qwen2ForCausalLM with its loss and its greedy continuations.
"$MT" ckpt export ckpt --format hf --output hf >/dev/null || fail "export failed"
grep -q '"Qwen2ForCausalLM"' hf/config.json || fail "config.json does not name Qwen2ForCausalLM"
"$PY" "$TINY" load-strict hf 2>py.err || { cat py.err >&2; fail "strict load failed"; }
ours=$("$MT" eval --checkpoint ckpt --data data/text_document --samples 6 --device cpu | mean_loss)
theirs=$("$PY" "$TINY" loss hf data/text_document 32 6 2>py.err) || { cat py.err >&2; fail "transformers failed"; }
close "export (megatrain eval vs transformers)" "$ours" "$theirs"
prompts=("Permission is hereby granted " "The GNU General Public License " "x" "0123" "Copyright (C) ")
all=""
for prompt in "${prompts[@]}"; do all+="${all:+,}$(printf '%s' "$prompt" | od -An -tu1 -v | xargs)"; done
mapfile -t theirs < <("$PY" "$SRC/tests/interop/hf_greedy_generate.py" "$PWD/hf" "$all" 20 2>py.err || echo FAILED)
[ ${#theirs[@]} -eq ${#prompts[@]} ] && [ "${theirs[-1]}" != FAILED ] || { cat py.err >&2; fail "transformers failed"; }
for i in "${!prompts[@]}"; do
  ours=$("$MT" generate --load ckpt --prompt "${prompts[$i]}" --greedy --max-new-tokens 20 --ids --device cpu \
         2>gen.err) || { cat gen.err >&2; fail "megatrain generate failed"; }
  [ -n "$ours" ] && [ "$ours" = "${theirs[$i]}" ] ||
    fail "prompt '${prompts[$i]}': greedy continuations differ: megatrain '$ours', transformers '${theirs[$i]}'"
done
echo "greedy generate: ${#prompts[@]} prompts x 20 tokens identical to transformers"

# Refusals, by name.
python3 - made/config.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["use_sliding_window"] = True; c["sliding_window"] = 16
json.dump(c, open(sys.argv[1], "w"))
PY
expect_error "use_sliding_window" ckpt import made --format hf --output windowed
[ ! -e windowed ] || fail "a refused import left its output directory"
write_config
expect_error "model.qkv_bias" --config tiny.yaml --set model.qkv_bias=true
echo "PASS"
