#!/usr/bin/env bash
# The unit tests again, built with AddressSanitizer + UndefinedBehaviorSanitizer (MEGATRAIN_SANITIZE=ON, CPU
# backend) in SANITIZE_BUILD_DIR, which scripts/test.sh builds before running ctest. Any sanitizer report fails
# the test (UBSan does not recover; ASan halts on the first error). Skips (77) when that build is absent.
#   unit_tests.sh SANITIZE_BUILD_DIR
set -uo pipefail
dir=${1:?usage: unit_tests.sh SANITIZE_BUILD_DIR}
if [ ! -f "$dir/CTestTestfile.cmake" ]; then
  echo "SKIP: no sanitizer build in $dir (scripts/test.sh builds it; or: cmake -S . -B $dir -DMEGATRAIN_SANITIZE=ON" \
       "-DMEGATRAIN_CUDA=OFF && cmake --build $dir)"
  exit 77
fi
# Leaks are not checked: Gloo's and OpenBLAS's process-lifetime allocations would drown the report.
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OPENBLAS_NUM_THREADS=1
cd "$dir" || exit 1
# PlanMegatronTable.Search* searches every layout of each published row (about a minute in the release build,
# over the ctest timeout under the sanitizers); the same planner code runs under them in every other plan test.
# ZbV.KeepsItsMemoryBoundAtAnyCosts and ZbV.StaysAheadOfZbH1WhenTimedWithItsCosts search ZB-V's lists for many shapes
# (3.6 s in the release build, several times that under the sanitizers); the same search runs under them in the other
# ZbV tests.
ctest --output-on-failure -j "$(nproc)" \
  -E '^(e2e|style|sanitize)\.|^PlanMegatronTable\.Search|^ZbV\.(KeepsItsMemoryBoundAtAnyCosts|StaysAheadOfZbH1)'
