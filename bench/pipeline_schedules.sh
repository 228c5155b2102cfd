#!/usr/bin/env bash
# pipeline_schedules.sh: the measured idle fraction of each rank of a 4-stage CPU pipeline under 1F1B, interleaved
# 1F1B (2 chunks per stage), ZB-H1 and ZB-V (2 chunks per stage in a V), at m = 8 and m = 16 microbatches, from the
# timeline (logging.trace) of a traced iteration, beside the schedule simulator's idle fraction for equal F, B and W
# costs, and each stage's peak memory from the training log (issue 27).
#
# Shape: GPT, LAYERS layers (LAYERS / 4 a stage, LAYERS / 8 a chunk when interleaved), hidden C, 4 heads, sequence S,
# micro batch 1, synthetic tokens, fp32, dropout off; 4 ranks (PP 4) over Gloo on this machine, one BLAS thread each.
# For each schedule and m: WARMUP iterations, then iteration WARMUP + 1 traced; scripts/trace_summary.py gives each
# rank's busy time (its forward, backward and weight-gradient spans) and idle fraction of the pipeline window
# (first forward to last backward across the ranks). With more ranks than cores the ranks also wait for a core:
# the idle fractions then mix the bubble with the machine's sharing, and the comparison between schedules is what
# carries over. Writes the traces and a picture of each (scripts/trace_png.py) to OUT (default bench/traces).
#
# Usage: bench/pipeline_schedules.sh [build/megatrain]
# Env: LAYERS (8), C (256), S (256), WARMUP (2), OUT (bench/traces), SCHEDULES ("1f1b interleaved zb-h1 zb-v"),
# MS ("8 16": the microbatch counts).
# Each row ends with each stage's peak memory (all kinds; MiB) and its peak activation memory alone (MiB), from the
# training log's first report.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MT=${1:-$ROOT/build/megatrain}
[[ -x $MT ]] || { echo "pipeline_schedules: no megatrain binary at $MT" >&2; exit 1; }
LAYERS=${LAYERS:-8} C=${C:-256} S=${S:-256} WARMUP=${WARMUP:-2} OUT=${OUT:-$ROOT/bench/traces}
SCHEDULES=${SCHEDULES:-1f1b interleaved zb-h1 zb-v} MS=${MS:-8 16}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"
cat > "$WORK/shape.yaml" <<YAML
model: {num_layers: $LAYERS, hidden_size: $C, num_heads: 4, ffn_hidden_size: $((4 * C)), seq_length: $S,
        vocab_size: 257, dropout: 0.0, attention_dropout: 0.0}
training: {micro_batch_size: 1, train_iters: $((WARMUP + 1)), precision: fp32, seed: 1}
optimizer: {lr: 1.0e-4, warmup_iters: 0}
data: {synthetic: true}
checkpoint: {save_dir: "", load: none}
logging: {interval: 1, trace: true, trace_iterations: [$((WARMUP + 1))]}
parallel: {pipeline: 4, timeout_s: 120}
YAML
printf "%-12s %3s %10s %12s %10s %-28s %s\n" schedule m "sim idle" "window ms" "mean idle" "idle per rank" \
  "peak MiB per stage / activations"
for m in $MS; do
  for schedule in $SCHEDULES; do
    vp=1; [ $schedule = interleaved ] || [ $schedule = zb-v ] && vp=2
    name=${schedule}_m$m
    "$MT" --config "$WORK/shape.yaml" --nproc 4 --set training.global_batch_size=$m \
          --set parallel.virtual_pipeline=$vp --set parallel.pipeline_schedule=$schedule \
          --set logging.dir="$WORK/$name" >/dev/null 2>"$WORK/$name.err" || { tail -5 "$WORK/$name.err"; exit 1; }
    cp "$WORK/$name/trace.json" "$OUT/$name.trace.json"
    python3 "$ROOT/scripts/trace_png.py" "$OUT/$name.trace.json" "$OUT/$name.png" $((WARMUP + 1)) 1200 >/dev/null
    # The simulator's bubble (parallel/pipeline/schedule.h, unit-tested): 1F1B (p-1)/m, interleaved (p-1)/(v m), ZB-H1
    # p/(3m) (the paper's (p-1)/(3m) and one W for its memory bound), ZB-V (p-1)/(6m) of the ideal; as a fraction
    # of the window, b / (1 + b).
    sim=$(python3 -c "b = {'1f1b': 3 / $m, 'interleaved': 3 / (2 * $m), 'zb-h1': 4 / (3 * $m), 'zb-v': 0.5 / $m}['$schedule']; print(f'{100 * b / (1 + b):.1f}%')")
    mem=$(grep -o "per pipeline stage [0-9. |]*" "$WORK/$name/megatrain.log" | tail -1 | sed 's/per pipeline stage //' \
          || true)
    act=$(grep -o "peak activation memory by stage (MiB): [0-9. |]*" "$WORK/$name/megatrain.log" | head -1 \
          | sed 's/.*(MiB): //' || true)
    python3 "$ROOT/scripts/trace_summary.py" "$OUT/$name.trace.json" --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
it = list(s["iterations"].values())[-1]
idle = [r["idle_fraction"] for r in it["ranks"].values()]
print(f"%-12s %3s %10s %12.1f %9.1f%% %-28s %s" % (sys.argv[1], sys.argv[2], sys.argv[3], it["pipeline_window_ms"],
      100 * sum(idle) / len(idle), " ".join(f"{100 * x:.1f}%" for x in idle), sys.argv[4]))' "$schedule" "$m" "$sim" \
      "$mem / $act"
  done
done
echo "traces and pictures in $OUT"
