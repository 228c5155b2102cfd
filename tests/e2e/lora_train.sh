#!/usr/bin/env bash
# LoRA (finetune.lora, issue 28): adapters beside the layers' linears train, the base stays frozen. Shown by:
# - the start log counts the adapters' parameters (2 layers x 4 linears of the tiny models, counted here by hand);
# - the frozen base does not move: the adapters' checkpoint holds nothing else, and a LoRA run with lr ~0 keeps the
#   base model's loss on every iteration (B stays 0), while with a real lr the loss falls;
# - layout invariance, fp32 with dropout (model and adapter) on: TP2+SP, PP2, DP2, ZeRO-1 and TP2 x PP2 x DP2 + SP
#   with the distributed optimizer give one rank's losses within 1e-6, on GPT and on Llama; so does ZB-H1 (the
#   adapters' weight gradients deferred) with full recomputation;
# - resume is exact (the base rebuilt from training.init_from, the adapters and their state from the checkpoint);
# - exports: the merged model and a PEFT adapter (names and shapes; tests/e2e/lora_interop.sh loads them), refused
#   for a checkpoint without adapters or without a base to export against; resuming on a copy of the base is said;
# - bad input: rank <= 0 with the block given, an unknown target, a negative alpha, dropout out of [0, 1), dropout on the experts' adapters;
# - fp8: the frozen base in fp8, the adapters in bf16, at TP 2 + SP, ZeRO-3 and PP 2 (ZB-H1) within 1e-2 of one rank.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
write_llama_config
lora=(--set finetune.lora.rank=4 --set finetune.lora.alpha=8 --set finetune.lora.dropout=0.1
      --set training.train_iters=6 --set optimizer.warmup_iters=2)

# The trainable count: per layer qkv (r*C + 3C*r), proj (r*C + C*r), fc1 (r*C + F1*r), fc2 (r*F + C*r).
"$MT" --config tiny.yaml "${lora[@]}" --set finetune.lora.random_base=true --set logging.dir=gpt1 >gpt1.log 2>&1 || { tail gpt1.log; fail "GPT LoRA run failed"; }
want=$(( 2 * ((4*32 + 96*4) + (4*32 + 32*4) + (4*32 + 128*4) + (4*128 + 32*4)) ))
grep -q "LoRA: rank 4, alpha 8, dropout 0.1 on qkv, proj, fc1, fc2: $want trainable parameters" gpt1.log ||
  { grep LoRA gpt1.log; fail "the start log does not count $want trainable parameters"; }
grep -q "MiB of optimizer state" gpt1.log || fail "the start log lacks the optimizer memory"
echo "ok: $want trainable parameters logged"

# A base checkpoint to fine-tune from (a few steps of full training), for the rest of the test.
"$MT" --config tiny.yaml --set training.train_iters=6 --set optimizer.warmup_iters=2 --set logging.dir=base \
      --set checkpoint.save_dir=base/ckpt >/dev/null 2>&1 || fail "the base run failed"
"$MT" --config llama.yaml --set training.train_iters=6 --set optimizer.warmup_iters=2 --set logging.dir=lbase \
      --set checkpoint.save_dir=lbase/ckpt >/dev/null 2>&1 || fail "the Llama base run failed"

# With lr 1e-30 nothing moves (Adam's steps are about lr): the adapters stay at B = 0 and every iteration's loss is
# the frozen base's, as full training with that lr gives; the adapters do train with a real lr (checked below).
still=(--set optimizer.lr=1e-30 --set optimizer.min_lr=1e-30)
"$MT" --config tiny.yaml "${lora[@]}" "${still[@]}" --set training.init_from=base/ckpt --set logging.dir=frozen_lora \
      >/dev/null 2>&1 || fail "lr-0 LoRA run failed"
"$MT" --config tiny.yaml --set training.train_iters=6 --set optimizer.warmup_iters=2 --set training.init_from=base/ckpt \
      "${still[@]}" --set logging.dir=frozen_full >/dev/null 2>&1 || fail "lr-0 run failed"
same_losses frozen_full/metrics.jsonl frozen_lora/metrics.jsonl 1 6 1e-6

# Layouts: "tp pp dp sp zero".
for model in tiny llama; do
  base=base; [ $model = llama ] && base=lbase
  one=${model}_one
  "$MT" --config $model.yaml "${lora[@]}" --set training.init_from=$base/ckpt --set logging.dir=$one \
        >/dev/null 2>$one.err || { tail -5 $one.err; fail "$one failed"; }
  for layout in "2 1 1 true false" "1 2 1 false false" "1 1 2 false false" "1 1 2 false true" "2 2 2 true true"; do
    read -r tp pp dp sp zero <<<"$layout"
    dir=${model}_tp${tp}pp${pp}dp${dp}sp${sp}zero${zero}
    "$MT" --config $model.yaml --nproc $((tp * pp * dp)) "${lora[@]}" --set training.init_from=$base/ckpt \
          --set parallel.tensor=$tp --set parallel.pipeline=$pp --set parallel.sequence_parallel=$sp \
          --set parallel.distributed_optimizer=$zero --set logging.dir=$dir >/dev/null 2>$dir.err ||
      { tail -5 $dir.err; fail "$dir failed"; }
    same_losses $one/metrics.jsonl $dir/metrics.jsonl 1 6 1e-6
  done
  # The adapters train: later losses fall below those of the same run with lr ~0 (the same batches).
  "$MT" --config $model.yaml "${lora[@]}" "${still[@]}" --set training.init_from=$base/ckpt \
        --set logging.dir=${model}_still >/dev/null 2>${model}_still.err || { tail -3 ${model}_still.err; fail "${model}_still failed"; }
  python3 - $one/metrics.jsonl ${model}_still/metrics.jsonl <<'PY'
import json, sys
a, b = ([r["loss"] for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3])
assert sum(a[3:]) < sum(b[3:]) - 1e-3, f"LoRA does not lower the loss: {a} vs {b} with lr ~0"
print(f"ok: iterations 4-6 lose {sum(b[3:]) - sum(a[3:]):.4f} in all against lr ~0")
PY
done
echo "ok: GPT and Llama LoRA losses equal one rank's in 5 layouts"
# The adapters' weight gradients deferred to a zero-bubble schedule's W (PP2, ZB-H1), and full recomputation.
"$MT" --config llama.yaml "${lora[@]}" --set training.init_from=lbase/ckpt --set training.global_batch_size=16 \
      --set logging.dir=zb_one >/dev/null 2>&1 || fail "zb_one failed"
"$MT" --config llama.yaml --nproc 2 "${lora[@]}" --set training.init_from=lbase/ckpt --set training.global_batch_size=16 \
      --set parallel.pipeline=2 --set parallel.pipeline_schedule=zb-h1 --set training.recompute=full \
      --set logging.dir=zb >/dev/null 2>zb.err || { tail -5 zb.err; fail "zb failed"; }
same_losses zb_one/metrics.jsonl zb/metrics.jsonl 1 6 1e-6

# Resume: 6 straight against 3 + resume + 3 (with TP2 + DP2 and the distributed optimizer on the second half).
"$MT" --config llama.yaml "${lora[@]}" --set training.init_from=lbase/ckpt --set logging.dir=res \
      --set checkpoint.save_dir=res/ckpt --exit-after 3 >/dev/null 2>&1 || fail "the first half failed"
"$MT" ckpt inspect res/ckpt >inspect.txt 2>&1 || fail "ckpt inspect failed"
grep -q "model.layers.0.attn.qkv.lora_a " inspect.txt || fail "the LoRA checkpoint lacks the adapters"
! grep -E "^ +(model|optimizer)\.[^ ]*" inspect.txt | grep -v "lora_[ab] " || fail "the LoRA checkpoint holds base tensors"
echo "ok: the checkpoint holds only the adapters and their optimizer state"
"$MT" --config llama.yaml --nproc 4 "${lora[@]}" --set training.init_from=lbase/ckpt --set logging.dir=res \
      --set parallel.tensor=2 --set parallel.distributed_optimizer=true \
      --set checkpoint.save_dir=res/ckpt >/dev/null 2>res.err || { tail -5 res.err; fail "the resumed half failed"; }
same_losses llama_one/metrics.jsonl res/metrics.jsonl 1 6 1e-6
echo "ok: resumed LoRA run equals the straight one"

# Resuming the adapters on a copy of their base at another path is said (a base with other weights is refused:
# tests/e2e/lora_guards.sh).
cp -r lbase lbase2
"$MT" --config llama.yaml "${lora[@]}" --set training.init_from=lbase2/ckpt --set training.train_iters=7 \
      --set logging.dir=res --set checkpoint.save_dir=res/ckpt >other.log 2>&1 || { tail -5 other.log; fail "resume on another base failed"; }
grep -q "its LoRA adapters were trained on the base lbase/ckpt/iter_0000006 (weights crc32 [0-9a-f]*); training.init_from: 'lbase2/ckpt' gives the base lbase2/ckpt/iter_0000006 (weights crc32 [0-9a-f]*): the same weights" other.log ||
  fail "resuming on a copy of the base is not said"

# Exports (the peft / transformers side is tests/e2e/lora_interop.sh): the merged model and a PEFT adapter of the
# resumed run, and the refusals.
"$MT" ckpt export res/ckpt --format hf --output merged >/dev/null 2>&1 || fail "the merged export failed"
"$MT" ckpt export res/ckpt --format hf --lora peft --output adapter >/dev/null 2>&1 || fail "the PEFT export failed"
python3 - <<'PY'
import json, struct
cfg = json.load(open("adapter/adapter_config.json"))
assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8, cfg
assert sorted(cfg["target_modules"]) == ["mlp.down_proj", "mlp.gate_proj", "mlp.up_proj", "self_attn.k_proj",
                                         "self_attn.o_proj", "self_attn.q_proj", "self_attn.v_proj"], cfg
raw = open("adapter/adapter_model.safetensors", "rb").read()
header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
q = header["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"]["shape"]
k = header["base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"]["shape"]
# llama.yaml: 8 heads of 4 (query rows 32), 4 key/value heads (16 rows), hidden 32, rank 4.
assert q == [32, 4] and k == [4, 32], (q, k)
assert len([n for n in header if n != "__metadata__"]) == 2 * 2 * 7, sorted(header)
print("ok: the PEFT adapter holds q/k/v and gate/up adapters split from the fused ones, 14 modules")
PY
expect_error "is not a LoRA checkpoint" ckpt export lbase/ckpt --format hf --lora peft --output x
"$MT" --config llama.yaml "${lora[@]}" --set finetune.lora.random_base=true --set training.train_iters=2 \
      --set optimizer.warmup_iters=1 --set logging.dir=seeded --set checkpoint.save_dir=seeded/ckpt >/dev/null 2>&1 || fail "seeded LoRA run failed"
expect_error "whose frozen base was the seeded initialization (no training.init_from)" ckpt export seeded/ckpt \
  --format hf --output x

# Bad input, each naming its key.
expect_error "finetune.lora.rank: must be >= 1 when finetune.lora is given" --config tiny.yaml \
  --set finetune.lora.rank=0 --set finetune.lora.alpha=8
expect_error "finetune.lora.rank: must be >= 1" --config tiny.yaml --set finetune.lora.rank=-2
expect_error "finetune.lora.targets: expected one of qkv, proj, fc1, fc2, got 'attn'" --config tiny.yaml \
  --set finetune.lora.rank=4 --set 'finetune.lora.targets=[qkv, attn]'
expect_error "finetune.lora.alpha: must be >= 0" --config tiny.yaml --set finetune.lora.rank=4 \
  --set finetune.lora.alpha=-1
expect_error "finetune.lora.dropout: must be in \[0, 1)" --config tiny.yaml --set finetune.lora.rank=4 \
  --set finetune.lora.dropout=1
expect_error "finetune.lora.dropout: must be 0 with adapters on a mixture of experts' linears" --config llama.yaml \
  --set finetune.lora.rank=4 --set finetune.lora.dropout=0.1 --set model.moe.num_experts=4

# With ZeRO-3 (the adapters sharded and gathered by unit; the frozen base, outside the gradient buffer, stays whole,
# dropout off) and with context parallelism (dropout on: the adapters', hidden and attention masks are keyed by the
# chunks' global positions, so they are one rank's): one rank's losses.
nod=(--config llama.yaml "${lora[@]}" --set finetune.lora.random_base=true --set finetune.lora.dropout=0 --set model.dropout=0 --set model.attention_dropout=0)
drop=(--config llama.yaml "${lora[@]}" --set finetune.lora.random_base=true)
"$MT" "${nod[@]}" --set logging.dir=nod_one >/dev/null 2>&1 || fail "the no-dropout LoRA run failed"
"$MT" "${drop[@]}" --set logging.dir=drop_one >/dev/null 2>&1 || fail "the dropout LoRA run failed"
for extra in "nod 2 --set parallel.shard=parameters" "drop 2 --set parallel.context=2" \
             "drop 4 --set parallel.context=2 --set parallel.tensor=2 --set parallel.sequence_parallel=true"; do
  read -r ref n args <<<"$extra"
  read -r -a a <<<"$args"
  dir=${ref}_$(echo "$args" | tr -dc 'a-z0-9')
  [ "$ref" = nod ] && set=("${nod[@]}") || set=("${drop[@]}")
  "$MT" "${set[@]}" --nproc "$n" "${a[@]}" --set logging.dir=$dir >/dev/null 2>$dir.err || { tail -5 $dir.err; fail "$dir"; }
  same_losses ${ref}_one/metrics.jsonl $dir/metrics.jsonl 1 6 1e-6
done
# fp8 (the frozen base's GEMMs in fp8, hybrid, current scaling; the adapters in bf16): the base takes no weight
# gradient (no dW GEMM, no transposed cast of its input), and TP 2 + SP, DP 2 with ZeRO-3 and PP 2 (ZB-H1) give one
# rank's losses within 1e-2; the fp8 run is not the bf16 one (its GEMMs quantise).
fp8=(--config llama.yaml "${lora[@]}" --set finetune.lora.random_base=true --set training.precision=bf16)
"$MT" "${fp8[@]}" --set logging.dir=bf16_one >/dev/null 2>&1 || fail "the bf16 LoRA run failed"
fp8+=(--set training.fp8.format=hybrid)
"$MT" "${fp8[@]}" --set logging.dir=fp8_one >/dev/null 2>fp8_one.err || { tail -5 fp8_one.err; fail "the fp8 LoRA run failed"; }
python3 - bf16_one/metrics.jsonl fp8_one/metrics.jsonl <<'PY'
import json, sys
a, b = ([r["loss"] for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3])
assert len(a) == len(b) == 6 and a != b, "the fp8 LoRA run gives the bf16 run's losses: fp8 is not in use"
print(f"fp8 LoRA: losses within {max(abs(x - y) / x for x, y in zip(a, b)):.1e} of bf16's (not equal)")
PY
for args in "2 --set parallel.tensor=2 --set parallel.sequence_parallel=true" \
            "2 --set parallel.shard=parameters" \
            "2 --set parallel.pipeline=2 --set parallel.pipeline_schedule=zb-h1 --set training.micro_batch_size=2"; do
  read -r n rest <<<"$args"
  read -r -a a <<<"$rest"
  dir=fp8_$(echo "$rest" | tr -dc 'a-z0-9')
  "$MT" "${fp8[@]}" --nproc "$n" "${a[@]}" --set logging.dir=$dir >/dev/null 2>$dir.err || { tail -5 $dir.err; fail "$dir"; }
  same_losses fp8_one/metrics.jsonl $dir/metrics.jsonl 1 6 1e-2
done
echo "PASS"
