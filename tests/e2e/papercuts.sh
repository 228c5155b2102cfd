#!/usr/bin/env bash
# What a new user meets first (issue 15, item 8): each mistake gets one message that names the key and says
# what to do, before the run starts; `megatrain help` prints the help.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config

# `megatrain help` and `megatrain help train`: the usage, exit 0 (CLI11 answered 109 before).
"$MT" help > help.txt || fail "megatrain help exits $?"
grep -qi "usage" help.txt && grep -q "train" help.txt || fail "megatrain help prints no usage"
"$MT" help train > help_train.txt || fail "megatrain help train exits non-zero"
grep -q -- "--config" help_train.txt || fail "megatrain help train lacks --config"
expect_error "'nosuch' is not a command" help nosuch

# A layout for more ranks than this one process: the error says how to start them.
expect_error "add --nproc 2 to start 2 local ranks (or launch under torchrun / srun)" \
  --config tiny.yaml --set parallel.tensor=2
expect_error "add --nproc 4" --config tiny.yaml --set parallel.tensor=2 --set parallel.data=2

# A warmup longer than the run: decay_iters, never set, is said to come from training.train_iters.
expect_error "optimizer.decay_iters=4 (unset, so it defaulted to training.train_iters=4)" \
  --config tiny.yaml --set training.train_iters=4

# The interleaved schedule's microbatch rule: one error naming the keys, before any rank starts.
expect_error "training.global_batch_size: 12 gives 3 microbatches" --config tiny.yaml --nproc 2 \
  --set model.num_layers=4 --set parallel.pipeline=2 --set parallel.virtual_pipeline=2 \
  --set training.global_batch_size=12
[ "$(grep -c "gives 3 microbatches" err.txt)" -eq 1 ] || fail "the microbatch error is repeated: $(cat err.txt)"

# A missing data file: named with its key, before the resolved config is printed.
expect_error "data.train\[0\]: no file data/missing.bin" --config tiny.yaml --set 'data.train=[data/missing]'
! grep -q "resolved config" out.txt err.txt || fail "the config dump came before the missing-file error"
expect_error "data.valid\[1\]: no file nowhere.bin" --config tiny.yaml \
  --set 'data.valid=[data/text_document, nowhere]' --set logging.eval_interval=2
cp data/text_document.bin nowhere.bin  # the .bin alone is not enough
expect_error "data.valid\[1\]: no file nowhere.idx" --config tiny.yaml \
  --set 'data.valid=[data/text_document, nowhere]'
expect_error "data.train\[3\]: no file gone.bin" --config tiny.yaml --nproc 2 \
  --set 'data.train=[0.5, data/text_document, 0.5, gone]'

# Keys that mean nothing or cannot hold (issue 49, items 5 and 7): refused naming the key, and what to write instead.
expect_error "model.moe.top_k: is set, but model.moe.num_experts is 0 (a dense model)" --config tiny.yaml \
  --set model.moe.top_k=2
for n in 3 9223372036854775807; do
  expect_error "training.recompute_num_layers: $n is more than model.num_layers=2" --config tiny.yaml \
    --set training.recompute=full --set training.recompute_num_layers=$n
done
expect_error "training.recompute_num_layers: expected an integer, got '1e12'" --config tiny.yaml \
  --set training.recompute=full --set training.recompute_num_layers=1e12
expect_error "parallel.expert: 3 does not divide model.moe.num_experts=8 (.*; valid: 1, 2, 4, 8)" --config tiny.yaml \
  --set model.moe.num_experts=8 --set parallel.expert=3
expect_error "finetune.lora.targets: 'q_proj' names a module of another framework.*target for it is qkv" \
  --config tiny.yaml --set finetune.lora.rank=4 --set 'finetune.lora.targets=[q_proj, v_proj]'
echo "papercuts ok"
