#!/usr/bin/env bash
# megatrain's fp8 conversions (e4m3, e5m2: round to nearest even, saturating) against PyTorch's float8_e4m3fn and
# float8_e5m2: test_fp8's Fp8Dump test writes every code's value and a sweep of float32 conversions, and
# tests/interop/check_fp8_torch.py compares them with torch (docs/fp8.md). Skips (77) without the interop Python
# (scripts/python-env.sh), or when the unit tests were not built beside the binary.
source "$(dirname "$0")/lib/common.bash"
require_interop_python torch numpy
TEST_FP8=${TEST_FP8:-$(dirname "$MT")/tests/test_fp8}
if [ ! -x "$TEST_FP8" ]; then
  echo "SKIP: no test_fp8 at $TEST_FP8 (build with -DMEGATRAIN_TESTS=ON, or set TEST_FP8)"
  exit 77
fi
MEGATRAIN_FP8_DUMP="$WORK/fp8.bin" "$TEST_FP8" --gtest_filter=Fp8Dump.* >dump.log 2>&1 \
  || { cat dump.log; fail "test_fp8 could not write the dump"; }
grep -q "wrote .* conversions" dump.log || { cat dump.log; fail "Fp8Dump did not write (skipped?)"; }
"$PY" "$SRC/tests/interop/check_fp8_torch.py" "$WORK/fp8.bin" || fail "fp8 conversions differ from PyTorch's"
echo PASS
