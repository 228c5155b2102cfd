#!/usr/bin/env bash
# megatrain's LoRA means what peft means (issue 28). For a tiny random LlamaForCausalLM (grouped-query attention), a
# GPT2LMHeadModel and a MixtralForCausalLM (4 experts, top 2; its experts' adapters exported as peft's target_parameters
# on transformers 5's fused experts.gate_up_proj and down_proj) made by transformers and imported:
# - one LoRA step (weight decay 0, so A keeps its initial value and only B moved) on a dataset of exactly one global
#   batch: peft, with the exported adapter's A and B = 0, gives the step's loss and grad norm within 1e-5, and its
#   gradient gives megatrain's first Adam step on every element of B (our fused qkv / gate-up B split into
#   q/k/v and gate/up rows, each with the shared A); with optimizer.eps 1 that step is lr g / (|g| + 1), nearly
#   linear in g, so every element of B's gradient equals peft's within 1e-5 of the largest;
# - after more steps, the exported PEFT adapter loaded by peft on the base's export gives `megatrain eval`'s loss
#   within 1e-5, and so does the merged export (W + alpha/rank B A) loaded by transformers alone; `generate` on the
#   LoRA checkpoint (adapters folded in) writes the merged model's greedy text.
# Needs the interop Python (torch, transformers, peft: scripts/python-env.sh); exits 77 (skipped), saying so, without it.
source "$(dirname "$0")/lib/common.bash"
require_interop_python torch transformers peft
TINY="$SRC/tests/interop/hf_tiny_model.py"
PEFT="$SRC/tests/interop/lora_peft.py"
S=64
# One document of 8 * S + 1 byte tokens: exactly 8 samples, one global batch.
python3 -c "
import random; r = random.Random(0); open('doc.txt', 'w').write(''.join(r.choice('abcdefghij klmnop') for _ in range(8 * $S)))"
"$MT" data prepare --input doc.txt --output batch --tokenizer byte >/dev/null
mean_loss() { sed -nE 's/.*mean loss ([0-9.]+).*/\1/p'; }
close() {  # label a b: within 1e-5 relative
  python3 -c "import sys; a, b = float('$2'), float('$3'); print(f'$1: megatrain {a} peft {b}'); sys.exit(abs(a - b) > 1e-5 * abs(b))" ||
    fail "$1 differs"
}

check() {  # NAME ARCH [make options...]
  local name=$1 arch=$2; shift 2
  mkdir "$name" && pushd "$name" >/dev/null
  "$PY" "$TINY" make "$arch" hf "$@" >make.log 2>&1 || { cat make.log; fail "$name: transformers could not make the model"; }
  "$MT" ckpt import hf --format hf --output imp >/dev/null 2>import.log || { cat import.log; fail "$name: import failed"; }
  "$MT" ckpt export imp --format hf --output base_hf >/dev/null 2>&1 || fail "$name: base export failed"
  { grep -v '^#' imp/model.yaml; cat <<YAML
training: {micro_batch_size: 4, global_batch_size: 8, train_iters: 1, precision: fp32, seed: 7, device: cpu,
           init_from: imp}
optimizer: {lr: 1.0e-2, min_lr: 1.0e-2, warmup_iters: 0, weight_decay: 0.0, decay: constant, grad_clip: 0}
data: {train: [../batch], split: [100, 0, 0]}
checkpoint: {save_dir: ckpt, load: auto}
logging: {dir: run, interval: 1}
finetune:
  lora: {rank: 4, alpha: 8, dropout: 0}
YAML
  } >lora.yaml
  # A mixture of experts: peft's loss has no router aux loss (output_router_logits off), so neither has our objective.
  sed -i 's/aux_loss_coeff: [0-9.e+-]*/aux_loss_coeff: 0/' lora.yaml
  "$MT" --config lora.yaml --set optimizer.eps=1.0 >one.log 2>&1 || { tail one.log; fail "$name: the LoRA step failed"; }
  grep -q "8 samples per epoch" one.log || { grep "data:" one.log; fail "$name: the data is not one global batch"; }
  "$MT" ckpt export ckpt --format hf --lora peft --output step1 >/dev/null 2>export.log ||
    { cat export.log; fail "$name: the PEFT export failed"; }
  local got
  got=$("$PY" "$PEFT" first-step base_hf step1 ../batch $S 8 1.0e-2 1.0 2>py.err) || { cat py.err; fail "$name: peft failed"; }
  python3 - run/metrics.jsonl "$got" "$name" <<'PY' || fail "$name: the first step differs from peft's"
import json, sys
ours = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r][0]
theirs = json.loads(sys.argv[2])
print(f"{sys.argv[3]} step 1: loss {ours['loss']} / peft {theirs['loss']}, grad norm {ours['grad_norm']} / peft "
      f"{theirs['grad_norm']}, worst gradient difference on B (through the step) "
      f"{theirs['worst_step_difference'] / theirs['largest_grad']:.2e} of the largest |g| {theirs['largest_grad']:.3e}")
assert abs(ours["loss"] - theirs["loss"]) <= 1e-5 * abs(theirs["loss"])
assert abs(ours["grad_norm"] - theirs["grad_norm"]) <= 1e-5 * theirs["grad_norm"]
assert theirs["worst_step_difference"] <= 1e-5 * theirs["largest_grad"]
PY
  # More steps (A and B both move), then eval against peft and the merged export.
  "$MT" --config lora.yaml --set training.train_iters=5 >five.log 2>&1 || { tail five.log; fail "$name: training on failed"; }
  "$MT" ckpt export ckpt --format hf --lora peft --output adapter >/dev/null 2>&1 || fail "$name: PEFT export failed"
  "$MT" ckpt export ckpt --format hf --output merged >/dev/null 2>&1 || fail "$name: merged export failed"
  local ours theirs merged
  ours=$("$MT" eval --checkpoint ckpt --data ../batch --samples 8 --device cpu | mean_loss)
  theirs=$("$PY" "$PEFT" loss base_hf adapter ../batch $S 8 2>py.err) || { cat py.err; fail "$name: peft failed"; }
  merged=$("$PY" "$TINY" loss merged ../batch $S 8 2>py.err) || { cat py.err; fail "$name: transformers failed"; }
  close "$name eval vs peft adapter" "$ours" "$theirs"
  close "$name eval vs merged export" "$ours" "$merged"
  python3 - run/metrics.jsonl "$ours" <<'PY' ||
import json, sys
first = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r][0]
print(f"loss {first} at step 1 -> eval {sys.argv[2]} after 5")
sys.exit(not float(sys.argv[2]) < first)
PY
    fail "$name: LoRA did not lower the loss"
  # generate folds the adapters into the weights: greedy text equals the merged export's, imported back.
  "$MT" ckpt import merged --format hf --output merged_imp >/dev/null 2>&1 || fail "$name: importing the merged export failed"
  "$MT" generate --load ckpt --prompt "abc" --max-new-tokens 12 --greedy 2>/dev/null | tail -1 >gen_lora.txt
  "$MT" generate --load merged_imp --prompt "abc" --max-new-tokens 12 --greedy 2>/dev/null | tail -1 >gen_merged.txt
  [ -s gen_lora.txt ] && cmp -s gen_lora.txt gen_merged.txt ||
    { cat gen_lora.txt gen_merged.txt; fail "$name: generate on the LoRA checkpoint differs from the merged model's"; }
  echo "$name: generate on the LoRA checkpoint equals the merged model's: $(cat gen_lora.txt)"
  popd >/dev/null
}

check llama llama --heads 4 --groups 2
check gpt2 gpt2 --tie
check mixtral mixtral --heads 4 --groups 2
echo "PASS"
