#!/usr/bin/env bash
# gpu_throughput.sh: training throughput of megatrain against PyTorch on one GPU, on synthetic tokens, as people
# train: micro batches of 4 sequences (fewer where 80 GB would not hold them) and gradient accumulation over ACCUM
# (8) of them per step, so the optimizer is amortised. For each model (configs/<model>.yaml when it exists, else
# configs/gpt-<model>.yaml: "124m", "llama3.2-1b", "llama-tiny") and sequence length: megatrain trains WARMUP + ITERS
# iterations (bf16, no parallelism, no checkpoints), and its timed iterations' tokens/s, TFLOP/s, MFU and peak memory
# are read from RUN_DIR/metrics.jsonl; then bench/torch_baseline.py runs the same model, micro batch and
# accumulation (bf16 autocast, fused AdamW, scaled_dot_product_attention, torch.compile) and the ratio is printed.
# On a GPU without attention dropout megatrain must run cuDNN's fused attention (MEGATRAIN_ATTENTION=cudnn makes
# a fallback an error; metrics.jsonl's attention_cudnn_calls > 0 and attention_kernel_calls == 0 are checked), with
# cuDNN's deterministic backward unless NONDET=1; the "attention" column says which path each figure used.
#
# Usage: bench/gpu_throughput.sh [--megatrain PATH] [--models "124m 350m 1.3b llama3.2-1b"] [--seqs "1024 2048"]
#                                [--warmup N] [--iters N] [--device cuda|cpu] [--no-torch] [--no-megatrain]
# Env (same meaning): MEGATRAIN, MODELS (1.3b), SEQS, WARMUP (3), ITERS (10), DEVICE (cuda), TORCH (1),
#   MEGATRAIN_RUN (1); DROPOUT (each config's model.dropout: 0.1 for GPT 124M-1.3B, 0 for Llama), ATTN_DROPOUT (0:
#   cuDNN attention; 0.1 runs megatrain's kernel), NONDET=1 (cuDNN's non-deterministic attention backward:
#   MEGATRAIN_CUDNN_BACKWARD=nondeterministic), MEGATRAIN_ATTENTION (cudnn|kernel: the path to expect; default
#   cudnn without attention dropout on a GPU), MBS (micro batch for every row), MBS_<MODEL>_<SEQ> (the name
#   upper-cased, '.' and '-' as '_': MBS_124M_1024=4, MBS_1_3B_2048=4), ACCUM (8: microbatches per step), GBS
#   (global batch for every row instead of ACCUM x MBS), EXTRA_SET ("key=value ..." more megatrain --set overrides),
#   PYTHON (python3), PEAK_TFLOPS (MFU peak; default from the GPU name: H100/H200 989.4, A100 312), RUN_TIMEOUT (300
#   s per run), BUDGET (seconds for the whole script: each run is capped by an equal share of what is left, runs
#   with no time left are reported NOT RUN; scripts/gpu-run.sh sets it), KEEP_RUNS=1 (keep the run folders), OUT
#   (also write $OUT/gpu_throughput.md and append each row to $OUT/gpu_throughput.jsonl), PROFILE=1 (megatrain's last
#   warm-up iteration timed op by op: logging.profile_iteration, to $OUT/op_profile-<model>-<seq>.md), PLAN_GPU (e.g. h100-80gb:
#   print megatrain plan's predicted ms/iter and peak memory beside each measured megatrain row) with PLAN_RATES (a
#   rates file from `megatrain bench kernels --device cuda`, compared too).
# One model per GPU command (scripts/gpu-run.sh bench 1.3b); Llama 3.2 1B: MODELS=llama3.2-1b SEQS="1024 2048 4096"
# A CPU smoke test: DEVICE=cpu MODELS="tiny llama-tiny" SEQS=64 WARMUP=2 ITERS=3 bench/gpu_throughput.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MT=${MEGATRAIN:-}
MODELS=${MODELS:-1.3b}
SEQS=${SEQS:-1024 2048}
WARMUP=${WARMUP:-3}
ITERS=${ITERS:-10}
DEVICE=${DEVICE:-cuda}
TORCH=${TORCH:-1}
MEGATRAIN_RUN=${MEGATRAIN_RUN:-1}
DROPOUT=${DROPOUT:-}          # empty: each config's own model.dropout
# Attention dropout 0 by default: megatrain then runs cuDNN's fused attention (its own kernel keeps attention
# dropout, for layout-invariant masks) and PyTorch its flash SDPA without dropout, as most LLM runs train.
ATTN_DROPOUT=${ATTN_DROPOUT:-0}
NONDET=${NONDET:-0}
ACCUM=${ACCUM:-8}
PYTHON=${PYTHON:-python3}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
BUDGET=${BUDGET:-}
START=$SECONDS

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
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case $DEVICE in cuda|cpu) ;; *) die "--device must be cuda or cpu, got '$DEVICE'" ;; esac
[[ $WARMUP =~ ^[0-9]+$ && $ITERS =~ ^[1-9][0-9]*$ ]] || die "WARMUP must be >= 0 and ITERS >= 1"
[[ $ACCUM =~ ^[1-9][0-9]*$ ]] || die "ACCUM must be >= 1, got '$ACCUM'"
[[ -z $BUDGET || $BUDGET =~ ^[0-9]+$ ]] || die "BUDGET must be a number of seconds, got '$BUDGET'"
case $NONDET in 0|1) ;; *) die "NONDET must be 0 or 1, got '$NONDET'" ;; esac
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

# Micro batch per (model, seq): 4 sequences (the 1.3B config's own), at most 16384 tokens, so 2 at 8192 and 1 beyond;
# MBS_<MODEL>_<SEQ> or MBS overrides. `megatrain plan` (one H100, bf16, no recomputation, 8 microbatches per step)
# predicts at micro batch 4: 1.3b 28.9 GiB at 1024, 35.7 at 2048, 49.4 at 4096; llama3.2-1b 27.4, 34.0, 47.2;
# 124m 9.8 and 350m 21.2 GiB at 4096; at 8192 micro batch 2: 1.3b 49.5, llama3.2-1b 47.2 GiB (4 would be 76.8 and
# 73.7 GiB against the 74.5 GiB the plan gives an 80 GB H100; PyTorch's fp32 logits add B x S x vocab x 8 bytes on
# its side). Predictions, not measurements.
micro_batch() {
  local model=$1 seq=$2 var mbs
  var=MBS_$(echo "${model}_${seq}" | tr 'a-z.-' 'A-Z__')
  if [[ -n ${!var:-} ]]; then echo "${!var}"; return; fi
  if [[ -n ${MBS:-} ]]; then echo "$MBS"; return; fi
  mbs=$((16384 / seq))
  echo $((mbs > 4 ? 4 : mbs < 1 ? 1 : mbs))
}

PEAK=${PEAK_TFLOPS:-}
GPU_NAME=cpu
if [[ $DEVICE == cuda ]]; then
  GPU_NAME=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
  if [[ -z $PEAK ]]; then
    case ${GPU_NAME^^} in *H100*|*H200*) PEAK=989.4 ;; *A100*) PEAK=312 ;; esac
  fi
fi

# Which attention megatrain's GPU runs must take: MEGATRAIN_ATTENTION when set (cudnn, kernel, auto), else cuDNN's
# fused attention without attention dropout (then MEGATRAIN_ATTENTION=cudnn makes a fallback an error) and
# megatrain's kernel with it. On the CPU: the CPU's.
EXPECT_ATTN=cpu
if [[ $DEVICE == cuda ]]; then
  if [[ -n ${MEGATRAIN_ATTENTION:-} ]]; then
    EXPECT_ATTN=$MEGATRAIN_ATTENTION
  elif awk -v p="$ATTN_DROPOUT" 'BEGIN { exit !(p + 0 == 0) }'; then
    EXPECT_ATTN=cudnn
    export MEGATRAIN_ATTENTION=cudnn
  else
    EXPECT_ATTN=kernel
  fi
  # The attention backward cuDNN runs (the C++ side reads it; the start log's attention line names it).
  if [[ $NONDET == 1 ]]; then export MEGATRAIN_CUDNN_BACKWARD=nondeterministic
  else export MEGATRAIN_CUDNN_BACKWARD=deterministic; fi
fi

# The attention label of a megatrain run from its start log ("attention: cuDNN fused (flash) ... deterministic
# backward"), checked against what was asked: "cudnn det", "cudnn nondet", "kernel" or "cpu"; fails, saying why,
# when the log does not show the path and backward expected.
attention_label() {  # run.out
  local line
  [[ $DEVICE == cuda ]] || { echo cpu; return; }
  line=$(grep -m1 -o 'attention: .*' "$1" || true)
  [[ -n $line ]] || { echo "no 'attention:' line in the start log" >&2; return 1; }
  case $line in
    *cuDNN*)
      [[ $EXPECT_ATTN != kernel ]] || { echo "kernel attention was asked, the log says: $line" >&2; return 1; }
      if [[ $line == *"non-deterministic backward"* ]]; then
        [[ $NONDET == 1 ]] || { echo "NONDET=0 but the log says: $line" >&2; return 1; }
        echo "cudnn nondet"
      elif [[ $line == *"deterministic backward"* ]]; then
        [[ $NONDET == 0 ]] || { echo "NONDET=1 but the log says: $line" >&2; return 1; }
        echo "cudnn det"
      else
        echo "the attention line names no backward ('deterministic backward' or 'non-deterministic backward';" \
             "the C++ side reads MEGATRAIN_CUDNN_BACKWARD): $line" >&2
        return 1
      fi ;;
    *)
      [[ $EXPECT_ATTN != cudnn ]] || { echo "cuDNN attention was expected, the log says: $line" >&2; return 1; }
      echo kernel ;;
  esac
}

# With EXPECT_ATTN cudnn or kernel, the run's cumulative attention call counts must show that path only.
check_attention_calls() {  # metrics.jsonl
  [[ $EXPECT_ATTN == cudnn || $EXPECT_ATTN == kernel ]] || return 0
  py "$ROOT/tests/e2e/lib/attention_calls.py" "$1" "$EXPECT_ATTN" >/dev/null
}

# Summary of one megatrain run as the baseline's JSON: the timed iterations (after WARMUP) of metrics.jsonl.
summarize_megatrain() {  # metrics.jsonl tokens_per_iter attention_label
  py - "$1" "$2" "$WARMUP" "${PEAK:-0}" "$3" <<'PY'
import json, sys
path, tokens_per_iter, warmup, peak, attention = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
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
                  "loss": timed[-1].get("loss"), "attention": attention}))
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
print(f"{label}  {impl:<17} {r.get('attention', 'n/a'):<12} {r['ms_per_iter']:>10.1f} {r['tokens_per_s']:>11.0f} "
      f"{tflops:>8} {mfu:>6} {gib:>9} {ratio:>9}")
PY
}

# The model column is as wide as the longest name in MODELS (6 at least).
MODEL_W=6
for model in $MODELS; do ((${#model} > MODEL_W)) && MODEL_W=${#model}; done

header() {
  printf "%-${MODEL_W}s %5s %4s %4s  %-17s %-12s %10s %11s %8s %6s %9s %9s\n" model seq mbs gbs impl attention ms/iter \
    tokens/s TFLOP/s MFU "peak GiB" "mt/torch"
}

# Every run gets a cap: RUN_TIMEOUT, or with BUDGET an equal share of what is left of it for the runs to go (a
# run that ends early leaves its time to the later ones; MIN_RUN at least while that much is left), less the kill
# grace and TABLE_S for the tables at the end.
KILL_GRACE=10
TABLE_S=10
MIN_RUN=20
RUNS_LEFT=0
for model in $MODELS; do
  if [[ -f $(config_of "$model") ]]; then RUNS_LEFT=$((RUNS_LEFT + $(wc -w <<<"$SEQS") * (MEGATRAIN_RUN + TORCH))); fi
done
# timed_run STDOUT STDERR CMD...: CMD under `timeout -k`, capped as above (STDERR may be STDOUT). Sets RC (125: not started, no time
# left) and WHY (empty, or why it failed).
RC=0 WHY=
timed_run() {
  local out=$1 err=$2 cap=$RUN_TIMEOUT left share t0
  shift 2
  if [[ -n $BUDGET ]]; then
    left=$((START + BUDGET - SECONDS - TABLE_S - KILL_GRACE))
    share=$((left / RUNS_LEFT))
    ((share >= MIN_RUN)) || share=$((left < MIN_RUN ? left : MIN_RUN))
    ((share < cap)) && cap=$share
    if ((cap < MIN_RUN)); then
      RUNS_LEFT=$((RUNS_LEFT - 1)) RC=125 WHY="NOT RUN: $((left > 0 ? left : 0)) s left of BUDGET=$BUDGET"; return 0
    fi
  fi
  RUNS_LEFT=$((RUNS_LEFT - 1))
  RC=0 t0=$SECONDS
  if [[ $out == "$err" ]]; then
    timeout -k "$KILL_GRACE" "$cap" "$@" >"$out" 2>&1 || RC=$?
  else
    timeout -k "$KILL_GRACE" "$cap" "$@" >"$out" 2>"$err" || RC=$?
  fi
  WHY=
  if [[ $RC -ne 0 ]]; then
    WHY="exit $RC"
    if [[ $RC -eq 124 || $RC -eq 137 ]] && ((SECONDS - t0 >= cap)); then WHY="timed out at its cap of $cap s"; fi
  fi
}
ok_runs=0 failures=0 not_run=0
failed_run() {  # label impl files...: the failure and the last lines of its logs
  local label=$1 impl=$2
  shift 2
  if [[ $RC -eq 125 ]]; then echo "$label  $impl $WHY"; not_run=$((not_run + 1)); return; fi
  echo "$label  $impl FAILED ($WHY); last lines:"
  tail -n 15 "$@" 2>/dev/null | sed 's/^/    /' || true
  failures=$((failures + 1))
}
emit() {  # json: one result row, appended to $OUT/gpu_throughput.jsonl at once (kept when a later run hangs)
  ok_runs=$((ok_runs + 1))
  if [[ -n ${OUT:-} ]]; then mkdir -p "$OUT" && echo "$1" >>"$OUT/gpu_throughput.jsonl"; fi
}

echo "gpu_throughput: device $DEVICE ${GPU_NAME:+($GPU_NAME)}, MFU peak ${PEAK:-n/a} TFLOP/s, warmup $WARMUP + $ITERS timed" \
     "iterations of ${GBS:+global batch $GBS}${GBS:-$ACCUM microbatches}, bf16, dropout ${DROPOUT:-as each config}, attention dropout" \
     "$ATTN_DROPOUT, attention expected: $EXPECT_ATTN${MEGATRAIN_CUDNN_BACKWARD:+ ($MEGATRAIN_CUDNN_BACKWARD backward)}," \
     "models [$MODELS], seqs [$SEQS]${BUDGET:+, budget $BUDGET s}"
[[ $MEGATRAIN_RUN == 1 ]] && echo "megatrain: $MT ($(timeout 30 "$MT" --version 2>&1 | head -1))"
[[ $TORCH == 1 ]] && echo "pytorch: $(timeout 60 env LD_LIBRARY_PATH="$PY_LD_PATH" "$PYTHON" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1)"
header
for model in $MODELS; do
  config=$(config_of "$model")
  [[ -f $config ]] || { echo "gpu_throughput: neither configs/$model.yaml nor configs/gpt-$model.yaml: skipping model $model" >&2
                        failures=$((failures + 1)); continue; }
  dropout=${DROPOUT:-$(config_dropout "$config")}
  for seq in $SEQS; do
    mbs=$(micro_batch "$model" "$seq")
    gbs=${GBS:-$((ACCUM * mbs))}
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
      # PROFILE=1: the last warm-up iteration (the first when there is none) is timed op by op (left out of the
      # figures when WARMUP > 0); its op_profile.md goes to $OUT/op_profile-<model>-<seq>.md.
      [[ ${PROFILE:-0} == 1 ]] && sets+=("logging.profile_iteration=$((WARMUP > 0 ? WARMUP : 1))")
      # shellcheck disable=SC2206
      sets+=(${EXTRA_SET:-})
      args=()
      for s in "${sets[@]}"; do args+=(--set "$s"); done
      timed_run "$run.out" "$run.out" "$MT" --config "$config" "${args[@]}"
      if [[ $RC -eq 0 ]] && attn=$(attention_label "$run.out" 2>"$run.err") &&
         check_attention_calls "$run/metrics.jsonl" 2>"$run.err" &&
         mt_json=$(summarize_megatrain "$run/metrics.jsonl" $((gbs * seq)) "$attn" 2>"$run.err"); then
        print_row "$label" "$mt_json"
        if [[ ${PROFILE:-0} == 1 && -f $run/op_profile.md ]]; then
          sed -n '1p' "$run/op_profile.md"
          if [[ -n ${OUT:-} ]]; then mkdir -p "$OUT" && cp "$run/op_profile.md" "$OUT/op_profile-$model-$seq.md"; fi
        fi
        [[ -n ${PLAN_GPU:-} ]] && compare_plan "$label" "$config" "$mt_json" "${args[@]}"
        emit "$(echo "$mt_json" | sed "s/^{/{\"model\": \"$model\", \"seq\": $seq, \"micro_batch\": $mbs, \"global_batch\": $gbs, /")"
      else
        [[ $RC -ne 0 ]] || WHY=$(tail -n 1 "$run.err")
        failed_run "$label" megatrain "$run.out" "$run.err"
        mt_json=""
      fi
    fi
    if [[ $TORCH == 1 ]]; then
      out=$WORK/torch-$model-$seq
      timed_run "$out.json" "$out.err" env LD_LIBRARY_PATH="$PY_LD_PATH" "$PYTHON" "$ROOT/bench/torch_baseline.py" \
        --config "$config" --seq "$seq" --micro-batch "$mbs" --global-batch "$gbs" --warmup "$WARMUP" --iters "$ITERS" \
        --dropout "$dropout" --attention-dropout "$ATTN_DROPOUT" --device "$DEVICE" ${PEAK:+--peak-tflops "$PEAK"}
      t_json=$(grep '^{' "$out.json" 2>/dev/null | tail -1 || true)
      if [[ $RC -eq 0 && -n $t_json ]]; then
        print_row "$label" "$t_json" "$mt_json"
        emit "$(echo "$t_json" | sed "s/^{/{\"model\": \"$model\", /")"
      else
        [[ $RC -ne 0 ]] || WHY="no JSON line on its output"
        failed_run "$label" pytorch "$out.err"
      fi
    fi
  done
done

if [[ -n ${OUT:-} && -f $OUT/gpu_throughput.jsonl ]]; then
  py - "$OUT/gpu_throughput.jsonl" "$GPU_NAME" >"$OUT/gpu_throughput.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"GPU: {sys.argv[2]}\n")
print("| model | seq | micro batch | global batch | impl | attention | ms/iter | tokens/s | TFLOP/s | MFU | peak GiB |")
print("|-------|----:|------------:|-------------:|------|-----------|--------:|---------:|--------:|----:|---------:|")
for r in rows:
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a"
    gib = f"{r['peak_bytes'] / 2**30:.2f}" if r.get("peak_bytes") is not None else "n/a"
    print(f"| {r['model']} | {r['seq']} | {r['micro_batch']} | {r.get('global_batch', 'n/a')} | {r['impl']} | "
          f"{r.get('attention', 'n/a')} | {r['ms_per_iter']:.1f} | {r['tokens_per_s']:.0f} | {r['tflops']:.1f} | {mfu} | {gib} |")
PY
  echo "gpu_throughput: results in $OUT/gpu_throughput.md and $OUT/gpu_throughput.jsonl"
fi
echo "gpu_throughput: runs: $ok_runs ok, $failures failed, $not_run not run (after $((SECONDS - START)) s)"
[[ $((failures + not_run)) -eq 0 ]] || exit 1
