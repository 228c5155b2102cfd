#!/usr/bin/env bash
# gpu-run.sh: runs megatrain's GPU checks on a GPU machine, from a bundle made by scripts/gpu-bundle.sh
# (bin/, lib/ beside scripts/) or from a source checkout with a CUDA build (build-gpu/ or build/).
#
# Usage: scripts/gpu-run.sh [first|env|check|e2e|sanitize|bench|all] [args for bench/gpu_throughput.sh ...]
#   first    the first command on a fresh GPU machine, under 8 minutes (FIRST_BUDGET seconds, default 420):
#            env, every GPU unit test (check), then the tiny model on the GPU against the CPU
#            (tests/e2e/gpu_train_matches_cpu.sh), each bounded by what is left of the budget; with
#            MEGATRAIN_CUDA_SYNC=1 (default here: a fault names its kernel; FIRST_SYNC=0 turns it off)
#   env      only what the machine has: nvidia-smi, nvcc, torch and its nvidia pip folders, the ldd check
#   check    the GPU unit tests: test_cuda_ops, test_comm_nccl, test_distributed, test_cuda_allocator, each bounded
#            by CHECK_TIMEOUT seconds (default 300); CHECK_TRAINING=1 adds test_training
#   e2e      every tests/e2e/gpu_*.sh with this megatrain (exit 77 = skipped), each bounded by E2E_TIMEOUT
#   sanitize compute-sanitizer memcheck and racecheck over test_cuda_ops (SANITIZE_FILTER: a gtest filter)
#   bench    bench/gpu_throughput.sh (megatrain vs PyTorch); see that script for MODELS, SEQS, ITERS, ...;
#            one model per command keeps it inside the machine's 10 minutes (MODELS=124m, then 350m, ...)
#   plan     issue 16's GPU check: `megatrain bench kernels --device cuda` (rates to $OUT/rates-gpu.yaml or the
#            work folder), then megatrain alone through bench/gpu_throughput.sh (MODELS, SEQS as for bench) with
#            plan's predicted ms/iter and peak memory beside each measured row, from the built-in table of this
#            GPU and from the measured rates
#   all      check, e2e and bench in order (default); goes on after a failing step, fails at the end
# Every step's output also goes to $OUT/<step>.log when OUT is set (the device tool's output folder).
# Env: PYTHON (default python3: the one with torch and the nvidia pip packages), MEGATRAIN (the binary, for a
# checkout), EXTRA_LD_PATH (prepended to the library path, e.g. /tmp/deps/usr/lib/x86_64-linux-gnu),
# GTEST_ARGS (more gtest arguments), OUT (each step's output also goes to $OUT/<step>.log).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STEP=${1:-all}
if [[ $# -gt 0 ]]; then shift; fi
# The python3 with torch and the nvidia pip packages (on the lent GPU machines: python3, /opt/torch/.venv).
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  if ! python3 -c 'import torch' >/dev/null 2>&1; then
    for p in /opt/torch/.venv/bin/python3 /opt/venv/bin/python3 "$HOME/.venv/bin/python3"; do
      if [[ -x $p ]] && "$p" -c 'import torch' >/dev/null 2>&1; then PYTHON=$p; break; fi
    done
  fi
fi

die() { echo "gpu-run: error: $*" >&2; exit 1; }
case $STEP in first|env|check|e2e|sanitize|bench|plan|all) ;; -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
  *) die "unknown step '$STEP': expected first, env, check, e2e, sanitize, bench, plan or all" ;; esac

# Where the binaries are: the bundle's bin/, else a build folder of the checkout.
if [[ -n ${MEGATRAIN:-} ]]; then
  MT=$(realpath "$MEGATRAIN"); BIN=$(dirname "$MT"); TESTS=$BIN/tests
elif [[ -x bin/megatrain ]]; then
  MT=$ROOT/bin/megatrain; BIN=$ROOT/bin; TESTS=$ROOT/bin
else
  MT=
  for d in build-gpu build; do
    if [[ -x $d/megatrain ]]; then MT=$ROOT/$d/megatrain; BIN=$ROOT/$d; TESTS=$ROOT/$d/tests; break; fi
  done
  [[ -n $MT ]] || die "no megatrain here: expected bin/megatrain (a bundle) or build-gpu/megatrain (set MEGATRAIN)"
fi
[[ -x $MT ]] || die "$MT is not an executable"
test_binary() {  # the path of a gtest executable, or nothing
  local f
  for f in "$TESTS/$1" "$BIN/$1"; do [[ -x $f ]] && { echo "$f"; return; }; done
  return 0
}

# Runs "$@" with its output on stdout and, when OUT is set, also appended to $OUT/$name.log.
# Returns the command's status (called in `||` context, so errexit does not apply inside).
logged() {
  local name=$1; shift
  if [[ -n ${OUT:-} ]]; then
    mkdir -p "$OUT"
    "$@" 2>&1 | tee -a "$OUT/$name.log"
    return "${PIPESTATUS[0]}"
  fi
  "$@"
}

# ---- What is there, and the library path ----------------------------------------------------------------
nvidia_lib_dirs() {  # every site-packages/nvidia/*/lib (and lib64) of $PYTHON, one per line
  "$PYTHON" - 2>/dev/null <<'PY' || true
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
mapfile -t NV_DIRS < <(nvidia_lib_dirs)
LIBDIRS+=("${NV_DIRS[@]}")
# A local toolkit and the driver's folder last, for what the pip packages and ldconfig lack.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  if [[ -d $d ]]; then LIBDIRS+=("$d"); fi
done
# Python (torch) keeps the path it came with: the bundle's libstdc++ may be older than the one torch needs.
export MT_ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
LD_LIBRARY_PATH=$(IFS=:; echo "${LIBDIRS[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
py() { LD_LIBRARY_PATH=$MT_ORIG_LD_LIBRARY_PATH "$PYTHON" "$@"; }

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
  if [[ ${#NV_DIRS[@]} -eq 0 ]]; then echo "(none found: libcudart, libcublasLt and libnccl must come from elsewhere)"; fi
  local d
  for d in "${NV_DIRS[@]}"; do echo "$d: $(find "$d" -maxdepth 1 -name '*.so*' -printf '%f\n' | sort | tr '\n' ' ')"; done
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
  "$MT" --version
}

# ---- Steps -----------------------------------------------------------------------------------------------
GPU_TESTS=(test_cuda_ops test_comm_nccl test_distributed test_cuda_allocator)
run_check() {
  local tests=("${GPU_TESTS[@]}") t f rc=0 r
  if [[ ${CHECK_TRAINING:-0} == 1 ]]; then tests+=(test_training); fi
  for t in "${tests[@]}"; do
    f=$(test_binary "$t")
    if [[ -z $f ]]; then echo "== $t: MISSING (not built or not bundled)"; rc=1; continue; fi
    echo "== $t"
    r=0
    # shellcheck disable=SC2086
    timeout "${CHECK_TIMEOUT:-300}" "$f" --gtest_brief=1 ${GTEST_ARGS:-} || r=$?
    case $r in
      0) echo "== $t: passed" ;;
      124) echo "== $t: FAILED (timed out after ${CHECK_TIMEOUT:-300} s)"; rc=1 ;;
      *) echo "== $t: FAILED (exit $r)"; rc=1 ;;
    esac
  done
  return "$rc"
}

# compute-sanitizer's memcheck and racecheck over the CUDA op tests (slow: one tool at a time).
run_sanitize() {
  local cs f rc=0 tool
  cs=$(command -v compute-sanitizer || true)
  [[ -n $cs ]] || cs=/usr/local/cuda/bin/compute-sanitizer
  [[ -x $cs ]] || { echo "== no compute-sanitizer (not on PATH, not in /usr/local/cuda/bin)"; return 1; }
  f=$(test_binary test_cuda_ops)
  [[ -n $f ]] || { echo "== test_cuda_ops: MISSING"; return 1; }
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool test_cuda_ops"
    if timeout "${SANITIZE_TIMEOUT:-280}" "$cs" --tool "$tool" --error-exitcode 9 "$f" --gtest_brief=1 \
        "--gtest_filter=${SANITIZE_FILTER:-*}"; then
      echo "== $tool: clean"
    else
      echo "== $tool: FAILED or timed out"; rc=1
    fi
  done
  return "$rc"
}

# The first command on a fresh machine: every GPU unit test, then the tiny model against the CPU, inside the
# budget (the machine runs one command at most 10 minutes; env has run already).
run_first() {
  local start=$SECONDS budget=${FIRST_BUDGET:-420} left r rc=0
  if [[ ${FIRST_SYNC:-1} == 1 ]]; then export MEGATRAIN_CUDA_SYNC=1; fi
  echo "== first: budget ${budget} s, MEGATRAIN_CUDA_SYNC=${MEGATRAIN_CUDA_SYNC:-0}"
  CHECK_TIMEOUT=$(( (budget - 60) / ${#GPU_TESTS[@]} )) run_check || rc=1
  left=$(( budget - (SECONDS - start) ))
  if (( left < 30 )); then echo "== first: no time left for the tiny model on the GPU"; return 1; fi
  echo "== e2e gpu_train_matches_cpu (up to ${left} s)"
  r=0
  timeout "$left" bash tests/e2e/gpu_train_matches_cpu.sh "$MT" "$ROOT" || r=$?
  case $r in
    0) echo "== e2e gpu_train_matches_cpu: passed" ;;
    77) echo "== e2e gpu_train_matches_cpu: SKIPPED (no GPU?)"; rc=1 ;;
    124) echo "== e2e gpu_train_matches_cpu: FAILED (timed out after ${left} s)"; rc=1 ;;
    *) echo "== e2e gpu_train_matches_cpu: FAILED (exit $r)"; rc=1 ;;
  esac
  echo "== first: $(( SECONDS - start )) s"
  return "$rc"
}

run_e2e() {
  local s name rc=0 r passed=0 failed=0 skipped=0
  shopt -s nullglob
  local scripts=(tests/e2e/gpu_*.sh)
  shopt -u nullglob
  if [[ ${#scripts[@]} -eq 0 ]]; then echo "== no tests/e2e/gpu_*.sh scripts"; return 0; fi
  for s in "${scripts[@]}"; do
    name=$(basename "$s" .sh)
    echo "== e2e $name"
    r=0
    timeout "${E2E_TIMEOUT:-900}" bash "$s" "$MT" "$ROOT" || r=$?
    case $r in
      0) echo "== e2e $name: passed"; passed=$((passed + 1)) ;;
      77) echo "== e2e $name: skipped"; skipped=$((skipped + 1)) ;;
      124) echo "== e2e $name: FAILED (timed out after ${E2E_TIMEOUT:-900} s)"; failed=$((failed + 1)); rc=1 ;;
      *) echo "== e2e $name: FAILED (exit $r)"; failed=$((failed + 1)); rc=1 ;;
    esac
  done
  echo "== e2e: $passed passed, $failed failed, $skipped skipped"
  return "$rc"
}

run_bench() { PYTHON=$PYTHON bash bench/gpu_throughput.sh --megatrain "$MT" "$@"; }

run_plan() {
  local rates=${OUT:-$ROOT}/rates-gpu.yaml name gpu
  "$MT" bench kernels --device cuda -o "$rates" || return 1
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
  case $name in *H200*) gpu=h200-141gb ;; *A100*) gpu=a100-80gb ;; *) gpu=h100-80gb ;; esac
  echo "== plan: $name, built-in table $gpu, measured rates $rates"
  PLAN_GPU=$gpu PLAN_RATES=$rates PYTHON=$PYTHON bash bench/gpu_throughput.sh --megatrain "$MT" --no-torch "$@"
}

logged env show_env || die "the environment check failed (see above)"
status=0
failed=()
step() {  # name function args...
  local name=$1; shift
  echo "==== $name"
  if logged "$name" "$@"; then echo "==== $name: ok"; else echo "==== $name: FAILED"; failed+=("$name"); status=1; fi
}
case $STEP in
  env) ;;
  first) step first run_first ;;
  check) step check run_check ;;
  sanitize) step sanitize run_sanitize ;;
  e2e) step e2e run_e2e ;;
  bench) step bench run_bench "$@" ;;
  plan) step plan run_plan "$@" ;;
  all) step check run_check; step e2e run_e2e; step bench run_bench "$@" ;;
esac
[[ $status -eq 0 ]] || echo "gpu-run: failed steps: ${failed[*]}" >&2
exit $status
