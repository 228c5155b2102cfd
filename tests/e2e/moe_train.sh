#!/usr/bin/env bash
# Mixture of experts on the CPU (issue 25): configs/mixtral-tiny.yaml's shape trains and its loss falls; the start
# log names total and active parameters; metrics.jsonl and the log carry the auxiliary and z losses and each layer's
# load; DeepSeek-V3's aux-loss-free expert bias evens the load and resumes exactly from a checkpoint (the biases
# travel in it); a checkpoint saved with expert parallelism resumes at other EP degrees; what MoE cannot do yet is
# refused naming the key, before any work.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_moe_config

# The shipped tiny config trains (a short run of it) and its loss falls.
"$MT" --config "$SRC/configs/mixtral-tiny.yaml" --set data.train=[data/text_document] --set training.train_iters=30 \
      --set optimizer.warmup_iters=5 --set checkpoint.save_dir= --set logging.dir=mixtral --set logging.interval=5 \
      --set logging.eval_interval=0 >/dev/null 2>mixtral.err || { tail -5 mixtral.err; fail "mixtral-tiny failed"; }
python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("mixtral/metrics.jsonl") if '"loss"' in l]
first, last = rows[0], rows[-1]
assert last["loss"] < first["loss"] - 0.3, (first["loss"], last["loss"])
assert "moe_aux_loss" in last and "moe_z_loss" not in last, last.keys()
assert 0.9 < last["moe_aux_loss"] < 2.0, last["moe_aux_loss"]
assert [l["layer"] for l in last["moe_load"]] == [0, 1], last["moe_load"]
for l in last["moe_load"]:
    assert l["mean"] == 5 * 16 * 64 * 2 / 8, l   # 5 iterations x 16 samples x 64 tokens x top-2 over 8 experts
print(f"mixtral-tiny: loss {first['loss']:.3f} -> {last['loss']:.3f}, aux {last['moe_aux_loss']:.3f}, "
      f"load {last['moe_load']}")
PY
grep -q "mixture of experts: 2 of 2 layers, 8 experts (top 2, softmax router), " mixtral/megatrain.log \
  || fail "the start log lacks the MoE line"
grep -o "mixture of experts: .*" mixtral/megatrain.log
grep -q "| moe aux [0-9.]* load max/mean [0-9.]* cv [0-9.]*" mixtral/megatrain.log || fail "the interval line lacks moe"

# The aux-loss-free bias (no auxiliary loss): the load gets even; a run interrupted and resumed equals one that
# was not, biases included.
bias=(--config moe.yaml --set model.moe.aux_loss_coeff=0 --set model.moe.z_loss_coeff=0
      --set model.moe.bias_update_rate=0.01 --set model.moe.score_function=sigmoid)
"$MT" "${bias[@]}" --set training.train_iters=100 --set logging.interval=20 --set logging.dir=even >/dev/null \
      2>even.err || { tail -5 even.err; fail "bias run"; }
"$MT" "${bias[@]}" --set logging.dir=straight >/dev/null 2>straight.err || { tail -5 straight.err; fail "bias run"; }
"$MT" "${bias[@]}" --set logging.dir=resumed --set checkpoint.save_dir=ckpt --set checkpoint.save_interval=10 \
      --exit-after 10 >/dev/null 2>r1.err || { tail -5 r1.err; fail "bias run, first half"; }
"$MT" "${bias[@]}" --set logging.dir=resumed --set checkpoint.save_dir=ckpt >/dev/null 2>r2.err \
  || { tail -5 r2.err; fail "bias run, resumed"; }
same_losses straight/metrics.jsonl resumed/metrics.jsonl 11 20 0
"$MT" ckpt inspect ckpt >inspect.txt
grep -q "state.expert_bias.layers.1.mlp" inspect.txt || fail "the checkpoint lacks the expert biases"
python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("even/metrics.jsonl") if '"loss"' in l]
for r in rows:
    print("iteration", r["iteration"], "load max/mean", [round(l["max"] / l["mean"], 3) for l in r["moe_load"]],
          "cv", [round(l["cv"], 3) for l in r["moe_load"]])
last = rows[-1]
assert "moe_aux_loss" not in last
worst = max(l["max"] / l["mean"] for l in last["moe_load"])
assert worst <= 1.10, f"the expert bias left the load {worst:.3f} x even"
PY

# A capacity factor drops the lightest choices of overloaded experts: metrics.jsonl counts them, and the run trains.
"$MT" --config moe.yaml --set model.moe.capacity_factor=1.0 --set logging.interval=10 --set logging.dir=capacity \
      >/dev/null 2>capacity.err || { tail -5 capacity.err; fail "capacity run"; }
python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("capacity/metrics.jsonl") if '"loss"' in l]
dropped = [r["moe_dropped_tokens"] for r in rows]
assert all(d > 0 for d in dropped), dropped
print(f"capacity factor 1.0: dropped {dropped} choices per 10 iterations, loss {rows[-1]['loss']:.3f}")
PY
grep -q "dropped [0-9]" capacity/megatrain.log || fail "the interval line does not say what was dropped"
# Each microbatch drops by its own tokens: TP 2 + SP with EP 2 drops the same choices as one rank.
cap=(--config moe.yaml --set model.moe.capacity_factor=1.0 --set training.micro_batch_size=1 --set training.train_iters=6)
"$MT" "${cap[@]}" --set logging.dir=cap_one >/dev/null 2>&1 || fail "capacity, one rank"
"$MT" "${cap[@]}" --nproc 4 --set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.expert=2 \
      --set logging.dir=cap_tp2ep2 >/dev/null 2>cap4.err || { tail -5 cap4.err; fail "capacity, TP 2 EP 2"; }
same_losses cap_one/metrics.jsonl cap_tp2ep2/metrics.jsonl 1 6 1e-6
# and so does parallel folding (TP 2, whole experts over EP 4 drawn from the tensor and data ranks).
"$MT" "${cap[@]}" --nproc 4 --set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.expert=4 \
      --set parallel.expert_tensor=1 --set logging.dir=cap_fold >/dev/null 2>capf.err \
  || { tail -5 capf.err; fail "capacity, TP 2 ETP 1 EP 4"; }
same_losses cap_one/metrics.jsonl cap_fold/metrics.jsonl 1 6 1e-6

# Checkpoints store experts by their global index: a run saved at EP 2 (ZeRO over the expert-data-parallel group)
# resumes at EP 4 and at EP 1 with the losses of a run never interrupted.
ep=(--config moe.yaml --set training.micro_batch_size=1 --set training.train_iters=10 --set parallel.timeout_s=60)
"$MT" "${ep[@]}" --set logging.dir=ep_straight >/dev/null 2>eps.err || { tail -5 eps.err; fail "EP reference run"; }
"$MT" "${ep[@]}" --nproc 2 --set parallel.expert=2 --set parallel.distributed_optimizer=true \
      --set checkpoint.save_dir=ep_ckpt --set checkpoint.save_interval=5 --exit-after 5 --set logging.dir=ep2 \
      >/dev/null 2>ep2.err || { tail -5 ep2.err; fail "EP 2 run"; }
cp -r ep_ckpt ep_ckpt_copy
cp -r ep_ckpt ep_ckpt_fold
"$MT" "${ep[@]}" --nproc 4 --set parallel.expert=4 --set checkpoint.save_dir=ep_ckpt --set logging.dir=ep4 \
      >/dev/null 2>ep4.err || { tail -5 ep4.err; fail "EP 4 resume"; }
same_losses ep_straight/metrics.jsonl ep4/metrics.jsonl 6 10 1e-6
"$MT" "${ep[@]}" --set checkpoint.save_dir=ep_ckpt_copy --set logging.dir=ep1 >/dev/null 2>ep1.err \
  || { tail -5 ep1.err; fail "EP 1 resume"; }
same_losses ep_straight/metrics.jsonl ep1/metrics.jsonl 6 10 1e-6
# Parallel folding: the EP 2 checkpoint resumes with whole experts drawn from the tensor ranks (TP 2, ETP 1, EP 4),
# and a folded run's own checkpoint (TP 2, ETP 1, EP 2, ZeRO) resumes on one rank. Both count the parameters
# of TP 2 without folding (TP pads the vocabulary further than one rank does).
"$MT" "${ep[@]}" --nproc 4 --set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.expert=4 \
      --set parallel.expert_tensor=1 --set checkpoint.save_dir=ep_ckpt_fold --set logging.dir=fold4 \
      >/dev/null 2>fold4.err || { tail -5 fold4.err; fail "TP 2 ETP 1 EP 4 resume"; }
same_losses ep_straight/metrics.jsonl fold4/metrics.jsonl 6 10 1e-6
"$MT" "${ep[@]}" --nproc 4 --set parallel.tensor=2 --set parallel.expert=2 --set parallel.expert_tensor=1 \
      --set parallel.distributed_optimizer=true --set checkpoint.save_dir=fold_ckpt --set checkpoint.save_interval=5 \
      --exit-after 5 --set logging.dir=fold2 >/dev/null 2>fold2.err || { tail -5 fold2.err; fail "folded run"; }
"$MT" "${ep[@]}" --set checkpoint.save_dir=fold_ckpt --set logging.dir=fold1 >/dev/null 2>fold1.err \
  || { tail -5 fold1.err; fail "resume of a folded checkpoint on one rank"; }
same_losses ep_straight/metrics.jsonl fold1/metrics.jsonl 6 10 1e-6
params() { grep -o "model: [a-z0-9]* [0-9]* parameters" "$1" | head -1; }
[ -n "$(params cap_tp2ep2/megatrain.log)" ] || fail "the start log names no parameter count"
for run in fold4 fold2 cap_fold; do
  [ "$(params $run/megatrain.log)" = "$(params cap_tp2ep2/megatrain.log)" ] \
    || fail "$run counts '$(params $run/megatrain.log)', TP 2 EP 2 '$(params cap_tp2ep2/megatrain.log)'"
done

# A MoE checkpoint generates (the KV-cache decoder runs the MoE layers' own forward).
"$MT" generate --load ckpt --prompt "Hello" --max-new-tokens 4 --greedy >gen.txt 2>gen.err \
  || { cat gen.err; fail "generate on a MoE checkpoint"; }
echo "generated: $(head -c 200 gen.txt)"

# Refused before any work, naming the key.
expect_error "parallel.expert: 3 does not divide model.moe.num_experts=4" --config moe.yaml --nproc 3 \
  --set parallel.expert=3 --set training.micro_batch_size=1 --set training.global_batch_size=6
expect_error "parallel.expert: 4 does not divide parallel.data=2" --config moe.yaml --nproc 2 --set parallel.expert=4 \
  --set training.micro_batch_size=1
expect_error "parallel.expert_tensor: 2 does not divide parallel.tensor=1" --config moe.yaml --nproc 2 \
  --set parallel.expert_tensor=2 --set parallel.expert=1 --set training.micro_batch_size=1
expect_error "model.moe.capacity_factor: must be positive, got -1" --config moe.yaml --set model.moe.capacity_factor=-1
expect_error "parallel.expert: 4 does not divide parallel.data x parallel.context = 1 x 2 = 2" --config moe.yaml \
  --nproc 2 --set parallel.context=2 --set parallel.expert=4 --set model.dropout=0 --set model.attention_dropout=0
expect_error "model.moe.top_k: 5 is more than model.moe.num_experts=4" --config moe.yaml --set model.moe.top_k=5
expect_error "score_function sigmoid (Mixtral and Qwen2-MoE route with a softmax)" ckpt export ckpt --format hf --output hf
# Context parallelism (experts on every context rank, parallel.expert 1): the aux and z losses are the microbatch's,
# their counts, score sums and log-sum-exps summed over the context ranks and their gradients the microbatch's
# whole, so every layout gives one rank's losses (and aux, z) within 1e-6 (with the gradients' CP factor left out
# the losses differ by 3e-5). The aux-loss-free bias counts every context rank's tokens too.
m=(--config moe.yaml --set model.dropout=0 --set model.attention_dropout=0 --set training.train_iters=8)
for variant in aux bias; do
  v=(); [ $variant = bias ] && v=("${bias[@]:2}")
  "$MT" "${m[@]}" "${v[@]}" --set logging.dir=cp_one_$variant >/dev/null 2>cp_one.err || { tail -5 cp_one.err; fail "one rank"; }
  for layout in "2 p2p 1 1 1" "2 allgather 2 1 1" "2 p2p 1 2 1" "2 p2p 1 1 2" "4 p2p 1 1 1"; do
    read -r cp comm tp dp pp <<<"$layout"
    [ $variant = bias ] && [ "$cp$tp$dp$pp" != 2111 ] && continue
    dir=cp${cp}${comm}tp${tp}dp${dp}pp${pp}_$variant
    "$MT" "${m[@]}" "${v[@]}" --nproc $((cp * tp * dp * pp)) --set parallel.context=$cp --set parallel.context_comm=$comm \
          --set parallel.tensor=$tp --set parallel.sequence_parallel=$([ "$tp" -gt 1 ] && echo true || echo false) \
          --set parallel.data=$dp --set parallel.pipeline=$pp \
          --set parallel.distributed_optimizer=$([ "$dp" -gt 1 ] && echo true || echo false) \
          --set logging.dir=$dir >/dev/null 2>$dir.err || { tail -5 $dir.err; fail "$dir failed"; }
    same_losses cp_one_$variant/metrics.jsonl $dir/metrics.jsonl 1 8 1e-6
    [ $variant = bias ] && continue
    python3 - cp_one_$variant/metrics.jsonl $dir/metrics.jsonl <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
for k in ("moe_aux_loss", "moe_z_loss"):
    worst = max(abs(x[k] - y[k]) / abs(x[k]) for x, y in zip(a, b))
    assert worst <= 1e-6, f"{k}: {[x[k] for x in a]} vs {[y[k] for y in b]}"
assert [l["mean"] for l in a[-1]["moe_load"]] == [l["mean"] for l in b[-1]["moe_load"]]
PY
  done
done
# Expert parallelism folds the context ranks in (parallel/comm/topology.h): EP over context ranks, over context x data
# ranks, and with parallel folding over tensor x context ranks; one rank's losses, and a checkpoint of the folded
# layout resumes on one rank with one rank's losses.
for layout in "2 1 1 2 auto" "2 1 2 4 auto" "2 2 1 4 1"; do
  read -r cp tp dp ep etp <<<"$layout"
  dir=cp${cp}tp${tp}dp${dp}ep${ep}etp${etp}
  "$MT" "${m[@]}" --nproc $((cp * tp * dp)) --set parallel.context=$cp --set parallel.tensor=$tp \
        --set parallel.sequence_parallel=$([ "$tp" -gt 1 ] && echo true || echo false) --set parallel.data=$dp \
        --set parallel.expert=$ep --set parallel.expert_tensor=$etp --set parallel.distributed_optimizer=true \
        --set logging.dir=$dir --set checkpoint.save_dir=$dir/ckpt --set checkpoint.save_interval=4 \
        >/dev/null 2>$dir.err || { tail -5 $dir.err; fail "$dir failed"; }
  same_losses cp_one_aux/metrics.jsonl $dir/metrics.jsonl 1 8 1e-6
done
mkdir folded && cp -r cp2tp2dp1ep4etp1/ckpt folded/ckpt && rm -rf folded/ckpt/iter_0000008
echo iter_0000004 > folded/ckpt/latest
"$MT" "${m[@]}" --set logging.dir=folded --set checkpoint.save_dir=folded/ckpt >/dev/null 2>folded.err \
  || { tail -5 folded.err; fail "resuming the CP x EP checkpoint on one rank"; }
[ "$(grep -c '"loss"' folded/metrics.jsonl)" -eq 4 ] || fail "the one-rank run did not resume at iteration 4"
same_losses cp_one_aux/metrics.jsonl folded/metrics.jsonl 5 8 1e-6
echo "ok: MoE with context parallelism gives one rank's losses, aux and z losses (EP and folding over CP too)"
# A capacity factor with context parallelism: the drops are the whole microbatch's (each expert keeps its heaviest
# choices of every context rank's chunks, ties to the lower token in one rank's order), so CP 2 (ring and
# all-gather), CP 4, CP 2 with TP 2 + SP, with EP 2 and with PP 2 drop one rank's choices (as many, metrics.jsonl's
# moe_dropped_tokens counting each once) and give one rank's losses.
capcp=(--config moe.yaml --set model.dropout=0 --set model.attention_dropout=0 --set model.moe.capacity_factor=1.0
       --set training.train_iters=8)
"$MT" "${capcp[@]}" --set logging.dir=capcp_one >/dev/null 2>capcp_one.err \
  || { tail -5 capcp_one.err; fail "capacity, one rank"; }
for layout in "2 p2p 1 1 1" "2 allgather 1 1 1" "4 p2p 1 1 1" "2 p2p 2 1 1" "2 p2p 1 2 1" "2 p2p 1 1 2"; do
  read -r cp comm tp ep pp <<<"$layout"
  dir=capcp${cp}${comm}tp${tp}ep${ep}pp${pp}
  "$MT" "${capcp[@]}" --nproc $((cp * tp * pp)) --set parallel.context=$cp --set parallel.context_comm=$comm \
        --set parallel.tensor=$tp --set parallel.sequence_parallel=$([ "$tp" -gt 1 ] && echo true || echo false) \
        --set parallel.expert=$ep --set parallel.pipeline=$pp --set logging.dir=$dir >/dev/null 2>$dir.err \
    || { tail -5 $dir.err; fail "$dir failed"; }
  same_losses capcp_one/metrics.jsonl $dir/metrics.jsonl 1 8 1e-6
  python3 - capcp_one/metrics.jsonl $dir/metrics.jsonl <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
one, other = [r["moe_dropped_tokens"] for r in a], [r["moe_dropped_tokens"] for r in b]
assert all(d > 0 for d in one), f"capacity factor 1.0 dropped nothing: {one}"
assert one == other, f"dropped choices per iteration: one rank {one}, {sys.argv[2]} {other}"
print(f"{sys.argv[2]}: dropped {other} choices, as one rank")
PY
done
echo "ok: a capacity factor with context parallelism drops one rank's choices and gives one rank's losses"
echo "moe_train: ok"
