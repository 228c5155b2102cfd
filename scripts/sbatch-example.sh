#!/usr/bin/env bash
# An sbatch script for megatrain: one task per GPU (or per CPU rank), rank and world size from Slurm's
# variables (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), the rendezvous on the first node of the job.
#SBATCH --job-name=megatrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --time=04:00:00
set -euo pipefail
CONFIG=${CONFIG:-configs/gpt-1.3b.yaml}
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=${MASTER_PORT:-29500}
# srun starts one megatrain per task; each reads its rank from the Slurm environment and drives the GPU its
# local rank names (training.device: auto picks cuda when GPUs are visible; NCCL between them).
srun --kill-on-bad-exit=1 build/megatrain --config "$CONFIG" "$@"
