#!/usr/bin/env bash
# The GPU bundle works from another path, as the GPU machine will see it, with nothing of the build machine:
# scripts/gpu-bundle.sh --no-build packs this megatrain's build folder, the bundle is moved, and its CPU-runnable
# part runs from there with MEGATRAIN_SOURCE_DIR unset, from another working directory and, where unshare allows a
# private mount namespace, with the source tree and the build folder hidden (so a path baked in at build time
# fails here, not on the GPU machine):
#   gpu-run.sh env succeeds (every library resolves, the CUDA ones from /usr/local/cuda here) and says clearly that
#   there is no GPU; bin/megatrain --version; bin/test_distributed's Gloo test passes (its test data found beside
#   bin/) and its NCCL test skips; the other GPU unit tests exit 0 with skips; the CPU smoke of bench through
#   gpu-run.sh bench (DEVICE=cpu); gpu-run.sh first refuses at once without a GPU; each mode writes its summary.
# Also: the checkout's own scripts/gpu-run.sh, outside a bundle and without a build, says how to get one.
# Skips when this build has no CUDA backend (nothing to bundle).
source "$(dirname "$0")/lib/common.bash"
BUILD=$(dirname "$(realpath "$MT")")
grep -q '^cuda backend: built' <<<"$("$MT" info)" || { echo "SKIP: $MT was built without the CUDA backend"; exit 77; }
for t in test_cuda_ops test_cuda_models test_comm_nccl test_distributed test_cuda_allocator; do
  [ -x "$BUILD/tests/$t" ] || { echo "SKIP: $BUILD/tests/$t is not built (the bundle takes the GPU tests along)"; exit 77; }
done
T0=$(date +%s)
took() { echo "  ($(( $(date +%s) - T0 )) s so far)"; }

# The checkout's gpu-run.sh with no bundle and no build beside it names the ways to get a megatrain.
mkdir -p checkout/scripts
cp "$SRC/scripts/gpu-run.sh" checkout/scripts/
rc=0
env -u MEGATRAIN bash checkout/scripts/gpu-run.sh env >outside.log 2>&1 || rc=$?
[ "$rc" -eq 1 ] || { cat outside.log; fail "gpu-run.sh outside a bundle exited $rc, expected 1"; }
for want in "no megatrain binary" "scripts/gpu-bundle.sh" "MEGATRAIN="; do
  grep -qF "$want" outside.log || { cat outside.log; fail "gpu-run.sh outside a bundle does not say '$want'"; }
done
rc=0
bash checkout/scripts/gpu-run.sh >nomode.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "no mode given" nomode.log || { cat nomode.log; fail "gpu-run.sh without a mode exited $rc"; }
echo "outside a bundle: gpu-run.sh says how to get a megatrain"

# Pack, then unpack the archive (what travels) at another path (with a space in it); the folder must equal it.
MAX_MIB=4096 XZ_LEVEL=0 bash "$SRC/scripts/gpu-bundle.sh" --no-build --build-dir "$BUILD" \
  --out "$WORK/made/gpu-bundle" >bundle.log 2>&1 || { tail -20 bundle.log; fail "scripts/gpu-bundle.sh --no-build failed"; }
[ -f "$WORK/made/gpu-bundle.tar.xz" ] || fail "gpu-bundle.sh made no gpu-bundle.tar.xz beside the folder"
mkdir -p "$WORK/gpu machine" "$WORK/elsewhere"
tar xJf "$WORK/made/gpu-bundle.tar.xz" -C "$WORK/gpu machine" || fail "the bundle archive does not unpack"
diff -r "$WORK/made/gpu-bundle" "$WORK/gpu machine/gpu-bundle" >/dev/null || fail "the archive differs from the folder"
mv "$WORK/gpu machine/gpu-bundle" "$WORK/gpu machine/bundle"

# scripts/gpu-lease.sh, the one command of a lease: unpacks the archive, runs modes under their budgets, packs the
# logs into one file; a mistyped step is refused before anything runs.
rc=0
OUT=$WORK/lease-out bash "$SRC/scripts/gpu-lease.sh" --archive "$WORK/made/gpu-bundle.tar.xz" --dir "$WORK/lease" \
  'env 60' 'bench 100 DEVICE=cpu SEQS=64 WARMUP=1 ITERS=2 TORCH=0 PROFILE=1 -- tiny' >lease.log 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { cat lease.log; fail "gpu-lease.sh exited $rc"; }
tar tzf "$WORK/lease-out/logs.tgz" >lease.files || fail "gpu-lease.sh left no readable logs.tgz"
for want in ./01-env/env-summary.txt ./02-bench/bench-summary.txt ./02-bench/gpu_throughput.md ./02-bench/op_profile-tiny-64.md; do
  grep -qxF "$want" lease.files || { cat lease.files; fail "logs.tgz has no $want"; }
done
grep -q "^| tiny | 64 |" lease.log || { cat lease.log; fail "gpu-lease.sh did not print the bench table last"; }
rc=0
OUT=$WORK/lease-out bash "$SRC/scripts/gpu-lease.sh" --archive "$WORK/made/gpu-bundle.tar.xz" 'first 370' 'bnech 60' \
  >lease_bad.log 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "unknown mode 'bnech'" lease_bad.log || { cat lease_bad.log; fail "a bad step: exit $rc"; }
echo "gpu-lease.sh: two modes from the archive, logs in one file; a bad step refused"
rm -rf "$WORK/made"
echo "bundle packed, archived and unpacked elsewhere: $(grep -o 'archive .*MiB' bundle.log | tail -1)"; took

# The GPU-free checks, run from the moved bundle. Exported, to run inside the mount namespace.
B="$WORK/gpu machine/bundle"
HAS_GPU=0
if "$MT" info --require-gpu >/dev/null 2>&1; then HAS_GPU=1; fi
BENCH_TORCH=0
if python3 -c 'import torch' >/dev/null 2>&1; then BENCH_TORCH=1; fi
relocated_checks() {
  set -euo pipefail
  cd "$WORK/elsewhere"
  unset MEGATRAIN_SOURCE_DIR MEGATRAIN
  local run=$B/scripts/gpu-run.sh rc t

  OUT=$WORK/out-env "$run" env >env.log 2>&1 || { cat env.log; fail "gpu-run.sh env failed in the moved bundle"; }
  grep -q "== no missing libraries" env.log || { cat env.log; fail "env: the ldd check did not pass"; }
  grep -q "^result: ok" "$WORK/out-env/env-summary.txt" || fail "env: no ok summary: $(cat "$WORK/out-env/env-summary.txt")"
  if [ "$HAS_GPU" = 0 ]; then
    grep -q "no usable GPU" env.log || { cat env.log; fail "env does not say that there is no usable GPU"; }
  fi
  echo "gpu-run.sh env: ok, every library resolves$([ "$HAS_GPU" = 1 ] || echo ', no GPU said clearly')"; took

  "$run" exec "$B/bin/megatrain" --version >version.log 2>&1 || { cat version.log; fail "bin/megatrain --version failed"; }
  echo "bin/megatrain --version: $(grep -m1 '^megatrain ' version.log)"

  "$run" exec "$B/bin/test_distributed" >test_distributed.log 2>&1 || { cat test_distributed.log; fail "bin/test_distributed failed"; }
  grep -q '^\[       OK \] .*Gloo' test_distributed.log || { cat test_distributed.log; fail "test_distributed: no Gloo test passed"; }
  echo "bin/test_distributed: the Gloo test passes from the moved bundle"; took
  if [ "$HAS_GPU" = 0 ]; then
    for t in test_cuda_ops test_cuda_models test_comm_nccl test_cuda_allocator test_distributed; do
      [ "$t" = test_distributed ] || "$run" exec "$B/bin/$t" >"$t.log" 2>&1 || { tail -30 "$t.log"; fail "bin/$t failed without a GPU"; }
      grep -q '^\[  SKIPPED \]' "$t.log" || { tail -30 "$t.log"; fail "bin/$t: no test skipped without a GPU"; }
      ! grep -q '^\[  FAILED  \]' "$t.log" || { tail -30 "$t.log"; fail "bin/$t: a test failed without a GPU"; }
    done
    echo "GPU tests: exit 0, skipped"; took
  fi

  # The CPU smoke of bench through the mode the GPU machine runs (PyTorch too when this python3 has it).
  rc=0
  OUT=$WORK/out-bench DEVICE=cpu MODELS="tiny llama-tiny" SEQS=64 WARMUP=2 ITERS=3 TORCH=$BENCH_TORCH \
    "$run" bench >bench.log 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { cat bench.log; fail "gpu-run.sh bench (DEVICE=cpu) exited $rc"; }
  for m in tiny llama-tiny; do
    grep -q "^| $m | 64 | .* | megatrain | cpu |" "$WORK/out-bench/gpu_throughput.md" ||
      { cat bench.log; fail "bench: no megatrain row for $m in gpu_throughput.md"; }
  done
  grep -q "^bench .* ok .*2 ok, 0 failed, 0 not run" "$WORK/out-bench/bench-summary.txt" ||
    fail "bench: summary: $(cat "$WORK/out-bench/bench-summary.txt")"
  echo "gpu-run.sh bench, DEVICE=cpu: tiny and llama-tiny measured (torch: $BENCH_TORCH)"; took

  if [ "$HAS_GPU" = 0 ]; then
    local t0=$SECONDS
    rc=0
    OUT=$WORK/out-first "$run" first >first.log 2>&1 || rc=$?
    [ "$rc" -eq 1 ] || { cat first.log; fail "gpu-run.sh first without a GPU exited $rc, expected 1"; }
    grep -q "no usable GPU" first.log || { cat first.log; fail "first does not say why it stopped"; }
    grep -q "^gpu  *NONE" "$WORK/out-first/first-summary.txt" && grep -q "^result: FAILED" "$WORK/out-first/first-summary.txt" ||
      fail "first: summary: $(cat "$WORK/out-first/first-summary.txt")"
    echo "gpu-run.sh first without a GPU: stops after $((SECONDS - t0)) s, summary written"
  fi
}
export B WORK HAS_GPU BENCH_TORCH T0
export -f relocated_checks fail took

# Hide the source tree, the build folder and the source tree the build was configured from (tmpfs over them, in a
# private mount namespace) where allowed.
hide=()
for d in "$(realpath "$SRC")" "$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt")" "$BUILD"; do
  [ -d "$d" ] || continue
  for h in "${hide[@]}"; do case $d/ in "$h"/*) continue 2 ;; esac; done
  hide+=("$d")
done
userns=()
[ "$(id -u)" = 0 ] || userns=(-r)
mkdir probe
if unshare "${userns[@]}" -m mount -t tmpfs -o size=1m tmpfs probe 2>/dev/null; then
  echo "running from $B with ${hide[*]} hidden"
  unshare "${userns[@]}" -m bash -c 'for d; do mount -t tmpfs -o size=1m tmpfs "$d" || fail "cannot hide $d"; done
                                     relocated_checks' _ "${hide[@]}"
else
  echo "note: no private mount namespace here (unshare -m): ${hide[*]} stay visible (a path baked in at build time" \
       "goes unnoticed)"
  bash -c relocated_checks
fi
echo "bundle_relocated: all checks passed in $(( $(date +%s) - T0 )) s"
