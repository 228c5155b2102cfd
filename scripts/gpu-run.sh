#!/usr/bin/env bash
# gpu-run.sh: megatrain's GPU checks on a GPU machine, one mode per command, from a bundle made by
# scripts/gpu-bundle.sh (bin/, lib/ beside scripts/) or from a checkout with a CUDA build (build-gpu/ or build/).
# Every mode ends by itself within its budget (at most 540 s by default: a lent machine kills a command at 600 s,
# and then nothing comes back), whatever fails: each step runs under `timeout -k 10` with a cap of at most what
# is left, and $OUT/<mode>-summary.txt lists each step's status, seconds and cap (rewritten after every step, so
# even a kill from outside leaves the steps done; "TIMED OUT" means the step was killed at its cap).
#
# Usage: scripts/gpu-run.sh MODE [args]; on a fresh GPU machine one command each, in this order:
#   first     (470 s) env; test_cuda_ops without per-kernel synchronisation, then only its failing (or unfinished)
#             tests again with MEGATRAIN_CUDA_SYNC=1 (a fault names its kernel); test_cuda_models, test_comm_nccl,
#             test_distributed, test_cuda_allocator; the tiny model on the GPU against the CPU (gpu_train_matches_cpu)
#   e2e       (540 s) every tests/e2e/gpu_*.sh but the layout matrix, each capped by what is left
#   matrix    (540 s) tests/e2e/gpu_layout_matrix.sh: the GPT rows, then the Llama rows, two capped steps;
#             `matrix gpt` or `matrix llama` runs one of them
#   sanitize  (540 s) compute-sanitizer memcheck, then racecheck, over test_cuda_ops (SANITIZE_FILTER: a gtest filter)
#   bench     (540 s) bench/gpu_throughput.sh, megatrain against PyTorch, for ONE model: `bench 1.3b` (the default),
#             `bench 124m`, ...; more arguments go to gpu_throughput.sh. Several models (MODELS="a b") would not fit:
#             warned, and the runs the budget leaves out are reported NOT RUN
#   plan      (540 s) `megatrain bench kernels --device cuda` (rates to $OUT/rates-gpu.yaml), then megatrain alone
#             through bench/gpu_throughput.sh with plan's predicted ms/iter and peak memory beside each row
#             (one model, as bench: `plan 1.3b`)
#   check     (540 s) the GPU unit tests: test_cuda_ops, test_cuda_models, test_comm_nccl, test_distributed,
#             test_cuda_allocator (CHECK_TRAINING=1 adds test_training)
#   env       (120 s) what the machine has: nvidia-smi, nvcc, torch and its nvidia pip folders, the ldd check,
#             `megatrain info`; without a usable GPU it says so and still succeeds. Every mode but exec runs it
#             first; the GPU modes stop there when no GPU can be used (bench with DEVICE=cpu runs on the CPU)
#   exec CMD  (540 s) CMD with the bundle's library path, in the current folder: from the bundle's folder,
#             `scripts/gpu-run.sh exec bin/megatrain info`, `... exec bin/test_cuda_ops --gtest_filter='*Attention*'`
# Env: BUDGET (seconds for the mode; more than 540 is warned about), OUT (each step's output to $OUT/<step>.log,
# and the summary), PYTHON (default python3: the one with torch and the nvidia pip packages), MEGATRAIN (the
# binary, for a checkout), EXTRA_LD_PATH (prepended to the library path, e.g. /tmp/deps/usr/lib/x86_64-linux-gnu),
# GTEST_ARGS (more gtest arguments), CUDA_OPS_CAP (first's cap on test_cuda_ops, 240 s). Exit status: 0 when every
# step passed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CALLER_DIR=$PWD
die() { echo "gpu-run: error: $*" >&2; FATAL=$*; exit 1; }
usage() { sed -n '2,34p' "$0"; }
FATAL=
MODE=${1:-}
if [[ $# -gt 0 ]]; then shift; fi
case $MODE in
  first) DEFAULT_BUDGET=470 ;;
  env) DEFAULT_BUDGET=120 ;;
  e2e|matrix|sanitize|bench|plan|check|exec) DEFAULT_BUDGET=540 ;;
  -h|--help) usage; exit 0 ;;
  "") usage >&2; echo "gpu-run: error: no mode given (first, e2e, matrix, sanitize, bench, plan, check, env or exec)" >&2
      exit 2 ;;
  *) die "unknown mode '$MODE': expected first, e2e, matrix, sanitize, bench, plan, check, env or exec (see --help)" ;;
esac
BUDGET=${BUDGET:-$DEFAULT_BUDGET}
[[ $BUDGET =~ ^[0-9]+$ ]] || die "BUDGET must be a number of seconds, got '$BUDGET'"
if (( BUDGET > 540 )); then
  echo "gpu-run: warning: BUDGET=$BUDGET s: a lent GPU machine kills a command at 600 s and returns nothing" >&2
fi
KILL_GRACE=10   # timeout -k: SIGKILL this long after the SIGTERM at a step's cap
RESERVE=5       # kept at the end for the summary
MIN_STEP=15     # a step that would get less is not started
START=$SECONDS
DEADLINE=$((START + BUDGET))
STARTED_AT=$(date -u '+%Y-%m-%d %H:%M:%S UTC')

# Output folder: OUT (absolute: this script works from the bundle's folder), else a temporary one.
if [[ -n ${OUT:-} ]]; then
  mkdir -p "$OUT" || die "cannot create OUT=$OUT"
  OUT=$(cd "$OUT" && pwd)
  LOGDIR=$OUT
else
  LOGDIR=$(mktemp -d /tmp/gpu-run.XXXXXX)
fi

# ---- The summary: one row per step, rewritten after each, the verdict on exit ------------------------------
R_NAME=() R_STATUS=() R_SECS=() R_CAP=() R_NOTE=()
RUNNING=
FAILED_STEPS=()
summary_text() {  # [verdict]
  local i
  echo "gpu-run.sh $MODE: budget $BUDGET s, started $STARTED_AT on $(hostname), megatrain ${MT:-not found}"
  printf '%-22s %-22s %7s %5s  %s\n' step status seconds cap note
  for i in "${!R_NAME[@]}"; do
    printf '%-22s %-22s %7s %5s  %s\n' "${R_NAME[$i]}" "${R_STATUS[$i]}" "${R_SECS[$i]}" "${R_CAP[$i]}" "${R_NOTE[$i]}"
  done
  if [[ -n $RUNNING ]]; then echo "$RUNNING"; fi
  if [[ -n ${1:-} ]]; then echo "$1"; fi
}
write_summary() {  # [verdict]
  [[ -n ${OUT:-} ]] || return 0
  summary_text "$@" >"$OUT/$MODE-summary.txt.tmp" && mv -f "$OUT/$MODE-summary.txt.tmp" "$OUT/$MODE-summary.txt"
}
record() {  # name status seconds cap note
  R_NAME+=("$1") R_STATUS+=("$2") R_SECS+=("$3") R_CAP+=("$4") R_NOTE+=("$5")
  RUNNING=
  write_summary
}
note_last() { R_NOTE[${#R_NOTE[@]} - 1]=$1; write_summary; }
finish() {
  local rc=$? verdict
  RUNNING=
  if [[ -n $FATAL ]]; then
    verdict="result: FAILED after $((SECONDS - START)) s: $FATAL"
  elif [[ $rc -eq 0 ]]; then
    verdict="result: ok after $((SECONDS - START)) s of $BUDGET"
  else
    verdict="result: FAILED after $((SECONDS - START)) s of $BUDGET${FAILED_STEPS[*]:+ (failed: ${FAILED_STEPS[*]})}"
  fi
  write_summary "$verdict"
  if [[ $MODE != exec ]]; then echo; summary_text "$verdict"; fi
  if [[ -n ${OUT:-} ]]; then echo "gpu-run: logs and $MODE-summary.txt in $OUT"; else rm -rf "$LOGDIR"; fi
}
trap finish EXIT
write_summary

# ---- Where the binaries are: the bundle's bin/, else a build folder of the checkout ------------------------
if [[ -n ${MEGATRAIN:-} ]]; then
  [[ -x $MEGATRAIN && -f $MEGATRAIN ]] || die "MEGATRAIN=$MEGATRAIN is not an executable file"
  MT=$(realpath "$MEGATRAIN"); BIN=$(dirname "$MT"); TESTS=$BIN/tests
elif [[ -x $ROOT/bin/megatrain ]]; then
  MT=$ROOT/bin/megatrain; BIN=$ROOT/bin; TESTS=$ROOT/bin
else
  MT=
  for d in build-gpu build; do
    if [[ -x $ROOT/$d/megatrain ]]; then MT=$ROOT/$d/megatrain; BIN=$ROOT/$d; TESTS=$ROOT/$d/tests; break; fi
  done
  [[ -n $MT ]] || die "no megatrain binary under $ROOT: no bin/megatrain (this is not a bundle) and no CUDA build in" \
    "build-gpu/ or build/. Make a bundle on the build machine (scripts/gpu-bundle.sh, then copy gpu-bundle/ here" \
    "and run gpu-bundle/scripts/gpu-run.sh), build here (cmake -B build-gpu -DMEGATRAIN_CUDA=ON ...), or set" \
    "MEGATRAIN=/path/to/megatrain"
fi
test_binary() {  # the path of a gtest executable, or nothing
  local f
  for f in "$TESTS/$1" "$BIN/$1"; do [[ -x $f && -f $f ]] && { echo "$f"; return; }; done
  return 0
}
cd "$ROOT"

# The python3 with torch and the nvidia pip packages (on the lent GPU machines: python3, /opt/torch/.venv).
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  if ! timeout 30 python3 -c 'import torch' >/dev/null 2>&1; then
    for p in /opt/torch/.venv/bin/python3 /opt/venv/bin/python3 "$HOME/.venv/bin/python3"; do
      if [[ -x $p ]] && timeout 30 "$p" -c 'import torch' >/dev/null 2>&1; then PYTHON=$p; break; fi
    done
  fi
fi

# ---- The library path ---------------------------------------------------------------------------------------
nvidia_lib_dirs() {  # every site-packages/nvidia/*/lib (and lib64) of $PYTHON, one per line
  timeout 30 "$PYTHON" - 2>/dev/null <<'PY' || true
import glob, os, site, sys
roots = []
try:
    import nvidia  # a namespace package: one folder per site-packages that has nvidia packages
    roots += list(nvidia.__path__)
except Exception:
    pass
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    roots.append(os.path.join(sp, "nvidia"))
seen = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "*", "lib")) + glob.glob(os.path.join(r, "*", "lib64"))):
        d = os.path.realpath(d)
        if os.path.isdir(d) and d not in seen:
            seen.append(d)
print("\n".join(seen))
PY
}

LIBDIRS=()
if [[ -n ${EXTRA_LD_PATH:-} ]]; then LIBDIRS+=("$EXTRA_LD_PATH"); fi
if [[ -d $ROOT/lib ]]; then LIBDIRS+=("$ROOT/lib"); fi
# The bundle's libstdc++ / libgcc_s (lib/gcc) need the glibc they were built against; on an older glibc the
# system's own are used (GCC 12 binaries need GLIBCXX_3.4.30, which Ubuntu 22.04's libstdc++ has).
GCC_NOTE="no bundled libstdc++"
if [[ -d $ROOT/lib/gcc ]]; then
  need=$(cat "$ROOT/lib/gcc/GLIBC_NEEDED" 2>/dev/null || echo 0)
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  if [[ -n $have && $(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1) == "$need" ]]; then
    LIBDIRS+=("$ROOT/lib/gcc"); GCC_NOTE="the bundled libstdc++ (glibc $have >= $need)"
  else
    GCC_NOTE="the system's libstdc++ (glibc ${have:-unknown} is older than the $need the bundled one needs)"
  fi
fi
mapfile -t NV_DIRS < <(nvidia_lib_dirs | sed "/^$/d")
LIBDIRS+=("${NV_DIRS[@]}")
# A local toolkit and the driver's folder last, for what the pip packages and ldconfig lack.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  if [[ -d $d ]]; then LIBDIRS+=("$d"); fi
done
# Python (torch) keeps the path it came with: the bundle's libstdc++ may be older than the one torch needs.
export MT_ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
LD_LIBRARY_PATH=$(IFS=:; echo "${LIBDIRS[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH PYTHON
py() { LD_LIBRARY_PATH=$MT_ORIG_LD_LIBRARY_PATH "$PYTHON" "$@"; }

# What the machine has (runs as a capped child: bash -c show_env with these functions and variables exported).
show_env() {
  echo "== machine: $(hostname), $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc) cores, $(ldd --version | head -1)"
  echo "== megatrain: $MT"
  echo "== nvidia-smi"
  nvidia-smi || echo "(nvidia-smi failed or is missing)"
  echo "== nvcc --version"
  if command -v nvcc >/dev/null; then nvcc --version; elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
    /usr/local/cuda/bin/nvcc --version; else echo "(no nvcc)"; fi
  echo "== $PYTHON: torch and the nvidia pip packages"
  py -c 'import torch, nvidia, os; print(torch.__version__, os.path.dirname(nvidia.__path__[0]))' ||
    echo "(failed: set PYTHON to the python3 that has torch)"
  py -c 'import torch; print("cuda", torch.version.cuda, "available", torch.cuda.is_available(),
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>/dev/null || true
  echo "== nvidia library folders (from $PYTHON)"
  if [[ -z $NV_DIRS_LIST ]]; then echo "(none found: libcudart, libcublasLt and libnccl must come from elsewhere)"; fi
  local d
  while read -r d; do
    [[ -n $d ]] && echo "$d: $(find "$d" -maxdepth 1 -name '*.so*' -printf '%f\n' | sort | tr '\n' ' ')"
  done <<<"$NV_DIRS_LIST"
  echo "== LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "== using $GCC_NOTE"
  echo "== ldd $MT"
  ldd "$MT"
  local missing=() f files=("$MT" "$BIN"/test_*)
  [[ $TESTS == "$BIN" ]] || files+=("$TESTS"/test_*)
  for f in "${files[@]}"; do
    [[ -x $f && -f $f ]] || continue
    mapfile -t -O "${#missing[@]}" missing < <(ldd "$f" | grep 'not found' | sed "s|^[[:space:]]*|$(basename "$f"): |")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "== missing libraries:"
    printf '  %s\n' "${missing[@]}"
    echo "gpu-run: error: libraries not found (install or point PYTHON at the python with the nvidia pip" \
         "packages, or set EXTRA_LD_PATH)" >&2
    return 1
  fi
  echo "== no missing libraries"
  "$MT" --version || { echo "gpu-run: error: $MT --version failed" >&2; return 1; }
  echo "== megatrain info"
  local info
  info=$("$MT" info) || { echo "$info"; echo "gpu-run: error: $MT info failed" >&2; return 1; }
  echo "$info"
  # cuBLASLt is loaded at the first GEMM (core/cuda/cublaslt_api.h), so ldd above does not list it.
  grep -q '^cublaslt: libcublasLt' <<<"$info" ||
    { echo "gpu-run: error: megatrain cannot load cuBLASLt (its cublaslt line above says why)" >&2; return 1; }
}
NV_DIRS_LIST=$(printf '%s\n' "${NV_DIRS[@]}")
export MT BIN TESTS GCC_NOTE NV_DIRS_LIST
export -f show_env py

# ---- Steps: each a child under timeout, capped by the budget -----------------------------------------------
# The cap of a step that may take MAX seconds and must leave KEEP seconds to the steps after it: MAX, or what is
# left of the budget after RESERVE, the kill grace and KEEP, whichever is smaller.
step_cap() {  # max keep
  local left=$((DEADLINE - SECONDS - RESERVE - KILL_GRACE - $2))
  echo $(($1 < left ? $1 : left))
}
# run_step NAME MAX KEEP CMD...: CMD under `timeout -k KILL_GRACE CAP` (CAP from step_cap), its output on stdout
# and in $LOGDIR/NAME.log, one summary row. Sets STEP_RC (CMD's status; 125 when not started) and STEP_LOG;
# returns 0 so that the mode goes on: the caller reads STEP_RC.
STEP_RC=0 STEP_LOG=
run_step() {
  local name=$1 cap t0 secs status
  cap=$(step_cap "$2" "$3")
  shift 3
  STEP_LOG=$LOGDIR/$name.log
  : >"$STEP_LOG"
  if ((cap < MIN_STEP)); then
    echo "==== $name: NOT RUN (the budget leaves it ${cap} s)"
    STEP_RC=125
    FAILED_STEPS+=("$name")
    record "$name" "NOT RUN (budget spent)" 0 "$((cap > 0 ? cap : 0))" ""
    return 0
  fi
  RUNNING="running: $name since +$((SECONDS - START)) s, cap $cap s (killed from outside if this line stays)"
  write_summary
  echo "==== $name (cap $cap s): $*"
  t0=$SECONDS
  set +e
  timeout -k "$KILL_GRACE" "$cap" "$@" 2>&1 | tee "$STEP_LOG"
  STEP_RC=${PIPESTATUS[0]}
  set -e
  secs=$((SECONDS - t0))
  case $STEP_RC in
    0) status=ok ;;
    124|137) if ((secs >= cap)); then status="TIMED OUT"; else status="FAILED (exit $STEP_RC)"; fi ;;
    77) status="SKIPPED (exit 77)" ;;
    *) status="FAILED (exit $STEP_RC)" ;;
  esac
  [[ $STEP_RC -eq 0 ]] || FAILED_STEPS+=("$name")
  echo "==== $name: $status after $secs s (cap $cap s)"
  record "$name" "$status" "$secs" "$cap" ""
}

# A gtest run's outcome from its log (without --gtest_brief: "[ RUN ]" before each test names one that crashed or
# hung): prints "passed failed skipped unfinished" counts, then the failed test names (one line, ':'-joined),
# the unfinished one, and the passed ones (':'-joined).
gtest_outcome() {  # log
  awk '$1 == "[" && $3 == "]" && NF >= 4 {
         name = $4; sub(/,$/, "", name)
         if (name ~ /^[0-9]+$/) next                       # "[  FAILED  ] 2 tests, listed below:"
         if ($2 == "RUN") { cur = name; next }
         if ($2 == "OK") ok[name] = 1; else if ($2 == "FAILED") bad[name] = 1; else if ($2 == "SKIPPED") skip[name] = 1
         else next
         if (name == cur) cur = ""
       }
       END {
         no = nb = ns = 0; b = p = ""
         for (n in ok) { no++; p = p (p == "" ? "" : ":") n }
         for (n in bad) { nb++; b = b (b == "" ? "" : ":") n }
         for (n in skip) ns++
         print no, nb, ns, (cur == "" ? 0 : 1); print b; print cur; print p
       }' "$1"
}

# run_gtest NAME MAX KEEP TEST [ARGS...]: the gtest executable TEST (bin/, or the build's tests/) as a step, run as
# `env GT_ENV... GT_WRAP... TEST ARGS... GTEST_ARGS`, with its counts as the summary note. Sets GT_FAILED (the
# failed tests, ':'-joined), GT_UNFINISHED (a test that crashed or hung), GT_PASSED and GT_COMPLETE (1 when gtest
# reached its end). A run in which every test skipped fails: these modes run where a GPU is expected.
GT_ENV=() GT_WRAP=()
GT_FAILED='' GT_PASSED='' GT_UNFINISHED='' GT_COMPLETE=0
run_gtest() {
  local name=$1 max=$2 keep=$3 bin counts note
  bin=$(test_binary "$4")
  shift 4
  GT_FAILED='' GT_PASSED='' GT_UNFINISHED='' GT_COMPLETE=0
  if [[ -z $bin ]]; then
    STEP_RC=1; FAILED_STEPS+=("$name"); record "$name" MISSING 0 - "not built or not bundled"; return 0
  fi
  # shellcheck disable=SC2086
  run_step "$name" "$max" "$keep" env "${GT_ENV[@]}" "${GT_WRAP[@]}" "$bin" "$@" ${GTEST_ARGS:-}
  [[ $STEP_RC -ne 125 ]] || return 0
  { read -r -a counts; read -r GT_FAILED; read -r GT_UNFINISHED; read -r GT_PASSED; } < <(gtest_outcome "$STEP_LOG")
  if grep -q '^\[==========\] [0-9]* tests\? from .* ran\.' "$STEP_LOG"; then GT_COMPLETE=1; fi
  note="${counts[0]} passed, ${counts[1]} failed, ${counts[2]} skipped"
  [[ -z $GT_FAILED ]] || note+=" (failed: ${GT_FAILED//:/ })"
  [[ -z $GT_UNFINISHED ]] || note+="; $GT_UNFINISHED did not finish"
  [[ $GT_COMPLETE == 1 || -n $GT_UNFINISHED ]] || note+="; gtest did not reach its end"
  if [[ $STEP_RC -eq 0 && ( -n $GT_FAILED || -n $GT_UNFINISHED || $GT_COMPLETE == 0 ) ]]; then
    echo "==== $name: exit 0, but not every test ran to its end: FAILED"
    R_STATUS[${#R_STATUS[@]} - 1]="FAILED (incomplete)"; FAILED_STEPS+=("$name"); STEP_RC=1
  elif [[ $STEP_RC -eq 0 && ${counts[0]} -eq 0 && ${counts[2]} -gt 0 ]]; then
    echo "==== $name: every test skipped: FAILED (a GPU is expected here)"
    R_STATUS[${#R_STATUS[@]} - 1]="FAILED (all skipped)"; FAILED_STEPS+=("$name"); STEP_RC=1
  fi
  note_last "$note"
}

# tests/e2e/SCRIPT.sh with this megatrain as the step NAME: run_e2e SCRIPT NAME MAX KEEP [VAR=value...]
run_e2e() { run_step "$2" "$3" "$4" env "${@:5}" bash "tests/e2e/$1.sh" "$MT" "$ROOT"; }

# ---- Modes ------------------------------------------------------------------------------------------------
GPU_TESTS=(test_cuda_ops test_cuda_models test_comm_nccl test_distributed test_cuda_allocator)
CUDA_OPS_CAP=${CUDA_OPS_CAP:-240}   # ~56 cuDNN graphs are built, each up to seconds on Hopper

# Caps (MAX) in seconds, and KEEP: what the later steps keep back, 20 s for each small unit test (test_cuda_models
# among them: an optimizer step and two microbatches of a 2-layer model) and 120 s for the tiny model against the
# CPU (its 8 CPU runs take ~5 s here, its 13 GPU runs each a CUDA start and a few cuDNN graphs). The synchronised
# rerun is diagnosis: it gets only what the others leave.
mode_first() {
  GT_ENV=(-u MEGATRAIN_CUDA_SYNC)
  run_gtest test_cuda_ops "$CUDA_OPS_CAP" 200 test_cuda_ops
  GT_ENV=()
  # Again with a synchronisation after every kernel, so that an asynchronous fault names its kernel: the failed
  # tests of a complete run, or every test that did not pass when it crashed or was killed at its cap.
  if [[ -n $GT_FAILED || -n $GT_UNFINISHED || ($STEP_RC -ne 0 && $GT_COMPLETE == 0 && $STEP_RC -ne 125) ]] &&
     [[ -n $(test_binary test_cuda_ops) ]]; then
    local filter=$GT_FAILED
    if [[ $GT_COMPLETE == 0 || -n $GT_UNFINISHED ]]; then filter=${GT_PASSED:+-$GT_PASSED}; filter=${filter:-*}; fi
    GT_ENV=(MEGATRAIN_CUDA_SYNC=1)
    run_gtest test_cuda_ops_sync 90 200 test_cuda_ops "--gtest_filter=$filter"
    GT_ENV=()
  fi
  run_gtest test_cuda_models 45 180 test_cuda_models
  run_gtest test_comm_nccl 45 160 test_comm_nccl
  run_gtest test_distributed 60 140 test_distributed
  run_gtest test_cuda_allocator 45 120 test_cuda_allocator
  run_e2e gpu_train_matches_cpu gpu_train_matches_cpu "$BUDGET" 0
}

mode_check() {
  local tests=("${GPU_TESTS[@]}") i keep
  local -A caps=([test_cuda_ops]=300 [test_cuda_models]=60 [test_comm_nccl]=60 [test_distributed]=90
                 [test_cuda_allocator]=60 [test_training]=240)
  if [[ ${CHECK_TRAINING:-0} == 1 ]]; then tests+=(test_training); fi
  for i in "${!tests[@]}"; do
    keep=$(( (${#tests[@]} - 1 - i) * 40 ))
    run_gtest "${tests[$i]}" "${caps[${tests[$i]}]}" "$keep" "${tests[$i]}"
  done
}

mode_e2e() {
  local scripts=() s i
  for s in tests/e2e/gpu_*.sh; do
    [[ -f $s && $s != tests/e2e/gpu_layout_matrix.sh ]] && scripts+=("$(basename "$s" .sh)")
  done
  [[ ${#scripts[@]} -gt 0 ]] || die "no tests/e2e/gpu_*.sh besides the layout matrix under $ROOT"
  for i in "${!scripts[@]}"; do
    run_e2e "${scripts[$i]}" "${scripts[$i]}" "$BUDGET" $(( (${#scripts[@]} - 1 - i) * 60 ))
  done
}

# The layout matrix in two parts, the GPT rows (twice the runs) and the Llama rows, each its own capped step.
mode_matrix() {
  case ${1:-all} in
    all) run_e2e gpu_layout_matrix matrix_gpt "$BUDGET" 190 MATRIX_PART=gpt
         run_e2e gpu_layout_matrix matrix_llama "$BUDGET" 0 MATRIX_PART=llama ;;
    *) run_e2e gpu_layout_matrix "matrix_$1" "$BUDGET" 0 "MATRIX_PART=$1" ;;
  esac
}

# compute-sanitizer's memcheck, then racecheck, over the CUDA op tests; the note counts the tests each finished.
mode_sanitize() {
  local cs
  cs=$(command -v compute-sanitizer || true)
  [[ -n $cs ]] || cs=/usr/local/cuda/bin/compute-sanitizer
  [[ -x $cs ]] || die "no compute-sanitizer (not on PATH, not in /usr/local/cuda/bin)"
  GT_WRAP=("$cs" --tool memcheck --error-exitcode 9)
  run_gtest memcheck "$BUDGET" 200 test_cuda_ops "--gtest_filter=${SANITIZE_FILTER:-*}"
  GT_WRAP=("$cs" --tool racecheck --error-exitcode 9)
  run_gtest racecheck "$BUDGET" 0 test_cuda_ops "--gtest_filter=${SANITIZE_FILTER:-*}"
  GT_WRAP=()
}

# bench/gpu_throughput.sh as one step; it gets the step's cap as its own BUDGET (less a margin to print its
# table), so that it caps each run by what is left and reports the runs it had no time for.
throughput_step() {  # name models args...
  local name=$1 models=$2 cap
  shift 2
  cap=$(step_cap "$BUDGET" 0)
  run_step "$name" "$cap" 0 env "MODELS=$models" "BUDGET=$((cap - 5))" ${OUT:+"OUT=$OUT"} \
    bash bench/gpu_throughput.sh --megatrain "$MT" "$@"
  [[ $STEP_RC -eq 125 ]] || note_last "$(grep '^gpu_throughput: runs:' "$STEP_LOG" | tail -1 | cut -d' ' -f2-)"
}
# The MODELS of bench and plan: the first argument unless it is an option, else MODELS, else 1.3b. Sets
# BENCH_MODELS and BENCH_SHIFT (1 when the first argument was taken).
bench_models() {
  BENCH_MODELS=${MODELS:-1.3b} BENCH_SHIFT=0
  if [[ $# -gt 0 && $1 != -* ]]; then BENCH_MODELS=$1 BENCH_SHIFT=1; fi
  if [[ $(wc -w <<<"$BENCH_MODELS") -gt 1 && $DEVICE_KIND == cuda ]]; then
    echo "gpu-run: warning: $MODE of several models ($BENCH_MODELS) does not fit one command: the runs the" \
         "$BUDGET s budget leaves out are reported NOT RUN. One model per command: gpu-run.sh $MODE 124m, ..." >&2
  fi
}

mode_bench() {
  bench_models "$@"
  shift "$BENCH_SHIFT"
  throughput_step bench "$BENCH_MODELS" "$@"
}

mode_plan() {
  local rates=$LOGDIR/rates-gpu.yaml name gpu
  bench_models "$@"
  shift "$BENCH_SHIFT"
  run_step bench_kernels 150 240 "$MT" bench kernels --device cuda -o "$rates"
  [[ $STEP_RC -eq 0 ]] || return 0
  name=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
  case $name in *H200*) gpu=h200-141gb ;; *A100*) gpu=a100-80gb ;; *) gpu=h100-80gb ;; esac
  echo "== plan: $name, built-in table $gpu, measured rates $rates"
  PLAN_GPU=$gpu PLAN_RATES=$rates throughput_step plan "$BENCH_MODELS" --no-torch "$@"
}

# ---- Run the mode -------------------------------------------------------------------------------------------
if [[ $MODE == matrix && ! ${1:-all} =~ ^(all|gpt|llama)$ ]]; then die "matrix takes gpt or llama (or nothing: both), got '$1'"; fi
DEVICE_KIND=cuda
if [[ $MODE == bench && ( ${DEVICE:-} == cpu || " $* " == *" --device cpu "* ) ]]; then DEVICE_KIND=cpu; fi
if [[ $MODE == exec ]]; then
  [[ $# -gt 0 ]] || die "exec needs a command, e.g. gpu-run.sh exec bin/megatrain info"
  cd "$CALLER_DIR"
  run_step exec "$BUDGET" 0 "$@"
  exit "$STEP_RC"
fi

env_cap=60
if [[ $MODE == env ]]; then env_cap=90; fi
run_step env "$env_cap" 0 bash -c show_env
[[ $STEP_RC -eq 0 ]] || die "the environment check failed (step env: ${R_STATUS[0]}; see $LOGDIR/env.log)"
t0=$SECONDS
if gpu_info=$(timeout -k 5 30 "$MT" info --require-gpu 2>&1); then has_gpu=1; else has_gpu=0; fi
gpu_desc=$(grep -E '^(gpus|gpu 0):' <<<"$gpu_info" | tr '\n' ' ' | sed 's/ $//' || true)
gpu_desc=${gpu_desc:-$(tail -1 <<<"$gpu_info")}
if [[ $has_gpu == 1 ]]; then
  record gpu ok $((SECONDS - t0)) - "$gpu_desc"
elif [[ $MODE == env || $DEVICE_KIND == cpu ]]; then
  record gpu "none" $((SECONDS - t0)) - "no usable GPU: $gpu_desc (not needed by $MODE${DEVICE:+ DEVICE=$DEVICE})"
  echo "== no usable GPU here: $gpu_desc"
else
  record gpu "NONE" $((SECONDS - t0)) - "$gpu_desc"
  die "no usable GPU ($gpu_desc): the $MODE checks would only skip"
fi

case $MODE in
  env) ;;
  first) mode_first ;;
  check) mode_check ;;
  e2e) mode_e2e ;;
  matrix) mode_matrix "$@" ;;
  sanitize) mode_sanitize ;;
  bench) mode_bench "$@" ;;
  plan) mode_plan "$@" ;;
esac
[[ ${#FAILED_STEPS[@]} -eq 0 ]]
