#!/usr/bin/env bash
# gpu-bundle.sh: builds megatrain with CUDA (Release) and packs one self-contained folder to take to a GPU
# machine that has no package registry (../shared/GPU.md, way 1). The folder holds the binaries, every
# non-system shared library they need (found with ldd), the GPU tests, configs, benchmarks and
# scripts/gpu-run.sh; the GPU machine brings glibc, the driver and the CUDA libraries (nvidia pip packages).
#
# Usage: scripts/gpu-bundle.sh [--out DIR] [--build-dir DIR] [--arch LIST] [--jobs N] [--no-build]
#                              [-- extra cmake arguments]
#   --out DIR        the bundle folder (default gpu-bundle/; env BUNDLE_DIR); replaced on every run
#   --build-dir DIR  the CUDA build folder (default build-gpu/; env BUILD_DIR)
#   --arch LIST      CMAKE_CUDA_ARCHITECTURES (default 90; env CUDA_ARCHS), e.g. "80;90"
#   --jobs N         build jobs (default nproc; env JOBS)
#   --no-build       pack what the build folder holds, without configuring or building
# The folder is also packed as DIR.tar.xz (xz -6: 101 MiB -> 21 MiB): a lent GPU machine takes at most 64 MiB of
# working tree per call, so the archive is what travels (unpack there with `tar xJf`, or Python's tarfile where
# there is no xz). Env MAX_MIB (default 64): fail when the archive is larger; ARCHIVE=0: no archive, and then the
# folder itself must fit MAX_MIB; XZ_LEVEL (default 6; 0 packs ~5x faster, ~1.5x larger).
# Env CUDA_FLAGS (default --compress-mode=size):
# CMAKE_CUDA_FLAGS; compressed fatbins make the binaries ~5x smaller (megatrain: 14 MB -> 2.7 MB) and load on any
# CUDA 13 driver (580+). Set CUDA_FLAGS= to build without.
# Relative paths are relative to the repository root. Then, on the GPU machine: DIR/scripts/gpu-run.sh first (see
# README.txt in the bundle, or scripts/gpu-run.sh --help, for the other modes).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUNDLE_DIR=${BUNDLE_DIR:-gpu-bundle}
BUILD_DIR=${BUILD_DIR:-build-gpu}
CUDA_ARCHS=${CUDA_ARCHS:-90}
CUDA_FLAGS=${CUDA_FLAGS---compress-mode=size}
JOBS=${JOBS:-$(nproc)}
MAX_MIB=${MAX_MIB:-64}
BUILD=1
CMAKE_EXTRA=()

die() { echo "gpu-bundle: error: $*" >&2; exit 1; }
note() { echo "gpu-bundle: $*"; }
warn() { echo "gpu-bundle: warning: $*" >&2; }

while [[ $# -gt 0 ]]; do
  case $1 in
    --out) [[ $# -ge 2 ]] || die "--out needs a folder"; BUNDLE_DIR=$2; shift 2 ;;
    --build-dir) [[ $# -ge 2 ]] || die "--build-dir needs a folder"; BUILD_DIR=$2; shift 2 ;;
    --arch) [[ $# -ge 2 ]] || die "--arch needs a list, e.g. 90 or \"80;90\""; CUDA_ARCHS=$2; shift 2 ;;
    --jobs) [[ $# -ge 2 ]] || die "--jobs needs a number"; JOBS=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --) shift; CMAKE_EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

cd "$ROOT"
for tool in cmake ldd strip objdump du; do
  command -v "$tool" >/dev/null || die "'$tool' is not installed (needed to build and pack the bundle)"
done
BUILD_DIR=$(realpath -m "$BUILD_DIR")
BUNDLE_DIR=$(realpath -m "$BUNDLE_DIR")

# Never wipe a folder this script did not make.
case $BUNDLE_DIR in
  /|"$ROOT"|"$HOME"|/tmp|/usr|/usr/*|/etc|/etc/*) die "refusing to use $BUNDLE_DIR as the bundle folder" ;;
esac
[[ $BUNDLE_DIR != "$BUILD_DIR" ]] || die "the bundle folder and the build folder must differ ($BUNDLE_DIR)"
if [[ -e $BUNDLE_DIR ]]; then
  [[ -d $BUNDLE_DIR ]] || die "$BUNDLE_DIR exists and is not a folder"
  if [[ -n $(ls -A "$BUNDLE_DIR") && ! -f $BUNDLE_DIR/.megatrain-bundle ]]; then
    die "$BUNDLE_DIR is not empty and was not made by this script (no .megatrain-bundle marker): choose another --out"
  fi
fi

# The GPU tests to take along: those whose sources exist (test_<area>.cpp, or its parts test_<area>.<part>.cpp).
GPU_TESTS=()
for t in test_cuda_ops test_cuda_models test_comm_nccl test_distributed test_cuda_allocator test_training; do
  if [[ -n $(find tests/unit \( -name "$t.cpp" -o -name "$t.*.cpp" \) -print -quit) ]]; then
    GPU_TESTS+=("$t")
  elif [[ $t != test_training ]]; then
    warn "no tests/unit/**/$t.cpp or $t.*.cpp: the bundle will not hold $t (gpu-run.sh check will report it missing)"
  fi
done

# 1. Configure and build (Release, CUDA required, tests on).
if [[ $BUILD == 1 ]]; then
  note "configuring $BUILD_DIR (Release, CUDA architectures $CUDA_ARCHS, CUDA flags '$CUDA_FLAGS')"
  mkdir -p "$BUILD_DIR"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGATRAIN_CUDA=ON \
    -DMEGATRAIN_TESTS=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS" \
    "-DCMAKE_CUDA_FLAGS=$CUDA_FLAGS" "${CMAKE_EXTRA[@]}" >"$BUILD_DIR/configure.log" 2>&1 \
    || { tail -30 "$BUILD_DIR/configure.log" >&2; die "cmake configure failed (full log: $BUILD_DIR/configure.log)"; }
  note "building megatrain ${GPU_TESTS[*]} with $JOBS jobs (several minutes on few cores)"
  cmake --build "$BUILD_DIR" -j "$JOBS" --target megatrain "${GPU_TESTS[@]}" \
    || die "the build failed (see the compiler output above)"
fi
[[ -f $BUILD_DIR/CMakeCache.txt ]] || die "$BUILD_DIR holds no CMake build (run without --no-build)"
BUILT_ARCHS=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")
if [[ -z $BUILT_ARCHS && -f $BUILD_DIR/build.ninja ]]; then  # the project's default (80;90) is not in the cache
  BUILT_ARCHS=$(grep -o -- '--generate-code=arch=compute_[0-9a-z]*' "$BUILD_DIR/build.ninja" | sed 's/.*compute_//' |
                sort -u | paste -sd';' || true)
fi

# Finds a built executable by name in the build folder.
built() {
  local f
  for f in "$BUILD_DIR/$1" "$BUILD_DIR/tests/$1"; do [[ -x $f && -f $f ]] && { echo "$f"; return; }; done
  find "$BUILD_DIR" -maxdepth 3 -type f -name "$1" -perm -u+x -print -quit
}

MT=$(built megatrain)
[[ -n $MT ]] || die "no megatrain executable in $BUILD_DIR (did the build run?)"
# A binary with the CUDA backend links the CUDA runtime (MEGATRAIN_CUDA=AUTO builds it when a toolkit is found).
[[ $(ldd "$MT") == *libcudart.so* ]] ||
  die "$MT was built without the CUDA backend (it does not link libcudart): configure $BUILD_DIR with" \
      "-DMEGATRAIN_CUDA=ON (a CUDA toolkit is needed), or run without --no-build"

# 2. Fresh bundle folder.
rm -rf "$BUNDLE_DIR"
mkdir -p "$BUNDLE_DIR"/{bin,lib,scripts,tests}
touch "$BUNDLE_DIR/.megatrain-bundle"

cp -L "$MT" "$BUNDLE_DIR/bin/megatrain"
for t in "${GPU_TESTS[@]}"; do
  f=$(built "$t")
  if [[ -n $f ]]; then cp -L "$f" "$BUNDLE_DIR/bin/$t"; else warn "$t was not built: left out"; fi
done
cp -r tests/e2e "$BUNDLE_DIR/tests/e2e"
cp -r configs bench "$BUNDLE_DIR/"
cp scripts/gpu-run.sh "$BUNDLE_DIR/scripts/gpu-run.sh" || die "scripts/gpu-run.sh is missing"
# The timeline tools the GPU tests call (gpu_pipeline_features.sh summarises its trace).
cp scripts/trace_summary.py scripts/trace_png.py "$BUNDLE_DIR/scripts/" || die "scripts/trace_*.py are missing"
# The test fixtures the e2e scripts read from $SRC/tests/data (the chat tokenizer of gpu_fp8_cp_sft.sh).
cp -r tests/data "$BUNDLE_DIR/tests/data"
find "$BUNDLE_DIR" -name __pycache__ -prune -exec rm -rf {} +

# 3. Shared libraries from ldd. Left out: glibc (the target's own must be used) and every CUDA / NVIDIA
# library (the target's driver and nvidia pip packages provide them, matching its driver).
is_system_lib() {
  case $1 in
    linux-vdso.so*|linux-gate.so*|ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*| \
    libutil.so*|libmvec.so*|libanl.so*|libnsl.so*|libthread_db.so*|libBrokenLocale.so*) return 0 ;;
    libcuda.so*|libcudart.so*|libcublas*|libcudnn*|libnccl*|libnvidia*|libnvrtc*|libnvJitLink*) return 0 ;;
  esac
  return 1
}
missing=()
declare -A copied=()
for bin in "$BUNDLE_DIR"/bin/*; do
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue   # the vdso and the loader carry no "=>"
    is_system_lib "$name" && continue
    if [[ $path == not ]]; then missing+=("$name (needed by $(basename "$bin"))"); continue; fi
    [[ -n ${copied[$name]:-} ]] && continue
    case $name in
      # The compiler's runtime goes apart: gpu-run.sh uses it only where the target's glibc is new enough
      # for it (lib/gcc/GLIBC_NEEDED), else the target's own (usually as new, for GCC 12 binaries).
      libstdc++.so*|libgcc_s.so*) mkdir -p "$BUNDLE_DIR/lib/gcc"; cp -L "$path" "$BUNDLE_DIR/lib/gcc/$name" ;;
      *) cp -L "$path" "$BUNDLE_DIR/lib/$name" ;;
    esac
    copied[$name]=$path
  done < <(ldd "$bin")
done
[[ ${#missing[@]} -eq 0 ]] || die "ldd finds no file for: ${missing[*]}"
chmod -R u+w "$BUNDLE_DIR/bin" "$BUNDLE_DIR/lib"
for name in $(printf '%s\n' "${!copied[@]}" | sort); do note "lib: $name <- ${copied[$name]}"; done

# 4. Strip symbols nobody needs at run time (debug info, local symbols).
find "$BUNDLE_DIR/bin" "$BUNDLE_DIR/lib" -type f -exec strip --strip-unneeded {} +

# 5. Checks: with only lib/ on the path every non-system library resolves inside the bundle.
for bin in "$BUNDLE_DIR"/bin/*; do
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    is_system_lib "$name" && continue
    [[ $path == "$BUNDLE_DIR/lib/$name" || $path == "$BUNDLE_DIR/lib/gcc/$name" ]] ||
      die "$(basename "$bin"): $name resolves to $path, not to the bundle's lib/"
  done < <(LD_LIBRARY_PATH="$BUNDLE_DIR/lib:$BUNDLE_DIR/lib/gcc" ldd "$bin")
done
# The newest glibc symbol version anything in the bundle needs: the GPU machine's glibc must be at least that.
glibc_needed() {  # files... -> the newest GLIBC_x.y symbol version they need
  local f
  for f in "$@"; do objdump -T "$f" 2>/dev/null; done | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V -u | tail -1
}
mapfile -t packed < <(find "$BUNDLE_DIR/bin" "$BUNDLE_DIR/lib" -maxdepth 1 -type f)
GLIBC_NEEDED=$(glibc_needed "${packed[@]}")
if [[ -d $BUNDLE_DIR/lib/gcc ]]; then
  GCC_GLIBC_NEEDED=$(glibc_needed "$BUNDLE_DIR"/lib/gcc/*.so*)
  echo "${GCC_GLIBC_NEEDED:-0}" >"$BUNDLE_DIR/lib/gcc/GLIBC_NEEDED"
fi
VERSION=$(LD_LIBRARY_PATH="$BUNDLE_DIR/lib:$BUNDLE_DIR/lib/gcc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$BUNDLE_DIR/bin/megatrain" --version 2>/dev/null ||
  echo "megatrain (version not printed here: CUDA libraries not found on this machine)")

cat > "$BUNDLE_DIR/README.txt" <<EOF
megatrain GPU bundle ($VERSION), made by scripts/gpu-bundle.sh on $(hostname) at $(date -u '+%Y-%m-%d %H:%M UTC').
CUDA architectures: ${BUILT_ARCHS:-unknown}. Needs on the GPU machine: glibc >= ${GLIBC_NEEDED:-?} (lib/gcc/, this
machine's libstdc++ and libgcc_s, is used where glibc >= ${GCC_GLIBC_NEEDED:-?}, else the target's own), the NVIDIA
driver, and libcudart / libcublasLt / libcudnn / libnccl (CUDA 13): the nvidia pip packages of a PyTorch install,
or a CUDA toolkit. Everything else is in lib/.

  bin/       megatrain and the GPU unit tests (${GPU_TESTS[*]})
  lib/       the shared libraries they need, except glibc and the CUDA / NVIDIA libraries (lib/gcc: libstdc++)
  configs/   model configs; bench/ the benchmarks; tests/e2e/ the end-to-end tests (gpu_*.sh run on the GPU)
  scripts/gpu-run.sh   sets LD_LIBRARY_PATH (lib/ + site-packages/nvidia/*/lib of python3) and runs things

Run from anywhere, one mode per command, in this order (each ends by itself within its budget, under the lent
machines' 600 s per command; logs go to \$OUT/<step>.log and a summary of each step's status, seconds and cap to
\$OUT/<mode>-summary.txt when OUT is set):
  scripts/gpu-run.sh first      (470 s) env, test_cuda_ops (its failures again with MEGATRAIN_CUDA_SYNC=1), the other
                                GPU unit tests, the tiny model on the GPU against the CPU
  scripts/gpu-run.sh e2e        (540 s) tests/e2e/gpu_*.sh but the layout matrix
  scripts/gpu-run.sh matrix     (540 s) tests/e2e/gpu_layout_matrix.sh, GPT rows then Llama rows (matrix gpt|llama: one)
  scripts/gpu-run.sh sanitize   (540 s) compute-sanitizer memcheck and racecheck over test_cuda_ops
  scripts/gpu-run.sh bench 1.3b (540 s) megatrain vs PyTorch for one model (then 124m, 350m, llama3.2-1b: one each)
  scripts/gpu-run.sh plan 1.3b  (540 s) bench kernels on the GPU, then plan's predictions beside measured runs
  scripts/gpu-run.sh env        (120 s) what the machine has (nvidia-smi, nvcc, torch, the nvidia pip folders), ldd
  scripts/gpu-run.sh check      (540 s) the GPU unit tests alone;  scripts/gpu-run.sh exec CMD: CMD with the library path
  PYTHON=/path/to/venv/bin/python3 scripts/gpu-run.sh ...   when python3 is not the one with torch
By hand:  export LD_LIBRARY_PATH=\$PWD/lib:\$PWD/lib/gcc:<site-packages>/nvidia/cu13/lib:<site-packages>/nvidia/nccl/lib
          bin/megatrain --config configs/gpt-124m.yaml --set training.device=cuda --set data.synthetic=true
EOF

# 6. Size, and the archive that travels.
mib_of() { local b; b=$(du -sb "$1" | cut -f1); echo $(( (b + 1048575) / 1048576 )); }
mib=$(mib_of "$BUNDLE_DIR")
note "contents:"
du -sh "$BUNDLE_DIR"/bin/* "$BUNDLE_DIR"/lib | sed 's/^/  /'
note "bundle $BUNDLE_DIR: $mib MiB, needs glibc >= ${GLIBC_NEEDED:-?} on the GPU machine" \
     "(>= ${GCC_GLIBC_NEEDED:-?} to use the bundled libstdc++)"
if [[ ${ARCHIVE:-1} == 0 ]]; then
  [[ $mib -le $MAX_MIB ]] || die "the bundle is $mib MiB, more than MAX_MIB=$MAX_MIB (leave ARCHIVE unset to pack it)"
  note "done. On the GPU machine: $BUNDLE_DIR/scripts/gpu-run.sh first"
  exit 0
fi
command -v xz >/dev/null || die "'xz' is not installed (needed to pack $BUNDLE_DIR.tar.xz; or ARCHIVE=0)"
rm -f "$BUNDLE_DIR.tar.xz"
tar -C "$(dirname "$BUNDLE_DIR")" -cf - "$(basename "$BUNDLE_DIR")" | xz -T "$JOBS" "-${XZ_LEVEL:-6}" >"$BUNDLE_DIR.tar.xz.tmp"
mv -f "$BUNDLE_DIR.tar.xz.tmp" "$BUNDLE_DIR.tar.xz"
amib=$(mib_of "$BUNDLE_DIR.tar.xz")
note "archive $BUNDLE_DIR.tar.xz: $amib MiB"
[[ $amib -le $MAX_MIB ]] || die "the archive is $amib MiB, more than MAX_MIB=$MAX_MIB"
note "done. On the GPU machine: tar xJf $(basename "$BUNDLE_DIR").tar.xz -C /tmp &&" \
     "/tmp/$(basename "$BUNDLE_DIR")/scripts/gpu-run.sh first"
