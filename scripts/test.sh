#!/usr/bin/env bash
# The whole test suite: installs what is missing (Debian packages, the interop tests' Python environment), builds
# (tests included) and runs ctest; then says what ctest skipped and why (tests/skip_report.py: under CI=true any
# skip but a GPU's fails the run) and how long each phase took.
set -euo pipefail
cd "$(dirname "$0")/.."
phases=()
phase_start=$(date +%s)
phase() {  # phase NAME: the time since the last phase ends NAME's
  local now
  now=$(date +%s)
  phases+=("$1 $((now - phase_start)) s")
  phase_start=$now
}

scripts/install-deps.sh
phase "dependencies"
# The interop tests (transformers, peft, tokenizers, sentencepiece, megatron-core, tensorboard) run in
# build/interop-venv; without it they skip, which skip_report fails under CI. It is made beside the builds (mostly
# downloads), and waited for before ctest.
mkdir -p build
scripts/python-env.sh build >build/python-env.log 2>&1 &
python_env=$!
scripts/build.sh -DMEGATRAIN_TESTS=ON
phase "build"
# The same unit tests built with ASan + UBSan on the CPU backend (-O1 keeps the build short); ctest's
# sanitize.unit_tests runs them. MEGATRAIN_SANITIZE_BUILD=0 leaves it out (that test then skips).
if [ "${MEGATRAIN_SANITIZE_BUILD:-1}" != 0 ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" \
        "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG" -DMEGATRAIN_CUDA=OFF -DMEGATRAIN_SANITIZE=ON -DMEGATRAIN_TESTS=ON >/dev/null
  cmake --build build-asan -j "$(nproc)"
fi
phase "sanitizer build"
wait "$python_env" || echo "test.sh: warning: no interop Python environment: the interop tests will skip" >&2
cat build/python-env.log
phase "python environment (made beside the builds: the wait for it)"
cd build
rc=0
rm -f ctest-junit.xml
ctest --output-on-failure -j "$(nproc)" --output-junit "$PWD/ctest-junit.xml" "$@" || rc=$?
phase "ctest"
echo "phases: $(IFS=,; echo "${phases[*]}" | sed 's/,/, /g')"
if [ -f ctest-junit.xml ]; then
  python3 ../tests/skip_report.py ctest-junit.xml || { [ "$rc" -ne 0 ] || rc=1; }
fi
exit "$rc"
