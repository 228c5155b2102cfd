#!/usr/bin/env bash
# cpu_vs_torch.sh: the CPU reference backend's training speed against PyTorch eager, one thread, fp32.
# Shape (issue 12, item 7): GPT with 4 layers, hidden 256, 4 heads, ffn 1024, sequence 256, micro batch = global
# batch 8, byte vocabulary 257 (padded to 384), dropout 0.1 and attention dropout 0.1 (gpt-tiny's), synthetic
# tokens, AdamW, grad clipping 1.0. megatrain runs with OPENBLAS_NUM_THREADS=1; bench/torch_baseline.py with
# --device cpu --dtype fp32 --no-compile --threads 1 (torch.set_num_threads(1), the same model written in torch).
# Each side runs WARMUP untimed + ITERS timed iterations; the sides alternate for ROUNDS rounds (the machine may be
# shared: alternating spreads the noise over all) and each reports the median of its rounds' means, twice:
#   wall ms/iter  the trainer's own figure (megatrain's metrics.jsonl, the baseline's perf_counter)
#   cpu ms/iter   the process's CPU time per timed iteration: megatrain's is the CPU time of a WARMUP + ITERS run
#                 minus that of a WARMUP-only run, over ITERS; the baseline's is time.process_time() over its timed
#                 loop. On a loaded machine this is the steadier figure (both sides run one thread).
#
# Usage: bench/cpu_vs_torch.sh [--megatrain PATH] [--ref PATH]... [--warmup N] [--iters N] [--rounds N] [--no-torch]
#   --ref PATH   also time another megatrain binary (e.g. the commit before a speed change) in the same rounds;
#                repeatable
# Env (same meaning): MEGATRAIN, MEGATRAIN_REF (one path), WARMUP (2, at least 1), ITERS (5), ROUNDS (2), TORCH (1),
#   PYTHON (build/interop-venv/bin/python when present, else python3), SHAPE_SET ("key=value ..." more megatrain
#   --set overrides; the torch side is not changed by them).
# When torch cannot be imported the torch side is skipped with a message, and the ratio is given against the
# issue's PyTorch figure (625 ms/iteration, measured on another machine: indicative only).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MT=${MEGATRAIN:-$ROOT/build/megatrain}
REFS=()
[[ -n ${MEGATRAIN_REF:-} ]] && REFS+=("$MEGATRAIN_REF")
WARMUP=${WARMUP:-2}
ITERS=${ITERS:-5}
ROUNDS=${ROUNDS:-2}
TORCH=${TORCH:-1}
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  [[ -x $ROOT/build/interop-venv/bin/python ]] && PYTHON=$ROOT/build/interop-venv/bin/python
fi
ISSUE_TORCH_MS=625

die() { echo "cpu_vs_torch: error: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --megatrain) MT=${2:?--megatrain needs a path}; shift 2 ;;
    --ref) REFS+=("${2:?--ref needs a path}"); shift 2 ;;
    --warmup) WARMUP=${2:?}; shift 2 ;;
    --iters) ITERS=${2:?}; shift 2 ;;
    --rounds) ROUNDS=${2:?}; shift 2 ;;
    --no-torch) TORCH=0; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ -x $MT ]] || die "no megatrain binary at $MT (build it or give --megatrain PATH)"
for r in "${REFS[@]}"; do [[ -x $r ]] || die "--ref $r is not an executable"; done
[[ $WARMUP =~ ^[1-9][0-9]*$ && $ITERS =~ ^[1-9][0-9]*$ && $ROUNDS =~ ^[1-9][0-9]*$ ]] ||
  die "WARMUP, ITERS and ROUNDS must be >= 1"
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

# CPU seconds (user + system) of a command, its output to a file.
cpu_seconds() {  # log command...
  python3 - "$@" <<'PY'
import resource, subprocess, sys
with open(sys.argv[1], "w") as log:
    rc = subprocess.run(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT).returncode
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{r.ru_utime + r.ru_stime:.3f}")
sys.exit(rc)
PY
}

# "wall cpu": mean ms/iteration of one megatrain binary's timed iterations (metrics.jsonl rows after WARMUP) and
# its CPU ms/iteration (a full run's CPU time minus a WARMUP-only run's, over ITERS).
run_megatrain() {  # binary tag
  local run=$WORK/$2 args=() full warm
  # shellcheck disable=SC2206
  local extra=(${SHAPE_SET:-})
  for s in "${extra[@]}"; do args+=(--set "$s"); done
  rm -rf "$run" "$run-warm"
  full=$(cpu_seconds "$run.out" "$1" --config "$WORK/shape.yaml" --set "logging.dir=$run" "${args[@]}") ||
    { tail -n 20 "$run.out" >&2; die "$1 failed (log above)"; }
  warm=$(cpu_seconds "$run-warm.out" "$1" --config "$WORK/shape.yaml" --set "logging.dir=$run-warm" \
    --set "training.train_iters=$WARMUP" "${args[@]}") || { tail -n 20 "$run-warm.out" >&2; die "$1 failed (log above)"; }
  python3 - "$run/metrics.jsonl" "$WARMUP" "$ITERS" "$full" "$warm" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
timed = [r["ms_per_iter"] for r in rows if r.get("ms_per_iter") is not None and r["iteration"] > int(sys.argv[2])]
cpu = (float(sys.argv[4]) - float(sys.argv[5])) / int(sys.argv[3]) * 1000.0
print(f"{sum(timed) / len(timed):.1f} {cpu:.1f}")
PY
}

# "wall cpu" of the PyTorch baseline.
run_torch() {
  "$PYTHON" "$ROOT/bench/torch_baseline.py" --device cpu --dtype fp32 --no-compile --threads 1 --layers $L \
    --hidden $H --heads $A --ffn $FFN --seq $S --vocab $V --dropout $P --attention-dropout $P --micro-batch $B \
    --warmup "$WARMUP" --iters "$ITERS" 2>"$WORK/torch.err" |
    python3 -c 'import json,sys; r = json.loads(sys.stdin.readlines()[-1]); print(r["ms_per_iter"], r["cpu_ms_per_iter"])' ||
    { cat "$WORK/torch.err" >&2; die "bench/torch_baseline.py failed (log above)"; }
}

median() { tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

echo "cpu_vs_torch: $(lscpu | sed -n 's/^Model name: *//p' | head -1), one thread, fp32; GPT layers $L hidden $H heads $A" \
     "ffn $FFN seq $S micro batch $B vocab $V, dropout $P/$P; $WARMUP warm-up + $ITERS timed iterations x $ROUNDS rounds"
echo "megatrain: $MT"
for i in "${!REFS[@]}"; do echo "ref $((i + 1)):     ${REFS[$i]}"; done
[[ $TORCH == 1 ]] && echo "pytorch:   $torch_version eager ($PYTHON)"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
# results[name] = "wall cpu wall cpu ..." over the rounds
declare -A results=()
names=(megatrain)
for i in "${!REFS[@]}"; do names+=("ref $((i + 1))"); done
[[ $TORCH == 1 ]] && names+=(pytorch)
for ((r = 1; r <= ROUNDS; ++r)); do
  line="round $r:"
  for name in "${names[@]}"; do
    case $name in
      megatrain) out=$(run_megatrain "$MT" mt-$r) ;;
      pytorch) out=$(run_torch) ;;
      *) i=${name#ref }; out=$(run_megatrain "${REFS[$((i - 1))]}" ref$i-$r) ;;
    esac
    results[$name]+=" $out"
    line+=" $name $(echo "$out" | awk '{print $1 " wall / " $2 " cpu ms;"}')"
  done
  echo "$line"
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

# Median of the odd (wall) or even (cpu) fields of a results entry.
pick() { echo "${results[$1]}" | tr -s ' ' '\n' | sed '/^$/d' | awk -v k="$2" 'NR % 2 == k'; }
if [[ $TORCH == 1 ]]; then
  base_wall=$(pick pytorch 1 | median) base_cpu=$(pick pytorch 0 | median) base_label="pytorch eager"
else
  base_wall=$ISSUE_TORCH_MS base_cpu=$ISSUE_TORCH_MS base_label="pytorch (issue figure)"
fi
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
printf '\n%-22s %14s %13s %16s %15s\n' impl "wall ms/iter" "cpu ms/iter" "wall / pytorch" "cpu / pytorch"
for name in "${names[@]}"; do
  [[ $name == pytorch ]] && continue
  w=$(pick "$name" 1 | median) c=$(pick "$name" 0 | median)
  printf '%-22s %14.1f %13.1f %16s %15s\n' "$name" "$w" "$c" "$(ratio "$w" "$base_wall")" "$(ratio "$c" "$base_cpu")"
done
printf '%-22s %14.1f %13.1f %16s %15s\n' "$base_label" "$base_wall" "$base_cpu" 1.00 1.00
