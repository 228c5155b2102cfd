#!/usr/bin/env bash
# cpu_vs_torch.sh: the CPU reference backend's training speed against PyTorch eager, one thread, fp32.
# Shape (issue 12, item 7): GPT with 4 layers, hidden 256, 4 heads, ffn 1024, sequence 256, micro batch = global
# batch 8, byte vocabulary 257 (padded to 384), dropout 0.1 and attention dropout 0.1 (gpt-tiny's), synthetic
# tokens, AdamW, grad clipping 1.0. megatrain runs with OPENBLAS_NUM_THREADS=1; bench/torch_baseline.py with
# --device cpu --dtype fp32 --no-compile --threads 1 (torch.set_num_threads(1), the same model written in torch).
# Each side runs WARMUP untimed + ITERS timed iterations; the two alternate for ROUNDS rounds (the machine may be
# shared: alternating spreads the noise over both) and each reports the median of its rounds' means.
#
# Usage: bench/cpu_vs_torch.sh [--megatrain PATH] [--ref PATH] [--warmup N] [--iters N] [--rounds N] [--no-torch]
#   --ref PATH   also time a second megatrain binary (e.g. the commit before a speed change) in the same rounds
# Env (same meaning): MEGATRAIN, MEGATRAIN_REF, WARMUP (2), ITERS (5), ROUNDS (2), TORCH (1),
#   PYTHON (/work/.venv-torch/bin/python when present, else python3), SHAPE_SET ("key=value ..." more megatrain
#   --set overrides; the torch side is not changed by them).
# When torch cannot be imported the torch side is skipped with a message, and the ratio is given against the
# issue's PyTorch figure (625 ms/iteration, measured on another machine: indicative only).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MT=${MEGATRAIN:-$ROOT/build/megatrain}
REF=${MEGATRAIN_REF:-}
WARMUP=${WARMUP:-2}
ITERS=${ITERS:-5}
ROUNDS=${ROUNDS:-2}
TORCH=${TORCH:-1}
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  [[ -x /work/.venv-torch/bin/python ]] && PYTHON=/work/.venv-torch/bin/python
fi
ISSUE_TORCH_MS=625

die() { echo "cpu_vs_torch: error: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --megatrain) MT=${2:?--megatrain needs a path}; shift 2 ;;
    --ref) REF=${2:?--ref needs a path}; shift 2 ;;
    --warmup) WARMUP=${2:?}; shift 2 ;;
    --iters) ITERS=${2:?}; shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --no-torch) TORCH=0; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ -x $MT ]] || die "no megatrain binary at $MT (build it or give --megatrain PATH)"
[[ -z $REF || -x $REF ]] || die "--ref $REF is not an executable"
[[ $WARMUP =~ ^[0-9]+$ && $ITERS =~ ^[1-9][0-9]*$ && $ROUNDS =~ ^[1-9][0-9]*$ ]] ||
  die "WARMUP must be >= 0, ITERS and ROUNDS >= 1"
command -v python3 >/dev/null || die "python3 not found (needed to read metrics.jsonl)"

export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
L=4 H=256 A=4 FFN=1024 S=256 B=8 V=257 P=0.1

if [[ $TORCH == 1 ]] && ! torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
  echo "cpu_vs_torch: torch cannot be imported by $PYTHON: skipping the PyTorch side; the ratio below is against" \
       "the issue's figure of $ISSUE_TORCH_MS ms/iteration (another machine, indicative only)"
  TORCH=0
fi

WORK=$(mktemp -d /tmp/cpu_vs_torch.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cat >"$WORK/shape.yaml" <<YAML
model: {num_layers: $L, hidden_size: $H, num_heads: $A, ffn_hidden_size: $FFN, seq_length: $S, vocab_size: $V,
        dropout: $P, attention_dropout: $P}
training: {micro_batch_size: $B, global_batch_size: $B, train_iters: $((WARMUP + ITERS)), precision: fp32,
           seed: 1234, device: cpu}
optimizer: {lr: 3.0e-4, min_lr: 3.0e-5, warmup_iters: 0, decay: constant, weight_decay: 0.1, betas: [0.9, 0.95],
            grad_clip: 1.0}
data: {synthetic: true}
checkpoint: {save_dir: "", load: none}
logging: {interval: 1, eval_interval: 0}
YAML

# Mean ms/iteration of one megatrain run's timed iterations (metrics.jsonl rows after WARMUP).
run_megatrain() {  # binary tag
  local run=$WORK/$2 args=()
  # shellcheck disable=SC2206
  local extra=(${SHAPE_SET:-})
  for s in "${extra[@]}"; do args+=(--set "$s"); done
  rm -rf "$run"
  "$1" --config "$WORK/shape.yaml" --set "logging.dir=$run" "${args[@]}" >"$run.out" 2>&1 ||
    { tail -n 20 "$run.out" >&2; die "$1 failed (log above)"; }
  python3 - "$run/metrics.jsonl" "$WARMUP" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
timed = [r["ms_per_iter"] for r in rows if r.get("ms_per_iter") is not None and r["iteration"] > int(sys.argv[2])]
print(f"{sum(timed) / len(timed):.1f}")
PY
}

run_torch() {
  "$PYTHON" "$ROOT/bench/torch_baseline.py" --device cpu --dtype fp32 --no-compile --threads 1 --layers $L \
    --hidden $H --heads $A --ffn $FFN --seq $S --vocab $V --dropout $P --attention-dropout $P --micro-batch $B \
    --warmup "$WARMUP" --iters "$ITERS" 2>"$WORK/torch.err" | python3 -c 'import json,sys; print(json.loads(sys.stdin.readlines()[-1])["ms_per_iter"])' ||
    { cat "$WORK/torch.err" >&2; die "bench/torch_baseline.py failed (log above)"; }
}

median() { tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

echo "cpu_vs_torch: $(lscpu | sed -n 's/^Model name: *//p' | head -1), one thread, fp32; GPT layers $L hidden $H heads $A" \
     "ffn $FFN seq $S micro batch $B vocab $V, dropout $P/$P; $WARMUP warm-up + $ITERS timed iterations x $ROUNDS rounds"
echo "megatrain: $MT"
[[ -n $REF ]] && echo "reference: $REF"
[[ $TORCH == 1 ]] && echo "pytorch:   $torch_version eager ($PYTHON)"
mt_ms=() ref_ms=() torch_ms=()
for ((r = 1; r <= ROUNDS; ++r)); do
  mt_ms+=("$(run_megatrain "$MT" mt-$r)")
  [[ -n $REF ]] && ref_ms+=("$(run_megatrain "$REF" ref-$r)")
  [[ $TORCH == 1 ]] && torch_ms+=("$(run_torch)")
  echo "round $r: megatrain ${mt_ms[-1]} ms${REF:+, reference ${ref_ms[-1]:-} ms}$([[ $TORCH == 1 ]] && echo ", pytorch ${torch_ms[-1]} ms")"
done

mt=$(echo "${mt_ms[*]}" | median)
printf '\n%-22s %12s %18s\n' impl ms/iter "ratio to pytorch"
if [[ $TORCH == 1 ]]; then
  base=$(echo "${torch_ms[*]}" | median)
  base_label="pytorch eager"
else
  base=$ISSUE_TORCH_MS
  base_label="pytorch (issue figure)"
fi
ratio() { awk -v a="$1" -v b="$base" 'BEGIN {printf "%.2f", a / b}'; }
printf '%-22s %12.1f %18s\n' "megatrain" "$mt" "$(ratio "$mt")"
if [[ -n $REF ]]; then
  ref=$(echo "${ref_ms[*]}" | median)
  printf '%-22s %12.1f %18s\n' "megatrain (reference)" "$ref" "$(ratio "$ref")"
fi
printf '%-22s %12.1f %18s\n' "$base_label" "$base" "1.00"
