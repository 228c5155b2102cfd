#!/usr/bin/env bash
# Layout invariance with LoRA (finetune.lora, rank 4 on every linear, adapter dropout on), GPT and Llama in fp32:
# every TP x PP x DP layout with degrees up to 2, with sequence parallelism (TP > 1), the distributed optimizer
# (DP > 1) and interleaving (PP = 2), gives one rank's losses within 1e-6 (model dropout on); the frozen base is each
# model's seeded initialization. tests/e2e/lora_train.sh covers TP x PP x DP = 8 from an init_from base.
# Then LoRA on mixture-of-experts layers (moe.yaml: 4 SwiGLU experts, top 2, a shared expert; adapters on every
# expert's fc1 and fc2, the shared expert's and attention's, adapter dropout off as the experts' adapters need):
# expert parallelism 2 and 4, TP 2 with the experts split (expert_tensor 2, with EP 2: their adapters' partial
# gradients summed over the experts' tensor-parallel group) and with parallel folding (expert_tensor 1), PP 2 with
# EP 2, and sharded gradients (ZeRO-2) with EP 2 give one rank's losses over 6 iterations within 1e-6; so does the
# shipped mixtral-tiny at EP 2, alone and with ZeRO-3.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/layout_matrix.bash"
prepare_data
write_config
write_llama_config
write_moe_config
MATRIX_MAX_DEGREE=2
MATRIX_ARGS=(--set finetune.lora.rank=4 --set finetune.lora.alpha=8 --set finetune.lora.dropout=0.1
             --set finetune.lora.random_base=true)
run_layout_matrix fp32 1e-6 full
mkdir llama && cd llama && ln -s ../data data && cp ../llama.yaml .  # its own run directories
MATRIX_CONFIG=llama.yaml run_layout_matrix fp32 1e-6 full
cd ..
# tp pp dp ep etp shard
moe_common=(--config moe.yaml --set training.micro_batch_size=1 --set training.global_batch_size=8
            --set training.train_iters=6 --set parallel.timeout_s=60 --set parallel.grad_bucket_size=5000
            --set finetune.lora.rank=4 --set finetune.lora.alpha=8 --set finetune.lora.random_base=true)
"$MT" "${moe_common[@]}" --set logging.dir=moe_one >/dev/null
moe_layouts=("1 1 2 2 1 none" "1 1 4 4 1 optimizer" "2 1 1 1 2 none" "2 1 2 2 2 optimizer" "2 1 2 2 1 none"
             "2 1 2 1 1 optimizer" "1 2 2 2 1 none" "1 1 4 2 1 gradients")
for layout in "${moe_layouts[@]}"; do
  read -r tp pp dp ep etp shard <<<"$layout"
  sp=false; [ $tp -gt 1 ] && sp=true
  dir=moe_tp${tp}pp${pp}dp${dp}ep${ep}etp${etp}_$shard
  "$MT" "${moe_common[@]}" --nproc $((tp * pp * dp)) --set parallel.tensor=$tp --set parallel.pipeline=$pp \
        --set parallel.sequence_parallel=$sp --set parallel.expert=$ep --set parallel.expert_tensor=$etp \
        --set parallel.shard=$shard --set logging.dir=$dir >/dev/null 2>$dir.err || { tail -5 $dir.err; fail "$dir failed"; }
  same_losses moe_one/metrics.jsonl $dir/metrics.jsonl 1 6 1e-6
done
echo "all ${#moe_layouts[@]} LoRA MoE layouts match one rank"
# The shipped mixtral-tiny (8 experts, top 2, no shared expert) with LoRA on every linear at EP 2 (x DP 2), alone and
# with ZeRO-3 (the experts' adapters gathered over their expert-data-parallel pair; the frozen base stays whole).
mixtral=(--config "$SRC/configs/mixtral-tiny.yaml" --set data.train=[data/text_document] --set checkpoint.save_dir=
         --set logging.eval_interval=0 --set logging.interval=1 --set training.train_iters=6
         --set optimizer.warmup_iters=2 --set training.micro_batch_size=2 --set training.global_batch_size=8
         --set model.seq_length=32 --set parallel.timeout_s=60 --set parallel.grad_bucket_size=5000
         --set finetune.lora.rank=4 --set finetune.lora.alpha=8 --set finetune.lora.random_base=true)
"$MT" "${mixtral[@]}" --set logging.dir=mixtral_one >/dev/null
for shard in none parameters; do
  dir=mixtral_ep2dp2_$shard
  "$MT" "${mixtral[@]}" --nproc 2 --set parallel.expert=2 --set parallel.shard=$shard --set logging.dir=$dir \
        >/dev/null 2>$dir.err || { tail -5 $dir.err; fail "$dir failed"; }
  same_losses mixtral_one/metrics.jsonl $dir/metrics.jsonl 1 6 1e-6
done
echo "LoRA on mixtral-tiny at EP 2 (alone and with ZeRO-3) matches one rank"
