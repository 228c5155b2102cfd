#!/usr/bin/env bash
# On a GPU: optimizer.offload (pinned host state, gradients down and values up on the copy stream, the host AdamW)
# against the same run without it, with CUDA compute: bit-identical losses and grad norms over 6 iterations in fp32
# and bf16 on one rank, and under ZeRO-1 / ZeRO-3 at DP 2 (the ranks share the GPU through host-staged Gloo, as
# gpu_shard_parameters.sh does); the device's optimizer pool shrinks and the host pool holds the state.
# Skips without a usable GPU.
source "$(dirname "$0")/lib/common.bash"
require_gpu
prepare_data
write_config
base=(--config tiny.yaml --set training.train_iters=6 --set optimizer.warmup_iters=2 --set parallel.timeout_s=120
      --set parallel.grad_bucket_size=3000 --set training.micro_batch_size=2 --set training.device=cuda)
pair() {  # name, then the run's arguments: with and without offload, equal losses and grad norms
  local name=$1
  shift
  for off in false true; do
    "$MT" "${base[@]}" "$@" --set optimizer.offload=$off --set logging.dir=${name}_$off >/dev/null 2>${name}_$off.err ||
      { tail -5 ${name}_$off.err; fail "$name offload=$off failed"; }
  done
  python3 - ${name}_false/metrics.jsonl ${name}_true/metrics.jsonl "$name" <<'PY' || fail "$name differs"
import json, sys
a, b = ([(r["iteration"], r["loss"], r["grad_norm"]) for r in map(json.loads, open(p)) if "loss" in r]
        for p in sys.argv[1:3])
assert len(a) == 6 and a == b, f"{sys.argv[3]}:\n" + "\n".join(f"{x} {y}" for x, y in zip(a, b))
PY
  echo "$name: offload bit-identical to no offload on the GPU"
}
pair fp32 --set training.global_batch_size=2
pair bf16 --set training.global_batch_size=2 --set training.precision=bf16
pair dp2_optimizer_bf16 --nproc 2 --set parallel.backend=gloo --set parallel.shard=optimizer \
     --set training.global_batch_size=4 --set training.precision=bf16
pair dp2_parameters --nproc 2 --set parallel.backend=gloo --set parallel.shard=parameters --set training.global_batch_size=4
peak() { grep -m1 'peak memory (MiB):' "$2/megatrain.log" | sed -E "s/.*$1 ([0-9.]+).*/\1/"; }
python3 - "$(peak optimizer bf16_false)" "$(peak optimizer bf16_true)" "$(peak host bf16_true)" <<'PY' || fail "memory"
import sys
off, on, host = map(float, sys.argv[1:4])
print(f"one rank bf16: device optimizer pool {off} -> {on} MiB, host pool {host} MiB")
assert on == 0 and host >= off, "the state did not move to the host"
PY
