#!/usr/bin/env bash
# gpu-lease.sh: one command on a lent GPU machine, where a command may run 10 minutes, only a few files come back
# and the session's whole device time is short: unpacks the bundle archive of scripts/gpu-bundle.sh, runs several
# gpu-run.sh modes one after another, each under its own budget (and `timeout`, so a hang cannot eat the rest),
# packs every log into $OUT/logs.tgz (one file back instead of dozens) and prints each mode's summary last.
#
# Usage: scripts/gpu-lease.sh [--archive FILE] [--dir DIR] 'MODE BUDGET [VAR=value ...] [-- ARGS ...]' ...
#   --archive FILE  the bundle archive (default gpu-bundle.tar.xz in the current folder)
#   --dir DIR       where to unpack it (default /tmp; the bundle lands in DIR/gpu-bundle)
# Each quoted step is one gpu-run.sh mode: its budget in seconds, environment for it (VAR=value), and after `--`
# its arguments. Example, the run of 2026-11-27 on an H100 (about 9 minutes):
#   scripts/gpu-lease.sh 'first 370' 'bench 230 SEQS=2048 WARMUP=2 ITERS=6 PROFILE=1 -- 1.3b' \
#                        'bench 150 SEQS=1024 WARMUP=2 ITERS=8 -- 124m'
# Env OUT (required: where logs.tgz and the summaries go). Exit status: 0 when every step's mode passed.
set -euo pipefail

die() { echo "gpu-lease: error: $*" >&2; exit 2; }
ARCHIVE=gpu-bundle.tar.xz
DIR=/tmp
while [[ $# -gt 0 ]]; do
  case $1 in
    --archive) [[ $# -ge 2 ]] || die "--archive needs a file"; ARCHIVE=$2; shift 2 ;;
    --dir) [[ $# -ge 2 ]] || die "--dir needs a folder"; DIR=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) break ;;
  esac
done
[[ $# -gt 0 ]] || die "no steps given, e.g. 'first 370' 'bench 230 SEQS=2048 -- 1.3b' (see --help)"
[[ -n ${OUT:-} ]] || die "OUT is not set: it names the folder that logs.tgz and the summaries go to"
[[ -f $ARCHIVE ]] || die "no bundle archive $ARCHIVE (make it with scripts/gpu-bundle.sh; --archive names another)"

# Check every step before running any: a typo must not cost a lease.
declare -a MODES BUDGETS ENVS ARGS
for step in "$@"; do
  read -r -a w <<<"$step"
  [[ ${#w[@]} -ge 2 ]] || die "step '$step': expected 'MODE BUDGET [VAR=value ...] [-- ARGS ...]'"
  case ${w[0]} in first|e2e|matrix|sanitize|bench|plan|check|env|exec) ;;
    *) die "step '$step': unknown mode '${w[0]}' (first, e2e, matrix, sanitize, bench, plan, check, env or exec)" ;; esac
  [[ ${w[1]} =~ ^[0-9]+$ && ${w[1]} -ge 30 ]] || die "step '$step': budget '${w[1]}' is not a number of seconds >= 30"
  envs=() args=() seen_sep=0
  for x in "${w[@]:2}"; do
    if [[ $seen_sep == 1 ]]; then args+=("$x")
    elif [[ $x == -- ]]; then seen_sep=1
    elif [[ $x =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then envs+=("$x")
    else die "step '$step': '$x' is neither VAR=value nor after '--'"; fi
  done
  MODES+=("${w[0]}") BUDGETS+=("${w[1]}") ENVS+=("${envs[*]}") ARGS+=("${args[*]}")
done

mkdir -p "$OUT" "$DIR"
LOGS=$(mktemp -d "$DIR/gpu-lease.XXXXXX")
pack() { tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null || true; }
trap pack EXIT
rm -rf "$DIR/gpu-bundle"
if ! tar xJf "$ARCHIVE" -C "$DIR" 2>"$LOGS/unpack.err"; then  # no xz: Python's tarfile reads it
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$ARCHIVE" "$DIR" ||
    die "cannot unpack $ARCHIVE: $(cat "$LOGS/unpack.err")"
fi
RUN=$DIR/gpu-bundle/scripts/gpu-run.sh
[[ -x $RUN ]] || die "$ARCHIVE holds no gpu-bundle/scripts/gpu-run.sh"

rc=0
for i in "${!MODES[@]}"; do
  name=$(printf '%02d-%s' "$((i + 1))" "${MODES[$i]}")
  mkdir -p "$LOGS/$name"
  echo "==== gpu-lease: step $((i + 1)): ${MODES[$i]} (budget ${BUDGETS[$i]} s) ${ENVS[$i]} ${ARGS[$i]:+-- ${ARGS[$i]}}"
  # shellcheck disable=SC2086
  (cd "$DIR/gpu-bundle" && env ${ENVS[$i]} OUT="$LOGS/$name" BUDGET="${BUDGETS[$i]}" \
     timeout -k 5 "$((BUDGETS[$i] + 10))" "$RUN" "${MODES[$i]}" ${ARGS[$i]}) >"$LOGS/$name/console.log" 2>&1 || rc=1
  pack  # after every step: a kill from outside still leaves what was done
done
echo
for f in "$LOGS"/*/*-summary.txt; do [[ -f $f ]] && { echo "== $(basename "$(dirname "$f")")"; cat "$f"; }; done
for f in "$LOGS"/*/gpu_throughput.md; do [[ -f $f ]] && cat "$f"; done
exit "$rc"
