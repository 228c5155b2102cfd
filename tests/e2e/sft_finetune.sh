#!/usr/bin/env bash
# Fine-tuning runs (issue 28): data.sft_packing: pad (one conversation per sample, the padding's loss mask 0) and
# training.init_from (a checkpoint's weights with a fresh optimizer, iteration 0 and the data from its start).
# - pad: with every conversation shorter than both, seq_length 32 and 64 train identically (within 1e-6: the
#   padding after a conversation neither counts nor is seen, causal attention), for learned and rotary positions
#   (dropout off: attention dropout is keyed by the place in the T x T matrix, which T changes);
#   a sample per conversation; TP x PP x DP with the distributed optimizer gives one rank's losses within 1e-6.
# - init_from: a 3-iteration run's checkpoint as the start of another run, in two layouts (the same losses within
#   1e-6), starting at iteration 1 and below a fresh model's loss; with lr 1e-30 its validation loss equals the checkpoint's own
#   validation loss on the same samples. Refused: with an explicit checkpoint.load, from a directory without a
#   checkpoint, from another model shape. A run with checkpoints in its save_dir resumes them instead.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/sft.bash"
write_chatml_tokenizer
python3 - <<'PY'
import json, random
rng = random.Random(3)
words = "a b c d e f g h".split()
with open("chat.jsonl", "w") as f:  # short conversations: every one under 32 tokens
    for i in range(48):
        f.write(json.dumps({"prompt": " ".join(rng.choice(words) for _ in range(rng.randint(1, 4))),
                            "response": " ".join(rng.choice(words) for _ in range(rng.randint(1, 3)))}) + "\n")
PY
"$MT" data prepare --input chat.jsonl --tokenizer hf --tokenizer-file tok/tokenizer.json --format chat \
  --output sft >/dev/null
python3 - "$SRC/tests/interop" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from indexed_file import read_indexed
longest = max(len(d) for d in read_indexed("sft"))
assert longest <= 32, f"a conversation of {longest} tokens: the test needs them shorter than seq_length"
print("longest conversation:", longest, "tokens")
PY
write_sft_config
pad=(--config sft.yaml --set data.sft_packing=pad --set model.max_position_embeddings=64 --set model.dropout=0
     --set model.attention_dropout=0)

for arch in gpt llama; do
  extra=()
  [ $arch = llama ] && extra=(--set model.arch=llama --set model.rotary_base=10000)
  "$MT" "${pad[@]}" "${extra[@]}" --set logging.dir=pad32_$arch >pad32_$arch.log 2>&1 \
    || { tail -5 pad32_$arch.log; fail "pad run failed"; }
  "$MT" "${pad[@]}" "${extra[@]}" --set model.seq_length=64 --set logging.dir=pad64_$arch >/dev/null 2>&1
  same_losses pad32_$arch/metrics.jsonl pad64_$arch/metrics.jsonl 1 6 1e-6
done
grep -q "train: 43 samples per epoch" pad32_gpt.log || { grep "data:" pad32_gpt.log; fail "not a sample per conversation"; }
"$MT" "${pad[@]}" --nproc 8 --set parallel.tensor=2 --set parallel.pipeline=2 --set parallel.virtual_pipeline=2 \
  --set parallel.sequence_parallel=true --set parallel.distributed_optimizer=true \
  --set logging.dir=pad_tp2pp2dp2 >/dev/null 2>pad.err || { tail -5 pad.err; fail "pad tp2pp2dp2 failed"; }
same_losses pad32_gpt/metrics.jsonl pad_tp2pp2dp2/metrics.jsonl 1 6 1e-6
expect_error "data.sft_packing: pad needs loss masks" "${pad[@]}" --set data.loss_mask=false


# init_from: a trained checkpoint, then fine-tuning runs starting from it.
"$MT" --config sft.yaml --set training.train_iters=3 --set checkpoint.save_dir=base --set logging.dir=base_run \
  >/dev/null 2>&1
ft=(--config sft.yaml --set training.init_from=base)
"$MT" "${ft[@]}" --set logging.dir=ft_one >ft_one.log 2>&1 || { tail -5 ft_one.log; fail "init_from failed"; }
grep -q "initialized the model from base/iter_0000003" ft_one.log || fail "no init_from line"
"$MT" "${ft[@]}" --nproc 8 --set parallel.tensor=2 --set parallel.pipeline=2 --set parallel.sequence_parallel=true \
  --set parallel.distributed_optimizer=true --set logging.dir=ft_tp2pp2dp2 >/dev/null 2>ft.err \
  || { tail -5 ft.err; fail "init_from tp2pp2dp2 failed"; }
same_losses ft_one/metrics.jsonl ft_tp2pp2dp2/metrics.jsonl 1 6 1e-6
"$MT" "${ft[@]}" --set optimizer.lr=1e-30 --set optimizer.min_lr=0 --set training.train_iters=3 \
  --set logging.eval_interval=1 --set logging.dir=ft_lr0 >/dev/null 2>&1
python3 - <<'PY'
import json
rows = lambda p: [json.loads(l) for l in open(p)]
fresh = [r["loss"] for r in rows("base_run/metrics.jsonl") if "loss" in r]
ft = [r for r in rows("ft_one/metrics.jsonl") if "loss" in r]
assert ft[0]["iteration"] == 1, "init_from did not start at iteration 1"
assert ft[0]["loss"] < fresh[0] - 0.05, f"init_from's first loss {ft[0]['loss']} is not below a fresh model's {fresh[0]}"
assert any(r.get("event") == "init_from" for r in rows("ft_one/metrics.jsonl")), "no init_from event"
# lr 1e-30: the weights stay the checkpoint's, so every validation loss is the checkpoint's on the same samples.
v = [r["valid_loss"] for r in rows("ft_lr0/metrics.jsonl") if "valid_loss" in r]
assert len(v) == 3 and max(v) - min(v) <= 1e-6 * abs(v[0]), v
base_v = [r["valid_loss"] for r in rows("base_run/metrics.jsonl") if "valid_loss" in r and r["iteration"] == 3]
assert base_v and abs(base_v[0] - v[0]) <= 1e-6 * abs(v[0]), (base_v, v)
print(f"ok: init_from first loss {ft[0]['loss']:.4f} (fresh {fresh[0]:.4f}); lr 1e-30 validation {v[0]:.6f} == "
      f"the checkpoint's {base_v[0]:.6f}")
PY

# A run whose save_dir holds its own checkpoints resumes them (a restarted fine-tuning run), not init_from.
"$MT" "${ft[@]}" --set training.train_iters=2 --set checkpoint.save_dir=ft_ck --set logging.dir=ft_a >/dev/null 2>&1
"$MT" "${ft[@]}" --set training.train_iters=4 --set checkpoint.save_dir=ft_ck --set logging.dir=ft_b >ft_b.log 2>&1
grep -q "resumed from ft_ck/iter_0000002" ft_b.log || { tail -3 ft_b.log; fail "did not resume its own checkpoint"; }
grep -q "initialized the model from" ft_b.log && fail "init_from ran over a resumed run"

expect_error "training.init_from.*checkpoint.load: base" "${ft[@]}" --set checkpoint.load=base
mkdir empty
expect_error "training.init_from: empty holds no checkpoint" --config sft.yaml --set training.init_from=empty
expect_error "training.init_from: base/iter_0000003 holds another model (model.num_layers: 4 -> 2)" \
  "${ft[@]}" --set model.num_layers=2
echo "PASS"
