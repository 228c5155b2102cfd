#!/usr/bin/env bash
# data.sft_packing: pack (issue 28): conversations packed to seq_length with position ids and attention reset at
# every document boundary (Megatron's reset_position_ids + reset_attention_mask). Shown by:
# - per-document equivalence: with every conversation L tokens long and seq_length 2L, a packed sample holds two
#   whole conversations; a packed run's losses equal a pad run's (one conversation per sample, padded) over the
#   same conversations within 1e-6 (iteration 1) and 1e-5 (later), for learned (GPT) and rotary (Llama) positions;
#   concat's (no reset: the second conversation sees the first) differ;
# - layout invariance: TP2+SP x PP2 (interleaved) x DP2 with the distributed optimizer, and DP2 x TP2 with
#   micro-batch 2 and full recomputation, give one rank's packed training and validation losses within 1e-6
#   (dropout on);
# - context parallelism: CP2, CP2 x TP2 (SP) and CP2 x DP2 give one rank's packed training and validation losses
#   within 1e-6 (dropout on), for learned (GPT) and rotary (Llama) positions, with documents cut by the chunks;
# - pre-training data without masks packs too (positions reset after each document's end-of-document token);
# - refused: pack with synthetic data, naming the keys.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/sft.bash"
write_chatml_tokenizer
# 48 conversations of one shape: a user turn of 4 one-letter words and an answer of 2, so every one has the same
# number of tokens (checked below).
python3 - <<'PY'
import json, random
rng = random.Random(5)
words = "a b c d e f g h".split()
w = lambda n: " ".join(rng.choice(words) for _ in range(n))
with open("chat.jsonl", "w") as f:
    for i in range(48):
        f.write(json.dumps({"prompt": w(4), "response": w(2)}) + "\n")
PY
head -46 chat.jsonl >chat46.jsonl
for name in chat chat46; do
  "$MT" data prepare --input $name.jsonl --tokenizer hf --tokenizer-file tok/tokenizer.json --format chat \
    --output $name >/dev/null
done
L=$(python3 - "$SRC/tests/interop" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from indexed_file import read_indexed
lengths = {len(d) for d in read_indexed("chat")}
assert len(lengths) == 1, f"conversations of different lengths {sorted(lengths)}: the test needs one"
print(lengths.pop())
PY
) || fail "conversations differ in length"
S=$((2 * L))
echo "every conversation $L tokens; seq_length $S"
write_sft_config
common=(--config sft.yaml --set model.seq_length=$S --set model.max_position_embeddings=$S --set training.train_iters=3
        --set optimizer.warmup_iters=1 --set logging.eval_interval=0 --set 'data.split=[100,0,0]')
nodrop=(--set model.dropout=0 --set model.attention_dropout=0)

# 48 conversations pack into (48 L - 1) / 2L = 23 samples holding conversations 0..45 (the last sample's final
# target is conversation 46's first token, whose mask is 0); the pad run reads those 46 conversations.
for arch in gpt llama; do
  extra=()
  [ $arch = llama ] && extra=(--set model.arch=llama --set model.rotary_base=10000)
  "$MT" "${common[@]}" "${nodrop[@]}" "${extra[@]}" --set data.sft_packing=pack --set 'data.train=[chat]' \
    --set training.global_batch_size=23 --set logging.dir=pack_$arch >pack_$arch.log 2>&1 \
    || { tail -5 pack_$arch.log; fail "pack run failed"; }
  grep -q "train: 23 samples per epoch" pack_$arch.log || { grep "data:" pack_$arch.log; fail "not 23 packed samples"; }
  grep -q "positions and attention reset at document boundaries" pack_$arch.log || fail "no reset in the data: line"
  "$MT" "${common[@]}" "${nodrop[@]}" "${extra[@]}" --set data.sft_packing=pad --set 'data.train=[chat46]' \
    --set training.global_batch_size=46 --set training.micro_batch_size=2 --set logging.dir=pad_$arch \
    >pad_$arch.log 2>&1 || { tail -5 pad_$arch.log; fail "pad run failed"; }
  echo "$arch pack: $(losses pack_$arch/metrics.jsonl 1 3 | tr '\n' ' ') pad: $(losses pad_$arch/metrics.jsonl 1 3 | tr '\n' ' ')"
  same_losses pad_$arch/metrics.jsonl pack_$arch/metrics.jsonl 1 1 1e-6
  same_losses pad_$arch/metrics.jsonl pack_$arch/metrics.jsonl 1 3 1e-5
  "$MT" "${common[@]}" "${nodrop[@]}" "${extra[@]}" --set data.sft_packing=concat --set 'data.train=[chat]' \
    --set training.global_batch_size=23 --set logging.dir=concat_$arch >/dev/null 2>&1 || fail "concat run failed"
  python3 - pack_$arch/metrics.jsonl concat_$arch/metrics.jsonl <<'PY'
import json, sys
first = lambda p: next(r["loss"] for r in map(json.loads, open(p)) if "loss" in r)
a, b = first(sys.argv[1]), first(sys.argv[2])
assert abs(a - b) > 1e-4 * abs(a), f"pack's first loss {a} equals concat's {b}: nothing was reset"
print(f"ok: pack {a:.6f} vs concat {b:.6f} (the reset changes the loss)")
PY
done

# Layout invariance, dropout on, with validation.
lay=(--config sft.yaml --set data.sft_packing=pack --set 'data.train=[chat]' --set model.seq_length=$S
     --set model.max_position_embeddings=$S --set training.train_iters=4 --set optimizer.warmup_iters=1
     --set 'data.split=[80,20,0]' --set logging.eval_interval=2)
for arch in gpt llama; do
  extra=()
  [ $arch = llama ] && extra=(--set model.arch=llama --set model.rotary_base=10000 --set model.num_query_groups=2)
  "$MT" "${lay[@]}" "${extra[@]}" --set logging.dir=one_$arch >one_$arch.log 2>&1 \
    || { tail -5 one_$arch.log; fail "one-rank pack run failed"; }
  "$MT" "${lay[@]}" "${extra[@]}" --nproc 8 --set parallel.tensor=2 --set parallel.pipeline=2 \
    --set parallel.virtual_pipeline=2 --set parallel.sequence_parallel=true --set parallel.distributed_optimizer=true \
    --set logging.dir=tp2pp2dp2_$arch >/dev/null 2>lay.err || { tail -5 lay.err; fail "pack tp2pp2dp2 failed"; }
  same_losses one_$arch/metrics.jsonl tp2pp2dp2_$arch/metrics.jsonl 1 4 1e-6
  same_valid one_$arch/metrics.jsonl tp2pp2dp2_$arch/metrics.jsonl
done
"$MT" "${lay[@]}" --nproc 4 --set parallel.tensor=2 --set training.micro_batch_size=2 --set training.recompute=full \
  --set logging.dir=dp2tp2_mb2 >/dev/null 2>lay.err || { tail -5 lay.err; fail "pack dp2 tp2 mb2 failed"; }
same_losses one_gpt/metrics.jsonl dp2tp2_mb2/metrics.jsonl 1 4 1e-6
same_valid one_gpt/metrics.jsonl dp2tp2_mb2/metrics.jsonl

# Pre-training data (no loss mask): documents with their end-of-document token, packed with resets.
prepare_data
write_config
"$MT" --config tiny.yaml --set data.sft_packing=pack --set training.train_iters=2 --set optimizer.warmup_iters=1 --set logging.dir=pre_one \
  >pre.log 2>&1 || { tail -5 pre.log; fail "pack on pre-training data failed"; }
"$MT" --config tiny.yaml --set data.sft_packing=pack --set training.train_iters=2 --set optimizer.warmup_iters=1 --nproc 2 --set parallel.tensor=2 \
  --set parallel.sequence_parallel=true --set logging.dir=pre_tp2 >/dev/null 2>pre.err \
  || { tail -5 pre.err; fail "pack on pre-training data tp2 failed"; }
same_losses pre_one/metrics.jsonl pre_tp2/metrics.jsonl 1 2 1e-6

# Context parallelism, dropout on, with validation: each rank holds chunks r and 3 - r of every packed sample, their
# position ids and each query's document start. A seq_length of about 1.5 L (a multiple of 8, so CP2's chunks split
# again over TP2 with SP) puts document boundaries inside chunks and starts samples inside a document.
Scp=$(((3 * L / 2 + 7) / 8 * 8))
cp=("${lay[@]}" --set model.seq_length=$Scp --set model.max_position_embeddings=$Scp)
for arch in gpt llama; do
  extra=()
  [ $arch = llama ] && extra=(--set model.arch=llama --set model.rotary_base=10000 --set model.num_query_groups=2)
  "$MT" "${cp[@]}" "${extra[@]}" --set logging.dir=cp_one_$arch >cp_one_$arch.log 2>&1 \
    || { tail -5 cp_one_$arch.log; fail "one-rank pack run (seq_length $Scp) failed"; }
  for layout in cp2 cp2tp2 cp2dp2; do
    case $layout in
      cp2) set_=(--nproc 2 --set parallel.context=2) ;;
      cp2tp2) set_=(--nproc 4 --set parallel.context=2 --set parallel.tensor=2 --set parallel.sequence_parallel=true) ;;
      cp2dp2) set_=(--nproc 4 --set parallel.context=2 --set parallel.data=2) ;;
    esac
    "$MT" "${cp[@]}" "${extra[@]}" "${set_[@]}" --set logging.dir=${layout}_$arch >/dev/null 2>lay.err \
      || { tail -5 lay.err; fail "pack $layout ($arch) failed"; }
    same_losses cp_one_$arch/metrics.jsonl ${layout}_$arch/metrics.jsonl 1 4 1e-6
    same_valid cp_one_$arch/metrics.jsonl ${layout}_$arch/metrics.jsonl
  done
done
expect_error "data.sft_packing: pack.*data.synthetic" "${lay[@]}" --set data.synthetic=true
echo "PASS"
