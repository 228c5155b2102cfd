#!/usr/bin/env bash
# `megatrain ckpt import --format hf` means what transformers means: a tiny random GPT2LMHeadModel (and a
# LlamaForCausalLM with grouped-query attention, G < H) made and saved by transformers is imported; `megatrain
# eval` gives transformers' mean loss on the same samples (fp32, within 1e-5 relative); then 3 training
# iterations from the import run at TP1, TP2 and PP2 with the same losses, and lower the eval loss.
# Needs the interop Python (torch, transformers: scripts/python-env.sh); exits 77 (skipped), saying so, without it.
source "$(dirname "$0")/lib/common.bash"
require_interop_python torch transformers
TINY="$SRC/tests/interop/hf_tiny_model.py"
prepare_data

mean_loss() { sed -nE 's/.*mean loss ([0-9.]+).*/\1/p'; }

# check_import NAME ARCH [make options...]
check_import() {
  local name=$1 arch=$2; shift 2
  mkdir "$name" && pushd "$name" >/dev/null
  ln -s ../data data
  "$PY" "$TINY" make "$arch" hf "$@" >make.log 2>&1 || { cat make.log; fail "$name: transformers could not make the model"; }
  "$MT" ckpt import hf --format hf --output imp >import.log 2>&1 || { cat import.log; fail "$name: import failed"; }
  local ours theirs
  ours=$("$MT" eval --checkpoint imp --data data/text_document --samples 6 --device cpu | mean_loss)
  theirs=$("$PY" "$TINY" loss hf data/text_document 64 6 2>py.err) || { cat py.err; fail "$name: transformers failed"; }
  python3 -c "import sys; a, b = float('$ours'), float('$theirs'); print(f'$name: megatrain eval {a} transformers {b}'); sys.exit(abs(a - b) > 1e-5 * abs(b))" ||
    fail "$name: the imported model's loss differs from transformers'"

  { grep -v '^#' imp/model.yaml; cat <<'YAML'
training: {micro_batch_size: 4, global_batch_size: 8, train_iters: 3, precision: fp32, seed: 1234, device: cpu}
optimizer: {lr: 2.0e-3, min_lr: 2.0e-3, warmup_iters: 0, weight_decay: 0.0, decay: constant}
data: {train: [data/text_document], split: [95, 5, 0]}
checkpoint: {save_dir: "", load: imp}
logging: {dir: run, interval: 1}
YAML
  } >ft.yaml
  "$MT" --config ft.yaml --set logging.dir=tp1 --set checkpoint.save_dir=tuned >tp1.log 2>&1 || { tail tp1.log; fail "$name: TP1 training failed"; }
  grep -q "resumed from imp" tp1.log || fail "$name: the run did not load the import"
  "$MT" --config ft.yaml --nproc 2 --set parallel.tensor=2 --set logging.dir=tp2 >tp2.log 2>&1 || { tail tp2.log; fail "$name: TP2 training failed"; }
  "$MT" --config ft.yaml --nproc 2 --set parallel.pipeline=2 --set logging.dir=pp2 >pp2.log 2>&1 || { tail pp2.log; fail "$name: PP2 training failed"; }
  same_losses tp1/metrics.jsonl tp2/metrics.jsonl 1 3 1e-5 || fail "$name: TP2 losses differ from TP1"
  same_losses tp1/metrics.jsonl pp2/metrics.jsonl 1 3 1e-5 || fail "$name: PP2 losses differ from TP1"
  local tuned
  tuned=$("$MT" eval --checkpoint tuned --data data/text_document --samples 6 --device cpu | mean_loss)
  python3 -c "import sys; a, b = float('$ours'), float('$tuned'); print(f'$name: eval loss {a} -> {b} after 3 iterations'); sys.exit(not b < a)" ||
    fail "$name: training from the import did not lower the loss"
  popd >/dev/null
}

check_import gpt2 gpt2 --tie
check_import llama llama --heads 4 --groups 2
echo "PASS"
