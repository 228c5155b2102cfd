#!/usr/bin/env bash
# ptxas-report.sh: registers, stack, spills and shared memory of every CUDA kernel for one architecture, from
# ptxas itself (nvcc -cubin -Xptxas -v on each core/cuda/*.cu, device code only: no host compile, no GPU needed).
# One line a kernel: name (demangled, anonymous namespaces as such, so the text does not depend on the path),
# then tab-separated: registers, stack frame bytes, spill store bytes, spill load bytes, static shared memory bytes.
#
# Usage: scripts/ptxas-report.sh [--arch 90] [--jobs N] [--check BASELINE]
#   --check BASELINE  compare with a report written before (bench/ptxas_sm90.tsv): fail when a kernel spills more
#                     (stores or loads) than there, or when a kernel that is not there spills at all
# Env NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ARCH=90
JOBS=$(nproc)
CHECK=
die() { echo "ptxas-report: error: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --arch) ARCH=${2:?--arch needs a number, e.g. 90}; shift 2 ;;
    --jobs) JOBS=${2:?--jobs needs a number}; shift 2 ;;
    --check) CHECK=${2:?--check needs a baseline file}; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[[ -x $NVCC ]] || die "no nvcc (not on PATH, not /usr/local/cuda/bin/nvcc): set NVCC"
FILT=$(dirname "$NVCC")/cu++filt
[[ -x $FILT ]] || FILT=$(command -v cu++filt || command -v c++filt || true)
[[ -n $FILT ]] || die "no cu++filt or c++filt to demangle kernel names"
[[ -z $CHECK || -f $CHECK ]] || die "baseline $CHECK does not exist"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# One nvcc per file, JOBS at a time; ptxas writes its -v report on stderr.
compile() {  # file
  local f=$1 name
  name=$(basename "$f" .cu)
  "$NVCC" -std=c++20 "-arch=sm_$ARCH" -cubin -O3 -DNDEBUG -I"$ROOT" -Xptxas -v \
    -o "$work/$name.cubin" "$f" >"$work/$name.log" 2>&1 || { cat "$work/$name.log" >&2; echo "FAILED: $f" >&2; return 1; }
}
export -f compile
export NVCC ARCH ROOT work
find "$ROOT/core/cuda" -name '*.cu' -print0 | sort -z | xargs -0 -n 1 -P "$JOBS" bash -c 'compile "$0"' ||
  die "nvcc failed (see above)"

# ptxas -v: "Compiling entry function 'NAME' for 'sm_90'", then "N bytes stack frame, N bytes spill stores, N bytes
# spill loads", then "Used N registers, ... [N bytes smem]".
report=$(cat "$work"/*.log | awk '
  /Compiling entry function/ { match($0, /\x27[^\x27]+\x27/); name = substr($0, RSTART + 1, RLENGTH - 2); next }
  /bytes stack frame/ && name != "" { stack = $1; stores = $5; loads = $9; next }
  /Used [0-9]+ registers/ && name != "" {
    match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15)
    smem = 0; if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH - 11)
    print name "\t" regs "\t" stack "\t" stores "\t" loads "\t" smem; name = "" }' |
  while IFS=$'\t' read -r name rest; do printf '%s\t%s\n' "$("$FILT" "$name")" "$rest"; done |
  sed 's/_GLOBAL__N__[0-9a-f_]*[A-Za-z0-9_]*_cu_[0-9a-f]*/(anonymous namespace)/g' | LC_ALL=C sort)
[[ -n $report ]] || die "ptxas reported no kernels (nvcc output: $work/*.log)"
echo "# kernel	registers	stack_bytes	spill_store_bytes	spill_load_bytes	smem_bytes (sm_$ARCH, $("$NVCC" --version | tail -1))"
echo "$report"
if [[ -n $CHECK ]]; then
  worse=$(awk -F'\t' 'NR == FNR { if ($0 !~ /^#/) { st[$1] = $4; ld[$1] = $5 } next }
    $0 !~ /^#/ && (($1 in st) ? ($4 > st[$1] || $5 > ld[$1]) : ($4 > 0 || $5 > 0)) {
      printf "  %s: spills %s / %s bytes (stores / loads), baseline %s / %s\n", $1, $4, $5,
             ($1 in st) ? st[$1] : "none", ($1 in ld) ? ld[$1] : "none" }' "$CHECK" <(echo "$report"))
  if [[ -n $worse ]]; then
    echo "ptxas-report: kernels spill more than $CHECK says:" >&2
    echo "$worse" >&2
    echo "(if that is intended, write a new baseline: scripts/ptxas-report.sh --arch $ARCH > $CHECK)" >&2
    exit 1
  fi
  echo "# every kernel spills no more than $CHECK" >&2
fi
