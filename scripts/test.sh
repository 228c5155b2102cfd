#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds (tests included) and runs ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DMEGATRAIN_TESTS=ON
cd build
ctest --output-on-failure -j "$(nproc)" "$@"
