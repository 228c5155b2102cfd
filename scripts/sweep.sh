#!/usr/bin/env bash
# sweep.sh: trains one run per point of a grid of --set overrides, each in its own run directory, then prints a
# table of final training loss, last validation loss and throughput.
#
#   scripts/sweep.sh --config C --out DIR --grid optimizer.lr=1e-3,3e-3 --grid training.micro_batch_size=1,2 \
#                    [--megatrain BIN] [--dry-run] [-- extra megatrain args, e.g. --nproc 2 --set ...]
#
# Each point runs in DIR/<key>=<value>_... (logging.dir and checkpoint.save_dir set there, so runs never resume
# from each other); its output goes to that directory's output.txt. A failed run is reported in the table and
# the sweep goes on; the exit status is 1 when any run failed. The table is also written to DIR/summary.tsv.
set -euo pipefail

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
die() { echo "sweep.sh: $*" >&2; exit 2; }

config="" out="" dry_run=0
megatrain=${MEGATRAIN:-$(dirname "$0")/../build/megatrain}
grids=() extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --config) config=${2:?--config needs a file}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --grid) grids+=("${2:?--grid needs key=v1,v2,...}"); shift 2 ;;
    --megatrain) megatrain=${2:?--megatrain needs a binary}; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$config" ] || die "--config is required"
[ -f "$config" ] || die "--config $config: no such file"
[ -n "$out" ] || die "--out is required"
[ ${#grids[@]} -gt 0 ] || die "at least one --grid key=v1,v2,... is required"
[ -x "$megatrain" ] || die "no megatrain binary at $megatrain (build it, or pass --megatrain / set MEGATRAIN)"
for g in "${grids[@]}"; do
  [[ $g =~ ^[A-Za-z_][A-Za-z0-9_.]*=[^,]+(,[^,]+)*$ ]] || die "--grid $g: expected key.path=v1,v2,... (no empty values)"
done

# The grid's points, one line each: "key=value<TAB>key=value...", the first --grid varying slowest.
points=("")
for g in "${grids[@]}"; do
  key=${g%%=*}
  IFS=, read -r -a values <<<"${g#*=}"
  next=()
  for p in "${points[@]}"; do
    for v in "${values[@]}"; do next+=("${p:+$p$'\t'}$key=$v"); done
  done
  points=("${next[@]}")
done

# A directory name for a point: "optimizer.lr=1e-3_training.micro_batch_size=2", unsafe characters as '-'.
dir_name() { tr '\t' '_' <<<"$1" | tr -c 'A-Za-z0-9._=+\n-' '-'; }

mkdir -p "$out"
failed=0 n=0
run_dirs=()
for p in "${points[@]}"; do
  n=$((n + 1))
  run="$out/$(dir_name "$p")"
  run_dirs+=("$run")
  sets=()
  IFS=$'\t' read -r -a kvs <<<"$p"
  for kv in "${kvs[@]}"; do sets+=(--set "$kv"); done
  cmd=("$megatrain" --config "$config" "${sets[@]}" --set "logging.dir=$run" --set "checkpoint.save_dir=$run/checkpoints"
       "${extra[@]}")
  echo "sweep: [$n/${#points[@]}] ${kvs[*]} -> $run"
  if [ "$dry_run" -eq 1 ]; then printf '  %q' "${cmd[@]}"; echo; continue; fi
  rm -rf "$run"
  mkdir -p "$run"
  printf '%q ' "${cmd[@]}" > "$run/command.txt"
  printf '%s\n' "${kvs[@]}" > "$run/point.txt"  # the grid values, for the table
  rc=0
  "${cmd[@]}" > "$run/output.txt" 2>&1 || rc=$?
  echo "$rc" > "$run/exit_code"
  if [ "$rc" -ne 0 ]; then
    failed=1
    echo "sweep:   failed with exit $rc: $(grep -m1 -i error "$run/output.txt" || tail -n1 "$run/output.txt")"
  fi
done
[ "$dry_run" -eq 0 ] || exit 0

# The table: one row per run, its grid values, then the results read from metrics.jsonl.
python3 - "$out/summary.tsv" "${grids[@]%%=*}" -- "${run_dirs[@]}" <<'PY'
import json, os, statistics, sys
args = sys.argv[1:]
tsv, rest = args[0], args[1:]
keys, runs = rest[:rest.index("--")], rest[rest.index("--") + 1:]
header = ["run", *keys, "final_loss", "valid_loss", "tokens_per_s", "status"]
rows = []
for run in runs:
    name = os.path.basename(run)
    values = dict(kv.split("=", 1) for kv in open(os.path.join(run, "point.txt")).read().splitlines())
    train, valid = {}, {}
    path = os.path.join(run, "metrics.jsonl")
    if os.path.exists(path):
        for line in open(path):
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "loss" in r:
                train[r["iteration"]] = r
            elif "valid_loss" in r:
                valid[r["iteration"]] = r
    rc = open(os.path.join(run, "exit_code")).read().strip() if os.path.exists(os.path.join(run, "exit_code")) else "?"
    last = train[max(train)] if train else None
    # Throughput: the median over the logged intervals after the first (which holds the start-up).
    speeds = [train[i]["tokens_per_s"] for i in sorted(train)][1:] or [r["tokens_per_s"] for r in train.values()]
    rows.append([name, *[values.get(k, "?") for k in keys],
                 f"{last['loss']:.4f}" if last else "-",
                 f"{valid[max(valid)]['valid_loss']:.4f}" if valid else "-",
                 f"{statistics.median(speeds):.0f}" if speeds else "-",
                 "ok" if rc == "0" else f"failed ({rc})"])
# The run name repeats the grid values: show it only in the TSV.
with open(tsv, "w") as f:
    for r in [header, *rows]:
        f.write("\t".join(r) + "\n")
shown = [r[1:] for r in [header, *rows]]
width = [max(len(r[i]) for r in shown) for i in range(len(shown[0]))]
for j, r in enumerate(shown):
    print("  ".join(c.ljust(w) if i < len(keys) or i == len(r) - 1 else c.rjust(w) for i, (c, w) in enumerate(zip(r, width))).rstrip())
    if j == 0:
        print("  ".join("-" * w for w in width))
print(f"sweep: {len(rows)} runs; table in {tsv}")
PY
exit "$failed"
