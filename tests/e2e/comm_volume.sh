#!/usr/bin/env bash
# The bytes each rank moves per step over the data-parallel groups (parallel/comm/comm_counted.h: comm_bytes_by_group in
# metrics.jsonl), against the ZeRO paper's communication volumes (Rajbhandari et al. 2020, section 7), at DP=4 on the
# tiny fp32 GPT with untied embeddings (every unit gathered once forward and once backward), one microbatch per
# rank, derived from the model's parameter count Psi (the log's; its every parameter a multiple of the hidden size
# 32, so no bucket is padded) and the group size n = 4: a bandwidth-optimal collective sends (n - 1) / n of the
# buffer per rank, 4 bytes an element:
#  - none: an all-reduce, 2 (n - 1) / n * 4 Psi bytes;
#  - optimizer and gradients (ZeRO-1, ZeRO-2): a reduce-scatter of the gradients and an all-gather of the parameters,
#    (n - 1) / n * 4 Psi each: the all-reduce's volume;
#  - parameters (ZeRO-3): all-gathers forward and backward and the reduce-scatter, 1.5 times the all-reduce's, less
#    one gather of the embedding unit (its backward reads no weights, so nothing is gathered for it: E = the padded
#    vocabulary x hidden + sequence x hidden parameters, from the log) below the paper's 3 Psi;
#  - hybrid sharding in groups of N = 2 (parallel.shard_group): the reduce-scatter over all n ranks, the all-gather of
#    the shard (4 Psi / N) over the G = n / N replicas, and the stage's all-gathers over the group of N.
# The f64 sums of a few doubles (losses, grad-norm parts) are counted apart ("scalars") and left out.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
args=(--config tiny.yaml --nproc 4 --set model.tie_embeddings=false --set training.train_iters=3
      --set optimizer.warmup_iters=1 --set training.micro_batch_size=2 --set training.global_batch_size=8
      --set parallel.grad_bucket_size=3000 --set parallel.timeout_s=60)
for run in "none 0" "optimizer 0" "gradients 0" "parameters 0" "optimizer 2" "parameters 2"; do
  read -r stage group <<<"$run"
  "$MT" "${args[@]}" --set parallel.shard=$stage --set parallel.shard_group=$group --set logging.dir=${stage}_sg$group \
        >/dev/null 2>${stage}_sg$group.err || { tail -5 ${stage}_sg$group.err; fail "$stage sg $group failed"; }
done
python3 - <<'PY'
import json, re
log = open("none_sg0/megatrain.log").read()
psi = int(re.search(r"model: gpt (\d+) parameters", log).group(1))
m = re.search(r"hidden (\d+),.* vocabulary \d+ padded to (\d+)", log)
hidden, vocab = int(m.group(1)), int(m.group(2))
emb = (vocab + 32) * hidden  # the word and position embeddings (seq_length 32)
assert psi % 4 == 0, f"{psi} parameters: a padded bucket would move more than derived here"
n, b, be = 4, 4 * psi, 4 * emb  # ranks, bytes of the model and of the embedding in fp32
share = lambda m: b * (m - 1) // m  # (m - 1) / m of the model's bytes
def expected(stage, group):
    if stage == "none":
        return {"all_reduce": 2 * share(n)}
    N = group or n
    G = n // N
    gathers = {"optimizer": 1, "gradients": 1, "parameters": 2}[stage]
    # The reduce-scatter over everyone; the all-gathers of the shard over its replicas and the stage's in the group.
    skipped = be * (N - 1) // N if stage == "parameters" else 0  # the embedding's backward gathers nothing
    return {"reduce_scatter": share(n),
            "all_gather": (b // N) * (G - 1) // G + gathers * (b * (N - 1) // N) - skipped}
all_reduce = 2 * share(n)
print(f"Psi = {psi} parameters, all-reduce volume 2 (n-1)/n 4 Psi = {all_reduce} bytes per rank and step")
for stage, group in [("none", 0), ("optimizer", 0), ("gradients", 0), ("parameters", 0), ("optimizer", 2),
                     ("parameters", 2)]:
    rows = [json.loads(l) for l in open(f"{stage}_sg{group}/metrics.jsonl")]
    steps = [r for r in rows if "loss" in r]
    assert len(steps) == 3, f"{stage}: expected 3 steps"
    want = expected(stage, group)
    for r in steps:
        dp = {k: v for k, v in r["comm_bytes_by_group"]["dp"].items() if k != "scalars"}
        assert dp == want, f"{stage} group {group} iteration {r['iteration']}: moved {dp}, expected {want}"
    total = sum(want.values())
    print(f"{stage:<10} shard group {group or n}: {want} = {total} bytes ({total / all_reduce:.3f}x the all-reduce)")
    if group == 0:
        ratio = {"none": 1, "optimizer": 1, "gradients": 1, "parameters": 1.5}[stage]
        paper = ratio * all_reduce - (share(n) * emb // psi if stage == "parameters" else 0)
        assert total == paper, f"{stage}: {total / all_reduce}x the all-reduce, the paper says {ratio}x"
        if stage == "parameters":
            print(f"  = 1.5x the all-reduce ({int(1.5 * all_reduce)}) less the embedding's backward gather "
                  f"({share(n) * emb // psi}, E = {emb} of Psi)")
PY
