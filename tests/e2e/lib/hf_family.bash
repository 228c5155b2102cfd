# hf_family.bash: the checks every Hugging Face family's interop test makes (issue 44's "in and out exactly"), on a
# tiny random model transformers made and saved. Needs common.bash sourced, require_interop_python done and
# prepare_data's data/text_document (byte tokens).
TINY="$SRC/tests/interop/hf_tiny_model.py"
mean_loss() { sed -nE 's/.*mean loss ([0-9.]+).*/\1/p'; }

# close NAME LOSS REFERENCE: within 1e-5 relative.
close() {
  python3 -c "import sys; a, b = float('$2'), float('$3'); print(f'$1: {a} vs {b}, diff {abs(a - b):.3g}'); sys.exit(abs(a - b) > 1e-5 * abs(b))" ||
    fail "$1: the losses differ"
}

# check_import HF_DIR OUT SEQ: `ckpt import` of HF_DIR into OUT, whose `megatrain eval` over 6 samples of SEQ
# tokens equals transformers' loss.
check_import() {
  "$MT" ckpt import "$1" --format hf --output "$2" >import.log 2>&1 || { cat import.log; fail "$1: import failed"; }
  local ours theirs
  ours=$("$MT" eval --checkpoint "$2" --data data/text_document --samples 6 --device cpu | mean_loss)
  theirs=$("$PY" "$TINY" loss "$1" data/text_document "$3" 6 2>py.err) || { cat py.err >&2; fail "transformers failed"; }
  close "import $1 (megatrain eval vs transformers)" "$ours" "$theirs"
}

# check_training_layouts IMPORT CKPT [--set ...]: 4 fp32 steps of 32 tokens from the import on one rank (saved in
# CKPT), in TP2 x PP2 with sequence parallelism and in CP2, each with one rank's losses (within 1e-5). Extra --set
# arguments go to every run.
check_training_layouts() {
  local imp=$1 ckpt=$2
  shift 2
  { grep -v '^#' "$imp/model.yaml" | sed 's/seq_length: 64/seq_length: 32/'; cat <<YAML
training: {micro_batch_size: 4, global_batch_size: 8, train_iters: 4, precision: fp32, seed: 1234, device: cpu}
optimizer: {lr: 2.0e-3, min_lr: 2.0e-3, warmup_iters: 0, weight_decay: 0.0, decay: constant}
data: {train: [data/text_document], split: [95, 5, 0]}
checkpoint: {save_dir: "", load: $imp}
logging: {dir: run, interval: 1}
YAML
  } >ft.yaml
  rm -rf one tp2pp2 cp2 "$ckpt"
  "$MT" --config ft.yaml --set logging.dir=one --set "checkpoint.save_dir=$ckpt" "$@" >one.log 2>&1 ||
    { tail one.log; fail "training from $imp failed"; }
  grep -q "resumed from $imp" one.log || fail "the run did not load $imp"
  "$MT" --config ft.yaml --nproc 4 --set parallel.tensor=2 --set parallel.pipeline=2 \
        --set parallel.sequence_parallel=true --set logging.dir=tp2pp2 "$@" >tp2pp2.log 2>&1 ||
    { tail tp2pp2.log; fail "TP2 x PP2 training from $imp failed"; }
  same_losses one/metrics.jsonl tp2pp2/metrics.jsonl 1 4 1e-5 || fail "$imp: TP2 x PP2 losses differ from one rank's"
  "$MT" --config ft.yaml --nproc 2 --set parallel.context=2 --set logging.dir=cp2 "$@" >cp2.log 2>&1 ||
    { tail cp2.log; fail "CP2 training from $imp failed"; }
  same_losses one/metrics.jsonl cp2/metrics.jsonl 1 4 1e-5 || fail "$imp: CP2 losses differ from one rank's"
}

# check_export CKPT OUT CLASS [SEQ]: `ckpt export` of CKPT to OUT names CLASS, loads strictly into transformers and
# has `megatrain eval`'s loss (SEQ-token samples, CKPT's model.seq_length: 32 as check_training_layouts trains, 64 as
# an import holds).
check_export() {
  "$MT" ckpt export "$1" --format hf --output "$2" >/dev/null || fail "export of $1 failed"
  grep -q "\"$3\"" "$2/config.json" || fail "$2/config.json does not name $3"
  "$PY" "$TINY" load-strict "$2" 2>py.err || { cat py.err >&2; fail "strict load of $2 failed"; }
  local ours theirs
  ours=$("$MT" eval --checkpoint "$1" --data data/text_document --samples 6 --device cpu | mean_loss)
  theirs=$("$PY" "$TINY" loss "$2" data/text_document "${4:-32}" 6 2>py.err) ||
    { cat py.err >&2; fail "transformers failed"; }
  close "export $2 (megatrain eval vs transformers)" "$ours" "$theirs"
}

# check_greedy CKPT HF_DIR [PROMPT...]: greedy `generate` of 20 tokens from CKPT equals transformers' generate on its
# export HF_DIR, on the prompts (byte tokens; 5 of the license texts' kind by default). transformers runs once for
# all of them (loading torch is most of its time).
check_greedy() {
  local ckpt=$1 hf=$2
  shift 2
  local prompts=("$@")
  [ ${#prompts[@]} -gt 0 ] ||
    prompts=("Permission is hereby granted " "The GNU General Public License " "x" "0123" "Copyright (C) ")
  local all="" i ours
  for prompt in "${prompts[@]}"; do all+="${all:+,}$(printf '%s' "$prompt" | od -An -tu1 -v | xargs)"; done
  local theirs
  mapfile -t theirs < <("$PY" "$SRC/tests/interop/hf_greedy_generate.py" "$PWD/$hf" "$all" 20 2>py.err || echo FAILED)
  [ ${#theirs[@]} -eq ${#prompts[@]} ] && [ "${theirs[-1]}" != FAILED ] || { cat py.err >&2; fail "transformers failed"; }
  for i in "${!prompts[@]}"; do
    ours=$("$MT" generate --load "$ckpt" --prompt "${prompts[$i]}" --greedy --max-new-tokens 20 --ids --device cpu \
           2>gen.err) || { cat gen.err >&2; fail "megatrain generate failed"; }
    [ -n "$ours" ] && [ "$ours" = "${theirs[$i]}" ] ||
      fail "$ckpt, prompt '${prompts[$i]}': greedy continuations differ: megatrain '$ours', transformers '${theirs[$i]}'"
  done
  echo "greedy generate from $ckpt: ${#prompts[@]} prompts x 20 tokens identical to transformers"
}

# edit_config HF_DIR PYTHON: runs PYTHON with `c`, HF_DIR/config.json's object, and writes c back.
edit_config() {
  python3 - "$1/config.json" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
exec(sys.argv[2])
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
}

# expect_import_refused HF_DIR NAME PYTHON PATTERN: a copy NAME of HF_DIR whose config.json PYTHON edits (as
# edit_config) is refused by `ckpt import` with PATTERN in its error, leaving no output directory.
expect_import_refused() {
  cp -r "$1" "$2"
  edit_config "$2" "$3"
  expect_error "$4" ckpt import "$2" --format hf --output "$2.imp"
  [ ! -e "$2.imp" ] || fail "the refused import of $2 left its output directory"
}
