#!/usr/bin/env bash
# Training on supervised fine-tuning data (issue 28): with PREFIX_mask beside the tokens (data.loss_mask: auto),
# the loss counts only the answers' tokens, averaged over those of the whole global batch. Shown by:
# - an all-ones mask gives the unmasked run's losses within 1e-6 (the weighted path is the plain mean);
# - the real mask changes the loss, and data.loss_mask=false ignores it;
# - one rank with 8, 2 or 4 microbatches of different sizes (a per-microbatch mean would differ: their counts
#   of answer tokens differ) and TP+SP, PP interleaved, PP 4, DP with the distributed optimizer, DP 4 and
#   TP x PP x DP all give the same losses (training and validation) within 1e-6;
# - bad input: a mask not matching its tokens, a mask on only some datasets, data.loss_mask=true without masks,
#   an all-masked global batch (an error naming the iteration, never a NaN);
# - context parallelism (CP 2 and 4, ring and all-gather, with DP + ZeRO and TP + SP) gives one rank's losses.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/sft.bash"
prepare_chat_data 64
write_sft_config

valid_losses() {  # metrics file -> "iteration valid_loss" lines
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "valid_loss" in r: print(r["iteration"], repr(r["valid_loss"]))' "$1"
}

"$MT" --config sft.yaml --set logging.dir=one >one.log 2>&1 || { cat one.log; fail "masked run failed"; }
grep -q "loss only where the loss masks" one.log || fail "the run does not say it trains on the loss masks"
"$MT" --config sft.yaml --set data.loss_mask=false --set logging.dir=nomask >/dev/null 2>&1
python3 - <<'PY'
import json
def first(p): return [r["loss"] for r in map(json.loads, open(p)) if "loss" in r][0]
a, b = first("one/metrics.jsonl"), first("nomask/metrics.jsonl")
assert abs(a - b) > 1e-3, f"the mask changes nothing: {a} vs {b}"
print(f"ok: first loss masked {a:.6f}, every token {b:.6f}")
PY

# An all-ones mask is the plain mean.
mkdir ones && cp sft.bin sft.idx ones/ && cp sft_mask.idx ones/sft_mask.idx
python3 -c 'import os; n = os.path.getsize("sft_mask.bin"); open("ones/sft_mask.bin", "wb").write(b"\x01" * n)'
"$MT" --config sft.yaml --set data.train=[ones/sft] --set logging.dir=ones_run >/dev/null 2>&1
"$MT" --config sft.yaml --set data.train=[ones/sft] --set data.loss_mask=false --set logging.dir=ones_plain \
  >/dev/null 2>&1
same_losses ones_plain/metrics.jsonl ones_run/metrics.jsonl 1 6 1e-6
same_valid ones_plain/metrics.jsonl ones_run/metrics.jsonl

# Layouts and microbatch sizes: the mean over the global batch's answer tokens, whatever the split.
count=0
for layout in "1 1 1 1 false false 2" "1 1 1 1 false false 8" "2 1 1 1 true false 1" "1 2 1 2 false false 1" \
              "1 4 1 1 false false 1" "1 1 2 1 false true 1" "1 1 4 1 false false 2" "2 2 2 2 true true 1"; do
  read -r tp pp dp vp sp zero mbs <<<"$layout"
  world=$((tp * pp * dp))
  dir=tp${tp}pp${pp}dp${dp}vp${vp}mbs${mbs}
  "$MT" --config sft.yaml --nproc $world --set parallel.tensor=$tp --set parallel.pipeline=$pp \
        --set parallel.virtual_pipeline=$vp --set parallel.sequence_parallel=$sp \
        --set parallel.distributed_optimizer=$zero --set training.micro_batch_size=$mbs \
        --set logging.dir=$dir >/dev/null 2>$dir.err || { tail -5 $dir.err; fail "$dir failed"; }
  same_losses one/metrics.jsonl $dir/metrics.jsonl 1 6 1e-6
  same_valid one/metrics.jsonl $dir/metrics.jsonl
  count=$((count + 1))
done
echo "ok: $count layouts give one rank's masked losses (training and validation) within 1e-6"

# Context parallelism cuts each sample's mask into the rank's two chunks as it cuts the targets: one rank's masked
# losses (dropout off, which CP needs), alone, ring or all-gather, with DP + ZeRO and with TP + SP.
nodrop=(--config sft.yaml --set model.dropout=0 --set model.attention_dropout=0)
"$MT" "${nodrop[@]}" --set logging.dir=nodrop >/dev/null 2>nodrop.err || { tail -5 nodrop.err; fail "no-dropout run"; }
for layout in "2 p2p 1 1" "4 allgather 1 1" "2 p2p 1 2" "2 allgather 2 1"; do
  read -r cp comm tp dp <<<"$layout"
  dir=cp${cp}${comm}tp${tp}dp${dp}
  "$MT" "${nodrop[@]}" --nproc $((cp * tp * dp)) --set parallel.context=$cp --set parallel.context_comm=$comm \
        --set parallel.tensor=$tp --set parallel.sequence_parallel=$([ "$tp" -gt 1 ] && echo true || echo false) \
        --set parallel.distributed_optimizer=$([ "$dp" -gt 1 ] && echo true || echo false) \
        --set logging.dir=$dir >/dev/null 2>$dir.err || { tail -5 $dir.err; fail "$dir failed"; }
  same_losses nodrop/metrics.jsonl $dir/metrics.jsonl 1 6 1e-6
  same_valid nodrop/metrics.jsonl $dir/metrics.jsonl
done
echo "ok: context parallelism gives one rank's masked losses (training and validation) within 1e-6"

# Bad input.
python3 -c 'import json
with open("text.jsonl", "w") as f:
    for l in open("chat.jsonl"): f.write(json.dumps({"text": l}) + "\n")'
"$MT" data prepare --input text.jsonl --tokenizer hf --tokenizer-file tok/tokenizer.json --output plain >/dev/null
expect_error "data.train: plain has no loss mask plain_mask.bin/.idx (but sft has one)" \
  --config sft.yaml --set 'data.train=[sft, plain]' --set data.allow_tokenizer_change=true
expect_error "data.train: plain has no loss mask plain_mask.bin/.idx (data.loss_mask is true)" \
  --config sft.yaml --set 'data.train=[plain]' --set data.loss_mask=true
mkdir short && cp sft.bin sft.idx short/
python3 - <<'PY'
import json, random
rng = random.Random(1)
with open("few.jsonl", "w") as f:
    for i in range(8): f.write(json.dumps({"prompt": "a b c", "response": "d e"}) + "\n")
PY
"$MT" data prepare --input few.jsonl --tokenizer hf --tokenizer-file tok/tokenizer.json --format chat \
  --output few >/dev/null
cp few_mask.bin short/sft_mask.bin && cp few_mask.idx short/sft_mask.idx
expect_error "data.train: the loss mask short/sft_mask.bin/.idx does not match the tokens short/sft.bin/.idx" \
  --config sft.yaml --set 'data.train=[short/sft]'
mkdir zeros && cp sft.bin sft.idx sft_mask.idx zeros/
python3 -c 'import os; n = os.path.getsize("sft_mask.bin"); open("zeros/sft_mask.bin", "wb").write(b"\x00" * n)'
expect_error "iteration 1's global batch (samples \[0, 8)): every target's loss mask is 0" \
  --config sft.yaml --set 'data.train=[zeros/sft]'
grep -qi "nan" err.txt && fail "an all-masked batch printed a NaN"
echo "PASS"
