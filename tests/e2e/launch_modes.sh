#!/usr/bin/env bash
# The same 8-rank job (TP=2 x DP=4) started three ways gives the same losses: `--nproc 8`, a shell loop with
# torchrun-style variables, and a shell loop with Slurm-style variables.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
job=(--config tiny.yaml --set parallel.tensor=2 --set training.micro_batch_size=1 --set training.global_batch_size=8
     --set training.train_iters=6 --set parallel.timeout_s=60)
"$MT" "${job[@]}" --nproc 8 --set logging.dir=nproc >/dev/null
run_ranks 8 "${job[@]}" --set logging.dir=torchrun
port=$(free_port)
pids=()
for r in $(seq 0 7); do
  SLURM_PROCID=$r SLURM_NTASKS=8 SLURM_LOCALID=$r SLURM_NTASKS_PER_NODE=8 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$MT" "${job[@]}" --set logging.dir=slurm >"slurm$r.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "a Slurm-style rank failed: $(tail -3 slurm*.log)"; done
grep -q "(slurm)" slurm/megatrain.log || fail "rank 0 did not read the Slurm variables"
grep -q "(torchrun)" torchrun/megatrain.log || fail "rank 0 did not read the torchrun variables"
same_losses nproc/metrics.jsonl torchrun/metrics.jsonl 1 6 0
same_losses nproc/metrics.jsonl slurm/metrics.jsonl 1 6 0
