#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds (tests included) and runs ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DMEGATRAIN_TESTS=ON
# The same unit tests built with ASan + UBSan on the CPU backend (-O1 keeps the build short); ctest's
# sanitize.unit_tests runs them. MEGATRAIN_SANITIZE_BUILD=0 leaves it out (that test then skips).
if [ "${MEGATRAIN_SANITIZE_BUILD:-1}" != 0 ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" \
        "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG" -DMEGATRAIN_CUDA=OFF -DMEGATRAIN_SANITIZE=ON -DMEGATRAIN_TESTS=ON >/dev/null
  cmake --build build-asan -j "$(nproc)"
fi
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
