#!/usr/bin/env bash
# On a GPU, this session's features that change what runs when (issues 25, 27, 31): ZB-H1 and ZB-V pipelines (two
# processes sharing the GPU over host-staged Gloo) train bit for bit as 1F1B does, with the weight gradients deferred on
# the compute stream; ZB-H1's timeline (logging.trace: each span ends with a device synchronization) holds every F, B
# and W; selective recomputation of every module follows the run without it (Llama: the same kernels again, bit for bit;
# GPT's GELU recomputed by the GELU kernel where the forward used cuBLASLt's epilogue: within 1e-6); MoE parallel
# folding (TP 2 with whole experts over EP 2) follows one GPU rank. Skips without a usable GPU.
source "$(dirname "$0")/lib/common.bash"
require_gpu
prepare_data
write_config
write_llama_config
write_moe_config
gpu=(--set training.device=cuda --set parallel.backend=gloo --set training.micro_batch_size=1
     --set training.global_batch_size=8 --set training.train_iters=8 --set model.num_layers=4)
for schedule in 1f1b zb-h1; do
  "$MT" --config llama.yaml "${gpu[@]}" --nproc 2 --set parallel.pipeline=2 --set parallel.pipeline_schedule=$schedule \
        --set logging.trace=true --set logging.dir=pp_$schedule >/dev/null 2>pp_$schedule.err \
    || { tail -5 pp_$schedule.err; fail "PP 2 $schedule on the GPU"; }
done
same_losses pp_1f1b/metrics.jsonl pp_zb-h1/metrics.jsonl 1 8 0
python3 - pp_zb-h1/trace.json <<'PY'
import json, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X" and e["cat"] == "compute"]
for rank in range(2):
    names = {e["name"] for e in events if e["pid"] == rank}
    for op in "FB":
        assert {f"{op} {m}.0" for m in range(8)} <= names, (rank, op, sorted(names))
    # With p = 2 the first stage runs each backward whole (its W right after its B, or 2 microbatches held: the
    # memory bound, parallel/pipeline/schedule.h); the second splits every one.
    ws = {n for n in names if n.startswith("W ")}
    assert ws == (set() if rank == 0 else {f"W {m}.0" for m in range(8)}), (rank, sorted(names))
print("zb-h1 on the GPU: bit for bit as 1F1B; the timeline holds F and B of every microbatch, W on the second stage")
PY
python3 "$SRC/scripts/trace_summary.py" pp_zb-h1/trace.json
# ZB-V: two chunks per GPU process in a V (the turn handed over on the device), bit for bit as 1F1B with 4 layers.
"$MT" --config llama.yaml "${gpu[@]}" --nproc 2 --set parallel.pipeline=2 --set parallel.virtual_pipeline=2 \
      --set parallel.pipeline_schedule=zb-v --set logging.dir=pp_zb-v >/dev/null 2>pp_zb-v.err \
  || { tail -5 pp_zb-v.err; fail "PP 2 zb-v on the GPU"; }
same_losses pp_1f1b/metrics.jsonl pp_zb-v/metrics.jsonl 1 8 0

one=(--set training.device=cuda --set training.train_iters=8)
for cfg in llama:0 tiny:1e-6; do
  name=${cfg%%:*} tol=${cfg#*:}
  "$MT" --config $name.yaml "${one[@]}" --set logging.dir=${name}_none >/dev/null
  "$MT" --config $name.yaml "${one[@]}" --set training.recompute=selective \
        --set "training.recompute_modules=[core_attn, layernorm, mlp_act]" --set logging.dir=${name}_sel >/dev/null \
        2>${name}_sel.err || { tail -5 ${name}_sel.err; fail "$name selective recomputation on the GPU"; }
  same_losses ${name}_none/metrics.jsonl ${name}_sel/metrics.jsonl 1 8 "$tol"
done
echo "selective recomputation on the GPU follows the run without it"

moe=(--set training.micro_batch_size=1 --set training.device=cuda --set parallel.backend=gloo)
"$MT" --config moe.yaml "${moe[@]}" --set logging.dir=moe_one >/dev/null
"$MT" --config moe.yaml "${moe[@]}" --nproc 2 --set parallel.tensor=2 --set parallel.sequence_parallel=true \
      --set parallel.expert=2 --set parallel.expert_tensor=1 --set logging.dir=moe_fold >/dev/null 2>fold.err \
  || { tail -5 fold.err; fail "MoE parallel folding on the GPU"; }
same_losses moe_one/metrics.jsonl moe_fold/metrics.jsonl 1 20 1e-5
echo "MoE parallel folding on the GPU follows one rank"
