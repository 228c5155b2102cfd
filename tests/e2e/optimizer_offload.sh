#!/usr/bin/env bash
# optimizer.offload: true (ZeRO-Offload, core/optim/host_offload.h) trains exactly as without it, over 10 iterations:
#  - losses and grad norms bit-identical to the same run without offload, fp32 at DP 1, and at DP 2 and 4 under
#    every parallel.shard (none, optimizer, gradients, parameters), with TP 2 (SP), PP 2 and CP 2, a Llama row, MoE
#    with expert parallelism, LoRA, bf16 and fp16 (the host step is the device's AdamW bit for bit, the values go
#    back rounded as the device rounds them); the state cut into many chunks (small parallel.grad_bucket_size) and,
#    at DP 1, into quarters (the default size);
#  - checkpoints are layout-free: saved with offload and resumed without it (and back) the losses are those of the
#    same save and resume without offload;
#  - device memory at DP 2 (ZeRO-1, bf16) falls by the fp32 masters and moments, which the host pool holds (the
#    log's "host" after the device total, and metrics.jsonl's host_peak_bytes);
#  - bad input: a host budget (optimizer.offload_host_memory_gib) that the state does not fit, and a negative one,
#    are refused naming the key; plan says whether the host state fits.
source "$(dirname "$0")/lib/common.bash"
source "$SRC/tests/e2e/lib/shard.bash"
prepare_data
write_config
write_llama_config
expect_error "optimizer.offload_host_memory_gib: must be" --config tiny.yaml --set optimizer.offload_host_memory_gib=-1
expect_error "optimizer.offload_host_memory_gib: rank 0 needs" --config tiny.yaml --set optimizer.offload=true \
             --set optimizer.offload_host_memory_gib=0.0001 --set training.train_iters=1 --set optimizer.warmup_iters=0
"$MT" plan --config tiny.yaml --set optimizer.offload=true --set optimizer.offload_host_memory_gib=0.0001 --gpu cpu \
      > plan_small.txt || fail "plan with a small host budget failed"
grep -q "does NOT fit" plan_small.txt || { cat plan_small.txt; fail "plan does not say the host state misses the budget"; }
base=(--set training.train_iters=10 --set optimizer.warmup_iters=2 --set parallel.timeout_s=60
      --set parallel.grad_bucket_size=3000 --set training.micro_batch_size=2)
exact() {  # dir-a dir-b what: losses and grad norms of the 10 iterations equal
  python3 - $1/metrics.jsonl $2/metrics.jsonl "$3" <<'PY'
import json, sys
a, b = ([(r["iteration"], r["loss"], r["grad_norm"]) for r in map(json.loads, open(p)) if "loss" in r]
        for p in sys.argv[1:3])
assert len(a) == 10, f"{sys.argv[3]}: expected 10 iterations, got {len(a)}"
assert a == b, f"{sys.argv[3]}: offload differs:\n" + "\n".join(f"{x} {y}" for x, y in zip(a, b) if x != y)
PY
  [ $? -eq 0 ] || fail "$3"
  echo "$3: offload bit-identical to no offload"
}
pair() {  # name, then the run's arguments: with and without offload
  local name=$1
  shift
  run ${name}_off "$@" --set optimizer.offload=false
  run ${name}_on "$@" --set optimizer.offload=true
  # The offloaded run did put its state in the host pool (no test passes by leaving offload off).
  grep -m1 'peak memory (MiB):' ${name}_on/megatrain.log | grep -q "| host " || fail "$name: no host pool with offload"
  exact ${name}_off ${name}_on "$name"
}
# DP 1: the default bucket size, so the state is cut into quarters (a chunk is a quarter of the state at most).
pair dp1_fp32 --config tiny.yaml --set training.train_iters=10 --set optimizer.warmup_iters=2 --set training.global_batch_size=4
for dp in 2 4; do
  for shard in none optimizer gradients parameters; do
    pair dp${dp}_${shard} --config tiny.yaml "${base[@]}" --nproc $dp --set parallel.shard=$shard \
         --set training.global_batch_size=$((4 * dp))
  done
done
pair tp2_sp_dp2_optimizer --config tiny.yaml "${base[@]}" --nproc 4 --set parallel.tensor=2 \
     --set parallel.sequence_parallel=true --set parallel.shard=optimizer --set training.global_batch_size=8
pair pp2_dp2_gradients --config tiny.yaml "${base[@]}" --nproc 4 --set parallel.pipeline=2 --set parallel.shard=gradients \
     --set training.global_batch_size=8
pair llama_dp2_parameters --config llama.yaml "${base[@]}" --nproc 2 --set parallel.shard=parameters \
     --set training.global_batch_size=4
# Mixture of experts under expert parallelism (the experts' optimizer, reduced over their own group, offloads as the
# dense one does) and LoRA (only the adapters have state).
pair moe_ep2_dp2_optimizer --config tiny.yaml "${base[@]}" --nproc 2 --set model.moe.num_experts=4 \
     --set model.moe.top_k=2 --set model.moe.ffn_hidden_size=64 --set parallel.expert=2 --set parallel.shard=optimizer \
     --set training.global_batch_size=4
# Context parallelism: the state is replicated over data x context ranks (shard over both under ZeRO).
pair cp2_dp2_optimizer --config tiny.yaml "${base[@]}" --nproc 4 --set parallel.context=2 --set model.dropout=0 \
     --set model.attention_dropout=0 --set parallel.shard=optimizer --set training.global_batch_size=8
pair lora_dp2 --config tiny.yaml "${base[@]}" --nproc 2 --set finetune.lora.rank=4 --set finetune.lora.random_base=true --set training.global_batch_size=4
pair bf16_dp2_none --config tiny.yaml "${base[@]}" --nproc 2 --set training.precision=bf16 --set training.global_batch_size=8
pair bf16_dp2_optimizer --config tiny.yaml "${base[@]}" --nproc 2 --set training.precision=bf16 \
     --set parallel.shard=optimizer --set training.global_batch_size=8
pair fp16_dp2_gradients --config tiny.yaml "${base[@]}" --nproc 2 --set training.precision=fp16 \
     --set parallel.shard=gradients --set training.global_batch_size=8

# Memory at DP 2, ZeRO-1, bf16, 4 layers of 128 (the log rounds to 0.01 MiB): rank 0's device optimizer pool keeps
# only the bf16 shard the all-gather moves, the fp32 masters and moments (12 of its 14 bytes per element) move to the
# host pool, and the device total falls by them.
mem=(--config tiny.yaml --set optimizer.warmup_iters=0 --set training.train_iters=2 --set model.num_layers=4
     --set model.hidden_size=128 --set model.ffn_hidden_size=512 --set training.precision=bf16 --nproc 2
     --set parallel.shard=optimizer --set training.micro_batch_size=2 --set training.global_batch_size=4
     --set parallel.grad_bucket_size=100000)
run mem_off "${mem[@]}"
run mem_on "${mem[@]}" --set optimizer.offload=true
peak() {  # kind dir: the training log's peak memory (MiB) of that kind on rank 0
  grep -m1 'peak memory (MiB):' "$2/megatrain.log" | sed -E "s/.*$1 ([0-9.]+).*/\1/"
}
grep -m1 'peak memory (MiB):' mem_on/megatrain.log | grep -q "| host " ||
  fail "the memory line of an offloaded run has no host pool"
grep -m1 'peak memory (MiB):' mem_off/megatrain.log | grep -q "| host " &&
  fail "the memory line of a run without offload shows a host pool"
python3 - "$(peak optimizer mem_off)" "$(peak optimizer mem_on)" "$(peak total mem_off)" "$(peak total mem_on)" \
          "$(peak host mem_on)" mem_on/metrics.jsonl <<'PY'
import json, sys
opt_off, opt_on, total_off, total_on, host = map(float, sys.argv[1:6])
moved = opt_off - opt_on
print(f"DP 2 ZeRO-1 bf16, rank 0: device optimizer {opt_off} -> {opt_on} MiB, device total {total_off} -> "
      f"{total_on} MiB, host pool {host} MiB")
assert abs(opt_on / opt_off - 2 / 14) < 0.01, f"the device optimizer pool keeps {opt_on / opt_off:.3f}, not 2/14"
# Within 10%: the device total's peak moves by a bucket's reduce-scatter workspace from run to run (whether it is alive
# at the peak depends on the reducer thread's timing).
assert abs((total_off - total_on) - moved) <= 0.1 * moved, "the device total does not fall by the moved state"
# The host pool: 12 bytes per shard element and two chunks (the bucket size, 100000, or a quarter of the shard) of
# f32 + bf16 staging.
shard = opt_off * 1048576 / 14
expected = (12 * shard + 2 * min(shard / 4, 100000) * 6) / 1048576
assert abs(host - expected) <= 0.02, f"the host pool is {host} MiB, expected {expected:.2f}"
rows = [json.loads(l) for l in open(sys.argv[6])]
assert all(abs(r["host_peak_bytes"] / 1048576 - host) < 0.01 for r in rows if "loss" in r), "metrics.jsonl host_peak_bytes"
PY
[ $? -eq 0 ] || fail "memory at DP 2"

# Layout-free checkpoints: saved with offload at DP 2 (ZeRO-1) and resumed without it at DP 2 (none), and saved
# without at DP 2 resumed with offload under ZeRO-3 at DP 2: the losses of the same save and resume without offload.
ck=(--config tiny.yaml --set training.train_iters=8 --set optimizer.warmup_iters=2 --set parallel.timeout_s=60
    --set parallel.grad_bucket_size=3000 --set training.micro_batch_size=2 --set training.global_batch_size=8 --nproc 2)
save_resume() {  # name: then "shard offload" before and after
  rm -rf $1 ck_$1
  "$MT" "${ck[@]}" --set parallel.shard=$2 --set optimizer.offload=$3 --set logging.dir=$1 \
        --set checkpoint.save_dir=ck_$1 --exit-after 4 >/dev/null 2>$1.err || { tail -5 $1.err; fail "$1: save"; }
  [ "$(cat ck_$1/latest)" = iter_0000004 ] || fail "$1: no checkpoint at iteration 4"
  "$MT" "${ck[@]}" --set parallel.shard=$4 --set optimizer.offload=$5 --set logging.dir=$1 \
        --set checkpoint.save_dir=ck_$1 >/dev/null 2>$1.err || { tail -5 $1.err; fail "$1: resume"; }
  losses $1/metrics.jsonl 1 8 > $1.txt
  [ "$(wc -l < $1.txt)" -eq 8 ] || fail "$1: expected 8 losses"
}
save_resume ref_down optimizer false none false
save_resume down optimizer true none false
diff ref_down.txt down.txt >/dev/null || { paste ref_down.txt down.txt; fail "offload -> no offload differs"; }
save_resume ref_up none false parameters false
save_resume up none false parameters true
diff ref_up.txt up.txt >/dev/null || { paste ref_up.txt up.txt; fail "no offload -> offload differs"; }
echo "checkpoints: offload -> no offload and no offload -> offload resume as without offload, exactly"
