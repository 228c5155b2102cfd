#!/usr/bin/env bash
# gpu_throughput.sh: training throughput of megatrain against PyTorch on one GPU, on synthetic tokens.
# For each model (configs/<model>.yaml when it exists, else configs/gpt-<model>.yaml: "124m", "llama3.2-1b",
# "llama-tiny") and sequence length: megatrain trains WARMUP + ITERS iterations
# (bf16, no parallelism, no checkpoints), and its timed iterations' tokens/s, TFLOP/s, MFU and peak memory are
# read from RUN_DIR/metrics.jsonl; then bench/torch_baseline.py runs the same model and batch
# (bf16 autocast, fused AdamW, scaled_dot_product_attention, torch.compile) and the ratio is printed.
#
# Usage: bench/gpu_throughput.sh [--megatrain PATH] [--models "124m 350m 1.3b llama3.2-1b"] [--seqs "1024 2048"]
#                                [--warmup N] [--iters N] [--device cuda|cpu] [--no-torch] [--no-megatrain]
# Env (same meaning): MEGATRAIN, MODELS, SEQS, WARMUP (5), ITERS (20), DEVICE (cuda), TORCH (1), MEGATRAIN_RUN (1);
#   DROPOUT (each config's model.dropout: 0.1 for GPT 124M-1.3B, 0 for Llama), ATTN_DROPOUT (0: cuDNN attention;
#   0.1 runs megatrain's kernel), MBS / GBS (micro / global batch for every row), MBS_<MODEL>_<SEQ> (the name
#   upper-cased, '.' and '-' as '_': MBS_124M_1024=16, MBS_1_3B_2048=2, MBS_LLAMA3_2_1B_4096=4),
#   EXTRA_SET ("key=value ..." more megatrain --set overrides), PYTHON (python3), PEAK_TFLOPS (MFU peak;
#   default from the GPU name: H100/H200 989.4, A100 312), RUN_TIMEOUT (300 s per run), KEEP_RUNS=1 (keep the
#   run folders), OUT (also write $OUT/gpu_throughput.md and $OUT/gpu_throughput.jsonl), PLAN_GPU (e.g. h100-80gb:
#   print megatrain plan's predicted ms/iter and peak memory beside each measured megatrain row) with PLAN_RATES
#   (a rates file from `megatrain bench kernels --device cuda`, compared too).
# Llama 3.2 1B alone: MODELS=llama3.2-1b SEQS="1024 2048 4096" bench/gpu_throughput.sh
# A CPU smoke test: DEVICE=cpu MODELS="tiny llama-tiny" SEQS=64 WARMUP=2 ITERS=3 bench/gpu_throughput.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MT=${MEGATRAIN:-}
MODELS=${MODELS:-124m 350m 1.3b}
SEQS=${SEQS:-1024 2048}
WARMUP=${WARMUP:-5}
ITERS=${ITERS:-20}
DEVICE=${DEVICE:-cuda}
TORCH=${TORCH:-1}
MEGATRAIN_RUN=${MEGATRAIN_RUN:-1}
DROPOUT=${DROPOUT:-}          # empty: each config's own model.dropout
# Attention dropout 0 by default: megatrain then runs cuDNN's fused attention (its own kernel keeps attention
# dropout, for layout-invariant masks) and PyTorch its flash SDPA without dropout, as most LLM runs train.
ATTN_DROPOUT=${ATTN_DROPOUT:-0}
PYTHON=${PYTHON:-python3}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}

die() { echo "gpu_throughput: error: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --megatrain) MT=${2:?--megatrain needs a path}; shift 2 ;;
    --models) MODELS=${2:?--models needs a list}; shift 2 ;;
    --seqs) SEQS=${2:?--seqs needs a list}; shift 2 ;;
    --warmup) WARMUP=${2:?--warmup needs a number}; shift 2 ;;
    --iters) ITERS=${2:?--iters needs a number}; shift 2 ;;
    --device) DEVICE=${2:?--device needs cuda or cpu}; shift 2 ;;
    --no-torch) TORCH=0; shift ;;
    --no-megatrain) MEGATRAIN_RUN=0; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case $DEVICE in cuda|cpu) ;; *) die "--device must be cuda or cpu, got '$DEVICE'" ;; esac
[[ $WARMUP =~ ^[0-9]+$ && $ITERS =~ ^[1-9][0-9]*$ ]] || die "WARMUP must be >= 0 and ITERS >= 1"
if [[ $MEGATRAIN_RUN == 1 ]]; then
  if [[ -z $MT ]]; then
    for f in "$ROOT/bin/megatrain" "$ROOT/build-gpu/megatrain" "$ROOT/build/megatrain"; do
      if [[ -x $f ]]; then MT=$f; break; fi
    done
  fi
  [[ -n $MT && -x $MT ]] || die "no megatrain binary (give --megatrain PATH)"
fi
command -v "$PYTHON" >/dev/null || die "$PYTHON not found (needed to read the metrics; set PYTHON)"
# Python runs with the library path it had before scripts/gpu-run.sh added the bundle's (whose libstdc++ may
# be older than torch's); run by hand, without the bundle's lib/gcc entries.
if [[ -n ${MT_ORIG_LD_LIBRARY_PATH+set} ]]; then
  PY_LD_PATH=$MT_ORIG_LD_LIBRARY_PATH
else
  PY_LD_PATH=$(echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep -v '/lib/gcc/*$' | paste -sd: || true)
fi
py() { LD_LIBRARY_PATH=$PY_LD_PATH "$PYTHON" "$@"; }

WORK=$(mktemp -d /tmp/gpu_throughput.XXXXXX)
if [[ ${KEEP_RUNS:-0} == 1 ]]; then echo "run folders kept in $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi

# The config of a MODELS entry: configs/<name>.yaml, else configs/gpt-<name>.yaml.
config_of() {
  if [[ -f $ROOT/configs/$1.yaml ]]; then echo "$ROOT/configs/$1.yaml"; else echo "$ROOT/configs/gpt-$1.yaml"; fi
}

# A config's model.dropout (megatrain's default 0.1 when the file has none), so both sides run the config's.
config_dropout() {
  awk '/^model:/ { m = 1; next } /^[^ #]/ { m = 0 } m && $1 == "dropout:" { print $2; found = 1; exit }
       END { if (!found) print 0.1 }' "$1"
}

# Micro batch per (model, seq): fits 80 GB with room to spare; MBS_<MODEL>_<SEQ> or MBS overrides.
# llama3.2-1b: 8192 tokens per microbatch (8 at 1024, 4 at 2048, 2 at 4096), by `megatrain plan` a predicted
# 34.0 GiB on one H100 (parameters 2.3, gradients 4.6, AdamW 13.8, activations 13.2 GiB); 16384 tokens would be
# 47.2 GiB (a prediction, not measured; PyTorch's fp32 logits over 128256 columns add more on its side).
micro_batch() {
  local model=$1 seq=$2 var
  var=MBS_$(echo "${model}_${seq}" | tr 'a-z.-' 'A-Z__')
  if [[ -n ${!var:-} ]]; then echo "${!var}"; return; fi
  if [[ -n ${MBS:-} ]]; then echo "$MBS"; return; fi
  case $model in
    124m) echo $((seq <= 1024 ? 16 : 8)) ;;
    350m) echo $((seq <= 1024 ? 8 : 4)) ;;
    1.3b) echo $((seq <= 1024 ? 4 : 2)) ;;
    llama3.2-1b) echo $((seq >= 8192 ? 1 : 8192 / seq)) ;;
    *) echo 8 ;;
  esac
}

PEAK=${PEAK_TFLOPS:-}
GPU_NAME=cpu
if [[ $DEVICE == cuda ]]; then
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
  if [[ -z $PEAK ]]; then
    case ${GPU_NAME^^} in *H100*|*H200*) PEAK=989.4 ;; *A100*) PEAK=312 ;; esac
  fi
fi

# Summary of one megatrain run as the baseline's JSON: the timed iterations (after WARMUP) of metrics.jsonl.
summarize_megatrain() {  # metrics.jsonl tokens_per_iter
  py - "$1" "$2" "$WARMUP" "${PEAK:-0}" <<'PY'
import json, sys
path, tokens_per_iter, warmup, peak = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
rows = [json.loads(l) for l in open(path) if l.strip()]
rows = [r for r in rows if r.get("ms_per_iter") is not None]
timed = [r for r in rows if r["iteration"] > warmup]
if not timed:
    sys.exit(f"{path}: no iterations after the {warmup} warm-up ones")
# logging.interval is 1, so each row is one iteration and its TFLOP/s is this iteration's flops / time.
seconds = sum(r["ms_per_iter"] for r in timed) / 1000.0
flops = sum(r["tflops"] * 1e12 * r["ms_per_iter"] / 1000.0 for r in timed)
tflops = flops / seconds / 1e12
mfus = [r["mfu"] for r in timed if r.get("mfu") is not None]
mfu = (sum(mfus) / len(mfus)) if mfus else (tflops / peak if peak > 0 else None)
# The device's peak when the trainer reports one under its own key, else peak_bytes.
def peak_of(r):
    keys = [k for k in r if "peak" in k and k.endswith("bytes") and any(d in k for d in ("device", "cuda", "gpu"))]
    return max((r[k] for k in keys if r[k] is not None), default=r.get("peak_bytes"))
peaks = [p for p in (peak_of(r) for r in rows) if p is not None]
print(json.dumps({"impl": "megatrain", "iters": len(timed), "ms_per_iter": round(seconds * 1000 / len(timed), 3),
                  "tokens_per_s": round(tokens_per_iter * len(timed) / seconds, 1), "tflops": round(tflops, 6),
                  "mfu": round(mfu, 6) if mfu is not None else None, "peak_bytes": max(peaks) if peaks else None,
                  "loss": timed[-1].get("loss")}))
PY
}

# megatrain plan's prediction for the run just measured (issue 16's GPU check): step time and peak memory from
# the built-in table PLAN_GPU (h100-80gb, h200-141gb, ...) and, when PLAN_RATES names one, from the rates file
# `megatrain bench kernels --device cuda` wrote on this GPU.
compare_plan() {  # label config megatrain_json --set args...
  local label=$1 config=$2 measured=$3 rates source
  shift 3
  for rates in "" ${PLAN_RATES:-}; do
    source=${rates:-$PLAN_GPU}
    if "$MT" plan --config "$config" "$@" --world 1 --gpu "$PLAN_GPU" ${rates:+--rates "$rates"} --json \
        >"$WORK/plan.json" 2>"$WORK/plan.err"; then
      py - "$WORK/plan.json" "$measured" "$label" "$source" <<'PY'
import json, sys
plan, measured, label, source = json.load(open(sys.argv[1])), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
ms, peak = plan["time_s"]["total"] * 1e3, plan["memory"][0]["total_bytes"]
line = f"{label}  plan ({source}): {ms:.1f} ms/iter predicted, {measured['ms_per_iter']:.1f} measured ({100 * (ms / measured['ms_per_iter'] - 1):+.1f}%)"
if measured.get("peak_bytes"):
    line += f"; peak {peak / 2**30:.2f} GiB predicted, {measured['peak_bytes'] / 2**30:.2f} measured ({100 * (peak / measured['peak_bytes'] - 1):+.1f}%)"
print(line)
PY
    else
      echo "$label  plan ($source) FAILED: $(tail -n 2 "$WORK/plan.err")"
    fi
  done
}

# One table row from a result JSON: "model seq mbs gbs" then the figures (and the ratio when given).
print_row() {  # label json [megatrain_json_for_ratio]
  py - "$@" <<'PY'
import json, sys
label, r = sys.argv[1], json.loads(sys.argv[2])
ref = json.loads(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] else None
f = lambda v, fmt: format(v, fmt) if v is not None else "n/a"
mfu = f(100 * r["mfu"], ".1f") + "%" if r.get("mfu") is not None else "n/a"
gib = f(r["peak_bytes"] / 2**30 if r.get("peak_bytes") is not None else None, ".2f")
ratio = f(ref["tokens_per_s"] / r["tokens_per_s"], ".2f") + "x" if ref and r.get("tokens_per_s") else ""
impl = r["impl"] + ("" if r.get("compiled", True) else " (eager)")
tflops = f(r["tflops"], ".1f" if r.get("tflops") is not None and r["tflops"] >= 10 else ".3g")
print(f"{label}  {impl:<17} {r['ms_per_iter']:>10.1f} {r['tokens_per_s']:>11.0f} {tflops:>8} {mfu:>6} "
      f"{gib:>9} {ratio:>9}")
PY
}

# The model column is as wide as the longest name in MODELS (6 at least).
MODEL_W=6
for model in $MODELS; do ((${#model} > MODEL_W)) && MODEL_W=${#model}; done

header() {
  printf "%-${MODEL_W}s %5s %4s %4s  %-17s %10s %11s %8s %6s %9s %9s\n" model seq mbs gbs impl ms/iter tokens/s TFLOP/s MFU \
    "peak GiB" "mt/torch"
}

echo "gpu_throughput: device $DEVICE ${GPU_NAME:+($GPU_NAME)}, MFU peak ${PEAK:-n/a} TFLOP/s, warmup $WARMUP + $ITERS timed" \
     "iterations, bf16, dropout ${DROPOUT:-as each config}, attention dropout $ATTN_DROPOUT, models [$MODELS], seqs [$SEQS]"
[[ $MEGATRAIN_RUN == 1 ]] && echo "megatrain: $MT ($("$MT" --version 2>&1 | head -1))"
[[ $TORCH == 1 ]] && echo "pytorch: $(py -c 'import torch; print(torch.__version__)' 2>&1 | tail -1)"
header
jsonl=()
failures=0
for model in $MODELS; do
  config=$(config_of "$model")
  [[ -f $config ]] || { echo "gpu_throughput: neither configs/$model.yaml nor configs/gpt-$model.yaml: skipping model $model" >&2
                        failures=$((failures + 1)); continue; }
  dropout=${DROPOUT:-$(config_dropout "$config")}
  for seq in $SEQS; do
    mbs=$(micro_batch "$model" "$seq")
    gbs=${GBS:-$mbs}
    label=$(printf "%-${MODEL_W}s %5s %4s %4s" "$model" "$seq" "$mbs" "$gbs")
    mt_json=""
    if [[ $MEGATRAIN_RUN == 1 ]]; then
      run=$WORK/mt-$model-$seq
      sets=("model.seq_length=$seq" "model.dropout=$dropout" "model.attention_dropout=$ATTN_DROPOUT"
            parallel.tensor=1 parallel.pipeline=1 parallel.virtual_pipeline=1 parallel.sequence_parallel=false
            parallel.data=1 parallel.distributed_optimizer=false
            "training.micro_batch_size=$mbs" "training.global_batch_size=$gbs"
            "training.train_iters=$((WARMUP + ITERS))" training.precision=bf16 "training.device=$DEVICE"
            data.synthetic=true optimizer.warmup_iters=0 optimizer.decay=constant
            'checkpoint.save_dir=""' checkpoint.load=none
            "logging.dir=$run" logging.interval=1 logging.eval_interval=0)
      # shellcheck disable=SC2206
      sets+=(${EXTRA_SET:-})
      args=()
      for s in "${sets[@]}"; do args+=(--set "$s"); done
      rc=0
      timeout "$RUN_TIMEOUT" "$MT" --config "$config" "${args[@]}" >"$run.out" 2>&1 || rc=$?
      if [[ $rc -eq 0 ]] && mt_json=$(summarize_megatrain "$run/metrics.jsonl" $((gbs * seq)) 2>"$run.err"); then
        print_row "$label" "$mt_json"
        [[ -n ${PLAN_GPU:-} ]] && compare_plan "$label" "$config" "$mt_json" "${args[@]}"
        jsonl+=("$(echo "$mt_json" | sed "s/^{/{\"model\": \"$model\", \"seq\": $seq, \"micro_batch\": $mbs, \"global_batch\": $gbs, /")")
      else
        [[ $rc -eq 124 ]] && why="timed out after $RUN_TIMEOUT s" || why="exit $rc"
        echo "$label  megatrain FAILED ($why); last lines:"
        tail -n 15 "$run.out" "$run.err" 2>/dev/null | sed 's/^/    /' || true
        mt_json=""
        failures=$((failures + 1))
      fi
    fi
    if [[ $TORCH == 1 ]]; then
      out=$WORK/torch-$model-$seq
      rc=0
      timeout "$RUN_TIMEOUT" env LD_LIBRARY_PATH="$PY_LD_PATH" "$PYTHON" "$ROOT/bench/torch_baseline.py" --config "$config" --seq "$seq" \
        --micro-batch "$mbs" --global-batch "$gbs" --warmup "$WARMUP" --iters "$ITERS" --dropout "$dropout" --attention-dropout "$ATTN_DROPOUT" \
        --device "$DEVICE" ${PEAK:+--peak-tflops "$PEAK"} >"$out.json" 2>"$out.err" || rc=$?
      t_json=$(grep '^{' "$out.json" | tail -1 || true)
      if [[ $rc -eq 0 && -n $t_json ]]; then
        print_row "$label" "$t_json" "$mt_json"
        jsonl+=("$(echo "$t_json" | sed "s/^{/{\"model\": \"$model\", /")")
      else
        [[ $rc -eq 124 ]] && why="timed out after $RUN_TIMEOUT s" || why="exit $rc"
        echo "$label  pytorch FAILED ($why); last lines:"
        tail -n 15 "$out.err" 2>/dev/null | sed 's/^/    /' || true
        failures=$((failures + 1))
      fi
    fi
  done
done

if [[ -n ${OUT:-} ]]; then
  mkdir -p "$OUT"
  printf '%s\n' "${jsonl[@]}" >>"$OUT/gpu_throughput.jsonl"
  py - "$OUT/gpu_throughput.jsonl" "$GPU_NAME" >"$OUT/gpu_throughput.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"GPU: {sys.argv[2]}\n")
print("| model | seq | micro batch | impl | ms/iter | tokens/s | TFLOP/s | MFU | peak GiB |")
print("|-------|----:|------------:|------|--------:|---------:|--------:|----:|---------:|")
for r in rows:
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a"
    gib = f"{r['peak_bytes'] / 2**30:.2f}" if r.get("peak_bytes") is not None else "n/a"
    print(f"| {r['model']} | {r['seq']} | {r['micro_batch']} | {r['impl']} | {r['ms_per_iter']:.1f} | "
          f"{r['tokens_per_s']:.0f} | {r['tflops']:.1f} | {mfu} | {gib} |")
PY
  echo "gpu_throughput: results in $OUT/gpu_throughput.md and $OUT/gpu_throughput.jsonl"
fi
[[ $failures -eq 0 ]] || { echo "gpu_throughput: $failures run(s) failed" >&2; exit 1; }
