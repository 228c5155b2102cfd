#!/usr/bin/env bash
# Zero-bubble pipelines (parallel.pipeline_schedule: zb-h1, issue 27): every layer's backward split into B (input
# gradient) and W (weight gradients, run later by the schedule) trains bit-identically (fp32, tolerance 0) to 1F1B
# in the same layout, for PP 2 and 4 with TP, SP, DP and the distributed optimizer, on GPT, Llama and a MoE Llama
# with expert parallelism; and within the layout matrix's tolerance of one rank. The timeline shows each
# microbatch's W on every stage. Bad schedule choices are refused naming the key.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
write_llama_config
write_moe_config
common=(--set model.num_layers=4 --set training.micro_batch_size=1 --set training.global_batch_size=8
        --set training.train_iters=6 --set parallel.timeout_s=60 --set parallel.grad_bucket_size=5000)
count=0
# config tp pp dp sp zero ep
for row in "tiny 1 2 1 false false 1" "tiny 1 4 1 false false 1" "tiny 2 2 2 true true 1" "tiny 1 2 4 false true 1" \
           "llama 1 4 2 false false 1" "llama 2 2 2 true true 1" "moe 1 2 2 false true 2" "moe 2 2 2 true false 2"; do
  read -r cfg tp pp dp sp zero ep <<<"$row"
  "$MT" --config $cfg.yaml "${common[@]}" --set logging.dir=one_$cfg >/dev/null 2>one_$cfg.err \
    || { tail -5 one_$cfg.err; fail "$cfg on one rank"; }
  for schedule in 1f1b zb-h1; do
    dir=${cfg}_tp${tp}pp${pp}dp${dp}_$schedule
    "$MT" --config $cfg.yaml "${common[@]}" --nproc $((tp * pp * dp)) --set parallel.tensor=$tp \
          --set parallel.pipeline=$pp --set parallel.data=$dp --set parallel.sequence_parallel=$sp \
          --set parallel.distributed_optimizer=$zero --set parallel.expert=$ep \
          --set parallel.pipeline_schedule=$schedule --set logging.dir=$dir >/dev/null 2>$dir.err \
      || { tail -5 $dir.err; fail "$dir failed"; }
  done
  same_losses ${cfg}_tp${tp}pp${pp}dp${dp}_1f1b/metrics.jsonl ${cfg}_tp${tp}pp${pp}dp${dp}_zb-h1/metrics.jsonl 1 6 0
  same_losses one_$cfg/metrics.jsonl ${cfg}_tp${tp}pp${pp}dp${dp}_zb-h1/metrics.jsonl 1 6 1e-4
  count=$((count + 1))
done
[ $count -eq 8 ] || fail "expected 8 layouts, ran $count"
echo "all $count zb-h1 layouts equal 1F1B bit for bit"

# ZB-V: two chunks per stage in a V (parallel.virtual_pipeline=2; stage 0 holds the embedding and the head, tied
# copies summed there). Each gradient sums its microbatches in 1F1B's order; the layers sit in other buckets and
# other ranks than 1F1B's, so the data-parallel sums and the grad norm may round differently: one rank's losses
# within 1e-6 (fp32), and bit for bit as 1F1B where nothing else differs (one replica, one tensor rank).
vcommon=("${common[@]}" --set model.num_layers=8)
count=0
for row in "tiny 1 2 1 false false 1" "tiny 1 4 1 false false 1" "tiny 2 2 2 true true 1" "llama 1 4 2 false false 1" \
           "llama 2 2 2 true true 1" "moe 1 2 2 false true 2"; do
  read -r cfg tp pp dp sp zero ep <<<"$row"
  [ -d one8_$cfg ] || "$MT" --config $cfg.yaml "${vcommon[@]}" --set logging.dir=one8_$cfg >/dev/null 2>one8_$cfg.err \
    || { tail -5 one8_$cfg.err; fail "$cfg on one rank"; }
  # 1F1B in the same layout only where it is compared: bit for bit (one replica, one tensor rank) or by peak memory.
  schedules="zb-v"
  [ $tp -eq 1 ] && { [ $dp -eq 1 ] || [ $cfg = llama ]; } && schedules="1f1b zb-v"
  for schedule in $schedules; do
    vp=1
    [ $schedule = zb-v ] && vp=2
    dir=v_${cfg}_tp${tp}pp${pp}dp${dp}_$schedule
    "$MT" --config $cfg.yaml "${vcommon[@]}" --nproc $((tp * pp * dp)) --set parallel.tensor=$tp \
          --set parallel.pipeline=$pp --set parallel.data=$dp --set parallel.sequence_parallel=$sp \
          --set parallel.distributed_optimizer=$zero --set parallel.expert=$ep --set parallel.virtual_pipeline=$vp \
          --set parallel.pipeline_schedule=$schedule --set logging.dir=$dir >/dev/null 2>$dir.err \
      || { tail -5 $dir.err; fail "$dir failed"; }
  done
  same_losses one8_$cfg/metrics.jsonl v_${cfg}_tp${tp}pp${pp}dp${dp}_zb-v/metrics.jsonl 1 6 1e-6
  if [ $tp -eq 1 ] && [ $dp -eq 1 ]; then
    same_losses v_${cfg}_tp${tp}pp${pp}dp${dp}_1f1b/metrics.jsonl v_${cfg}_tp${tp}pp${pp}dp${dp}_zb-v/metrics.jsonl 1 6 0
  fi
  count=$((count + 1))
done
[ $count -eq 6 ] || fail "expected 6 zb-v layouts, ran $count"
echo "all $count zb-v layouts equal one rank"

# Peak activation memory, measured (metrics.jsonl's peak_activation_bytes_per_rank, gathered at the first report):
# no stage of a ZB-H1 or ZB-V run holds more than 1F1B's highest stage of the same layout (their memory bounds,
# parallel/pipeline/schedule.h: a split B starts with at most p - 1 microbatches held (ZB-H1) or 2p - 1 pairs (ZB-V); a ZB-V
# stage holds at most 2p pairs, and a whole backward with 2p has no other tensor of the pipeline beside it).
# PP 2 and 4, TP 1.
python3 - tiny_tp1pp2dp1 tiny_tp1pp4dp1 llama_tp1pp4dp2 v_tiny_tp1pp2dp1 v_tiny_tp1pp4dp1 v_llama_tp1pp4dp2 <<'PY'
import json, sys
def peaks(run):
    for line in open(f"{run}/metrics.jsonl"):
        r = json.loads(line)
        if "peak_activation_bytes_per_rank" in r:
            return r["peak_activation_bytes_per_rank"]
    sys.exit(f"{run}: no peak_activation_bytes_per_rank in metrics.jsonl")
for layout in sys.argv[1:]:
    zb = "zb-v" if layout.startswith("v_") else "zb-h1"
    base, ours = peaks(f"{layout}_1f1b"), peaks(f"{layout}_{zb}")
    mib = lambda xs: " ".join(f"{x / 2**20:.3f}" for x in xs)
    print(f"{layout}: peak activations per rank (MiB) 1f1b {mib(base)}; {zb} {mib(ours)}")
    worst = max(range(len(ours)), key=lambda r: ours[r])
    if ours[worst] > max(base):
        sys.exit(f"FAIL {layout}: {zb} rank {worst} peaks at {ours[worst]} activation bytes, above 1F1B's highest "
                 f"stage ({max(base)})")
print("ZB-H1's and ZB-V's peak activations within 1F1B's highest stage's")
PY

# The timeline of a traced ZB-H1 run: each stage runs F, B and W of every microbatch; the first stage's W right
# after its B, as one whole backward ("B" alone) but in its cooldown after its first B there (W 5 and 6 while the
# next gradient is received), the last stage's held back by p - 2.
"$MT" --config tiny.yaml "${common[@]}" --nproc 4 --set parallel.pipeline=4 --set parallel.pipeline_schedule=zb-h1 \
      --set logging.trace=true --set "logging.trace_iterations=[3]" --set logging.dir=traced >/dev/null 2>traced.err \
  || { tail -5 traced.err; fail "traced zb-h1 run"; }
python3 - traced/trace.json <<'PY'
import json, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X" and e["cat"] == "compute"]
for rank in range(4):
    names = [e["name"] for e in sorted((e for e in events if e["pid"] == rank), key=lambda e: e["ts"])]
    for op in "FB":
        assert sorted(n for n in names if n.startswith(op + " ")) == sorted(f"{op} {m}.0" for m in range(8)), (rank, names)
    ws = sorted(n for n in names if n.startswith("W "))
    assert ws == sorted(f"W {m}.0" for m in (range(5, 7) if rank == 0 else range(8))), (rank, names)
    if rank == 0:
        i = names.index("B 5.0")
        assert names[i + 1] == "W 5.0", names
    if rank == 3:
        assert names.index("B 2.0") < names.index("W 0.0") < names.index("B 3.0"), names
print("traced zb-h1: F, B and W of every microbatch on every stage")
PY
python3 "$SRC/scripts/trace_summary.py" traced/trace.json

expect_error "parallel.pipeline_schedule: zb-h1 needs parallel.pipeline > 1" --config tiny.yaml "${common[@]}" \
  --set parallel.pipeline_schedule=zb-h1
expect_error "parallel.pipeline_schedule: zb-h1 runs one model chunk per stage, but parallel.virtual_pipeline=2" \
  --config tiny.yaml "${common[@]}" --nproc 2 --set parallel.pipeline=2 --set parallel.virtual_pipeline=2 \
  --set parallel.pipeline_schedule=zb-h1
expect_error "parallel.pipeline_schedule: dualpipe-v is not implemented yet" --config tiny.yaml "${common[@]}" \
  --set parallel.pipeline_schedule=dualpipe-v
expect_error "parallel.pipeline_schedule: zb-v places two model chunks per stage in a V: set parallel.virtual_pipeline=2" \
  --config tiny.yaml "${common[@]}" --nproc 2 --set parallel.pipeline=2 --set parallel.pipeline_schedule=zb-v
expect_error "parallel.pipeline_schedule: zb-v needs parallel.pipeline > 1" --config tiny.yaml "${common[@]}" \
  --set parallel.pipeline_schedule=zb-v
expect_error "parallel.pipeline_schedule: interleaved needs parallel.virtual_pipeline > 1" --config tiny.yaml \
  "${common[@]}" --nproc 2 --set parallel.pipeline=2 --set parallel.pipeline_schedule=interleaved
echo "zero_bubble: ok"
