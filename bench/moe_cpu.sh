#!/usr/bin/env bash
# moe_cpu.sh: a mixture-of-experts llama's training throughput on the CPU against the dense llama of the same active
# size, and the expert-parallel all-to-all's bytes per token (issue 25).
#
# Shape: llama, LAYERS layers, hidden C, 4 heads, sequence S, micro batch = global batch B, vocabulary 257, synthetic
# tokens, fp32, AdamW. MoE: every MLP E SwiGLU experts of width F, top K (softmax, renormalised, the aux loss on);
# dense: one SwiGLU MLP of width K * F, the same active MLP weights (the MoE layer adds its (E, C) router).
# One rank, OPENBLAS_NUM_THREADS=1, WARMUP untimed + ITERS timed iterations each, alternating for ROUNDS rounds
# (the machine may be shared); each side's figures are medians over rounds of: the timed iterations' mean
# (metrics.jsonl's ms_per_iter and tokens_per_s), and the CPU ms per timed iteration (the CPU time of the whole
# run minus that of a WARMUP-only run, over ITERS: the steadier figure on a loaded machine, one thread).
#
# All-to-all bytes per token and MoE layer: the formula 2 (dispatch, combine) x 2 (forward, backward) x K x C x 4
# bytes x (EP - 1) / EP (plan's all_to_all_bytes_per_token), and, where gcc can build a small LD_PRELOAD counter of
# the bytes the ranks write to sockets, measured: two EP=2 runs on 2 ranks (data 2, expert 2) at sequence S and
# S / 2, the difference of their socket bytes over the difference of their tokens (the gradient reduction, the
# count exchange and the rendezvous do not depend on the sequence and cancel), per rank and MoE layer.
#
# Usage: bench/moe_cpu.sh [build/megatrain]
# Env: WARMUP (2), ITERS (4), ROUNDS (2), LAYERS (4), C (256), S (256), B (8), E (8), K (2), F (256).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MT=${1:-$ROOT/build/megatrain}
[[ -x $MT ]] || { echo "moe_cpu: no megatrain binary at $MT" >&2; exit 1; }
WARMUP=${WARMUP:-2} ITERS=${ITERS:-4} ROUNDS=${ROUNDS:-2}
LAYERS=${LAYERS:-4} C=${C:-256} S=${S:-256} B=${B:-8} E=${E:-8} K=${K:-2} F=${F:-256}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

cat > "$WORK/shape.yaml" <<YAML
model: {arch: llama, num_layers: $LAYERS, hidden_size: $C, num_heads: 4, ffn_hidden_size: $((K * F)), seq_length: $S,
        vocab_size: 257, tie_embeddings: false, dropout: 0.0, attention_dropout: 0.0}
training: {micro_batch_size: $B, global_batch_size: $B, train_iters: $((WARMUP + ITERS)), precision: fp32, seed: 1}
optimizer: {lr: 1.0e-4, warmup_iters: 0}
data: {synthetic: true}
checkpoint: {save_dir: "", load: none}
logging: {interval: 1, eval_interval: 0}
YAML
moe=(--set model.moe.num_experts="$E" --set model.moe.top_k="$K" --set model.moe.ffn_hidden_size="$F"
     --set model.moe.aux_loss_coeff=0.01)

# CPU seconds (user + system) of a command, its output to a file.
cpu_seconds() {  # log command...
  python3 - "$@" <<'PY'
import resource, subprocess, sys
with open(sys.argv[1], "w") as log:
    rc = subprocess.run(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT).returncode
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{r.ru_utime + r.ru_stime:.3f}")
sys.exit(rc)
PY
}
# tag, more megatrain arguments -> "wall_ms cpu_ms tokens_per_s" of one rank's timed iterations
run_timed() {
  local dir=$WORK/$1 full warm
  shift
  rm -rf "$dir" "$dir-warm"
  full=$(cpu_seconds "$dir.out" "$MT" --config "$WORK/shape.yaml" --set "logging.dir=$dir" "$@") ||
    { tail -n 20 "$dir.out" >&2; echo "moe_cpu: megatrain failed (log above)" >&2; exit 1; }
  warm=$(cpu_seconds "$dir-warm.out" "$MT" --config "$WORK/shape.yaml" --set "logging.dir=$dir-warm" \
    --set "training.train_iters=$WARMUP" "$@") || { tail -n 20 "$dir-warm.out" >&2; exit 1; }
  python3 - "$dir/metrics.jsonl" "$WARMUP" "$ITERS" "$full" "$warm" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("ms_per_iter") is not None and r["iteration"] > int(sys.argv[2])]
cpu = (float(sys.argv[4]) - float(sys.argv[5])) / int(sys.argv[3]) * 1000.0
print(f'{sum(r["ms_per_iter"] for r in rows) / len(rows):.1f} {cpu:.1f} '
      f'{sum(r["tokens_per_s"] for r in rows) / len(rows):.1f}')
PY
}
run() {  # tag, more megatrain arguments -> "ms_per_iter tokens_per_s" of the timed iterations
  local dir=$WORK/$1
  shift
  rm -rf "$dir"
  "$MT" --config "$WORK/shape.yaml" --set "logging.dir=$dir" "$@" >"$dir.out" 2>&1 ||
    { tail -n 20 "$dir.out" >&2; echo "moe_cpu: megatrain failed (log above)" >&2; exit 1; }
  python3 - "$dir/metrics.jsonl" "$WARMUP" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("ms_per_iter") is not None and r["iteration"] > int(sys.argv[2])]
print(f'{sum(r["ms_per_iter"] for r in rows) / len(rows):.1f} {sum(r["tokens_per_s"] for r in rows) / len(rows):.1f}')
PY
}
median() { tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

echo "moe_cpu: $(lscpu | sed -n "s/^Model name: *//p" | head -1), $(getconf _NPROCESSORS_ONLN) cores, one thread a rank, fp32"
echo "llama layers $LAYERS hidden $C seq $S micro batch $B; MoE $E experts of width $F top $K; dense ffn $((K * F))"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
dense_ms=() dense_cpu=() dense_tps=() moe_ms=() moe_cpu=() moe_tps=()
for ((r = 1; r <= ROUNDS; ++r)); do
  read -r ms cpu tps < <(run_timed dense-$r)
  dense_ms+=("$ms") dense_cpu+=("$cpu") dense_tps+=("$tps")
  read -r ms cpu tps < <(run_timed moe-$r "${moe[@]}")
  moe_ms+=("$ms") moe_cpu+=("$cpu") moe_tps+=("$tps")
  echo "round $r: dense ${dense_ms[-1]} ms/iter (cpu ${dense_cpu[-1]}) ${dense_tps[-1]} tokens/s;" \
       "moe ${moe_ms[-1]} ms/iter (cpu ${moe_cpu[-1]}) ${moe_tps[-1]} tokens/s"
done
dm=$(echo "${dense_ms[*]}" | median) dc=$(echo "${dense_cpu[*]}" | median) dt=$(echo "${dense_tps[*]}" | median)
mm=$(echo "${moe_ms[*]}" | median) mc=$(echo "${moe_cpu[*]}" | median) mtps=$(echo "${moe_tps[*]}" | median)
printf '%-28s %10s %12s %10s\n' "one rank (median)" "ms/iter" "cpu ms/iter" "tokens/s"
printf '%-28s %10s %12s %10s\n' "dense (ffn $((K * F)))" "$dm" "$dc" "$dt" "MoE ($E x $F, top $K)" "$mm" "$mc" "$mtps"
python3 -c "print(f'MoE / dense tokens/s: {$mtps / $dt:.3f} (wall), {$dc / $mc:.3f} (cpu time)')"

# Expert parallelism 2 on 2 ranks: throughput and the all-to-all's bytes.
ep=(--nproc 2 --set parallel.data=2 --set parallel.expert=2 --set training.global_batch_size=$((2 * B)))
read -r ms tps < <(run ep2 "${moe[@]}" "${ep[@]}")
echo "MoE EP=2 on 2 ranks (global batch $((2 * B))): $ms ms/iter, $tps tokens/s (both ranks)"
python3 -c "print(f'all-to-all bytes per token and MoE layer, formula: {2 * 2 * $K * $C * 4 * (2 - 1) / 2:.0f}')"
if gcc -O2 -shared -fPIC -o "$WORK/count.so" -x c - -ldl 2>/dev/null <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
/* Bytes written to sockets by this process (write, writev, send, sendmsg), dumped at exit. */
static atomic_llong sent;
static void add(int fd, ssize_t n) {
  struct stat st;
  if (n > 0 && fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) atomic_fetch_add(&sent, n);
}
#define NEXT(name) static __typeof__(name)* f; if (!f) f = (__typeof__(name)*)dlsym(RTLD_NEXT, #name)
ssize_t write(int fd, const void* b, size_t n) { NEXT(write); ssize_t r = f(fd, b, n); add(fd, r); return r; }
ssize_t writev(int fd, const struct iovec* v, int c) { NEXT(writev); ssize_t r = f(fd, v, c); add(fd, r); return r; }
ssize_t send(int fd, const void* b, size_t n, int fl) { NEXT(send); ssize_t r = f(fd, b, n, fl); add(fd, r); return r; }
ssize_t sendmsg(int fd, const struct msghdr* m, int fl) { NEXT(sendmsg); ssize_t r = f(fd, m, fl); add(fd, r); return r; }
__attribute__((destructor)) static void dump(void) {
  const char* dir = getenv("SOCKET_BYTES_DIR");
  char path[4096];
  if (!dir) return;
  snprintf(path, sizeof path, "%s/%d", dir, (int)getpid());
  FILE* out = fopen(path, "w");
  if (out) fprintf(out, "%lld\n", (long long)sent), fclose(out);
}
C
then
  socket_bytes() {  # seq -> the bytes all processes wrote to sockets in an EP=2 run at that sequence length
    rm -rf "$WORK/bytes" && mkdir "$WORK/bytes"
    SOCKET_BYTES_DIR=$WORK/bytes LD_PRELOAD=$WORK/count.so run "ep2-s$1" "${moe[@]}" "${ep[@]}" \
      --set model.seq_length="$1" >/dev/null
    cat "$WORK/bytes"/* | awk '{s += $1} END {print s}'
  }
  long=$(socket_bytes "$S") short=$(socket_bytes $((S / 2)))
  python3 - "$long" "$short" <<PY
import sys
long, short = float(sys.argv[1]), float(sys.argv[2])
iters, ranks = $WARMUP + $ITERS, 2
tokens = iters * $B * ($S - $S // 2)  # more tokens per rank in the long run
per = (long - short) / ranks / tokens / $LAYERS
print(f"all-to-all bytes per token and MoE layer, measured (socket bytes, S={$S} minus S={$S // 2}): {per:.0f}")
PY
else
  echo "all-to-all bytes, measured: skipped (no gcc to build the socket byte counter)"
fi
