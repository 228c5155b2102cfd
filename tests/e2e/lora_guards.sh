#!/usr/bin/env bash
# What a refused run must leave alone, and the base LoRA adapters need (issue 49, items 2-4):
# - a refused run (data.loss_mask without mask files, also on two context ranks, data.sft_packing: pad without masks,
#   pack on synthetic data, a missing training.init_from, a too small optimizer.offload_host_memory_gib) names
#   the key and leaves no save_dir behind, and a save_dir holding a checkpoint byte-identical, without a .lock;
# - a LoRA resume with other adapters is refused naming the key and both values, the checkpoint left as it was:
#   fewer finetune.lora.targets (their adapters and Adam state would be dropped), another rank, another alpha;
# - a LoRA checkpoint records its base (a checksum of the base's stored weights, or the seed of a seeded one): a base
#   replaced at the same path is refused by resume, eval, generate and ckpt export, naming training.init_from, what
#   was recorded and what is found now; a seeded base with another training.seed too. (A copy of the base at another
#   path is accepted: tests/e2e/lora_train.sh.)
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
lora=(--set finetune.lora.rank=4 --set finetune.lora.alpha=8)
two=(--set training.train_iters=2 --set optimizer.warmup_iters=1)

# A base (2 iterations of full training) and LoRA adapters trained on it for 2 iterations.
"$MT" --config tiny.yaml "${two[@]}" --set logging.dir=base --set checkpoint.save_dir=base/ckpt >base.log 2>&1 ||
  { tail -5 base.log; fail "the base run failed"; }
"$MT" --config tiny.yaml "${two[@]}" "${lora[@]}" --set training.init_from=base/ckpt --set logging.dir=ad \
      --set checkpoint.save_dir=ck >ad.log 2>&1 || { tail -5 ad.log; fail "the LoRA run failed"; }
cp -a ck pristine
unchanged() { diff -r pristine ck >/dev/null || fail "$1 changed the checkpoint"; }

# 1. Refusals before anything is written: no save_dir made, a present one left byte-identical without a .lock.
cp -a ck keep && rm keep/.lock && cp -a keep keep.orig
refuse() {  # pattern, then the arguments beside the LoRA config
  local pattern=$1; shift
  for dir in fresh keep; do
    expect_error "$pattern" --config tiny.yaml "${two[@]}" "${lora[@]}" --set training.init_from=base/ckpt \
      --set logging.dir=refused "$@" --set checkpoint.save_dir=$dir
  done
  [ ! -e fresh ] || fail "a refused run ($*) made its save_dir"
  diff -r keep.orig keep >/dev/null && [ ! -e keep/.lock ] || { ls -la keep; fail "a refused run ($*) wrote into its save_dir"; }
}
refuse "data.train: data/text_document has no loss mask" --set data.loss_mask=true
refuse "data.sft_packing: pad needs loss masks" --set data.sft_packing=pad
refuse "data.sft_packing: pack resets positions and attention at document boundaries, and data.synthetic" \
  --set data.sft_packing=pack --set data.synthetic=true
refuse "data.train: data/text_document has no loss mask" --nproc 2 --set parallel.context=2 --set data.loss_mask=true
refuse "training.init_from: nowhere holds no checkpoint" --set training.init_from=nowhere
refuse "optimizer.offload_host_memory_gib: rank 0 needs" --set optimizer.offload=true \
  --set optimizer.offload_host_memory_gib=1e-6
echo "ok: refused runs leave their save_dir as it was"

# 2. A resume with other adapters: refused naming the key and both values, nothing written.
resume=(--config tiny.yaml --set training.train_iters=4 --set optimizer.warmup_iters=1 "${lora[@]}"
        --set training.init_from=base/ckpt --set logging.dir=ad --set checkpoint.save_dir=ck)
expect_error "finetune.lora.targets: \[qkv, proj, fc1, fc2\] -> \[qkv, proj\] (the checkpoint's adapters of fc1, fc2 and their optimizer state would be dropped)" \
  "${resume[@]}" --set 'finetune.lora.targets=[qkv, proj]'
unchanged "a resume with fewer targets"
expect_error "finetune.lora.rank: 4 -> 8" "${resume[@]}" --set finetune.lora.rank=8
expect_error "finetune.lora.alpha: 8 -> 16 (the adapters' update is scaled by alpha / rank)" "${resume[@]}" \
  --set finetune.lora.alpha=16
unchanged "a resume with another rank or alpha"

# 3. The base replaced at the same path: base/ckpt trained one iteration further (its latest is iter_0000003 now).
"$MT" --config tiny.yaml --set training.train_iters=3 --set optimizer.warmup_iters=1 --set logging.dir=base \
      --set checkpoint.save_dir=base/ckpt >base3.log 2>&1 || { tail -5 base3.log; fail "the base's third iteration"; }
other="ck/iter_0000002: its LoRA adapters were trained on the base base/ckpt/iter_0000002 (weights crc32 [0-9a-f]\{8\}), but training.init_from: 'base/ckpt' now gives the base base/ckpt/iter_0000003 (weights crc32 [0-9a-f]\{8\}): another base"
expect_error "$other" "${resume[@]}"
unchanged "a resume on another base"
expect_error "$other" eval --checkpoint ck --data data/text_document --samples 4
expect_error "$other" generate --load ck --prompt "Hello" --max-new-tokens 2
expect_error "$other" ckpt export ck --format hf --output hf

# Without training.init_from adapters would train on a random base: refused (naming the key and the opt-in), leaving
# no save_dir; finetune.lora.random_base: true asks for it (tests, experiments), and that base is its seed.
expect_error "training.init_from: empty, but finetune.lora trains adapters on a frozen base that init_from must give" \
  --config tiny.yaml "${two[@]}" "${lora[@]}" --set checkpoint.save_dir=noinit/ckpt
[ ! -e noinit ] || fail "the refused LoRA run without init_from made its save_dir"
expect_error "finetune.lora.random_base: .*training.init_from is set" --config tiny.yaml "${two[@]}" "${lora[@]}" \
  --set finetune.lora.random_base=true --set training.init_from=base/ckpt
lora+=(--set finetune.lora.random_base=true)
"$MT" --config tiny.yaml "${two[@]}" "${lora[@]}" --set logging.dir=seeded --set checkpoint.save_dir=seeded/ckpt \
      >seeded.log 2>&1 || { tail -5 seeded.log; fail "the seeded LoRA run failed"; }
grep -q "finetune.lora.random_base: the frozen base is this model's seeded (random) initialization" \
  seeded.log || fail "a LoRA run on the seeded initialization does not say so"
expect_error "trained on the seeded initialization (training.seed 42), but training.init_from: '' now gives the seeded initialization (training.seed 7)" \
  --config tiny.yaml --set training.train_iters=4 --set optimizer.warmup_iters=1 "${lora[@]}" --set training.seed=7 \
  --set logging.dir=seeded --set checkpoint.save_dir=seeded/ckpt
echo "PASS"
