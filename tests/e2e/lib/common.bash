# common.bash: shared set-up for the end-to-end tests. Each test runs as
#   bash tests/e2e/NAME.sh MEGATRAIN_BINARY SOURCE_DIR
set -euo pipefail
MT=$1
SRC=$2
WORK=$(mktemp -d /tmp/megatrain-e2e.XXXXXX)
PY_WORKER=""
trap '[ -z "$PY_WORKER" ] || kill "$PY_WORKER" 2>/dev/null; rm -rf "$WORK"' EXIT
cd "$WORK"

fail() { echo "FAIL: $*" >&2; exit 1; }

# GPU tests skip (ctest's SKIP_RETURN_CODE 77), saying why, unless this binary can use a GPU here.
require_gpu() {
  local info
  info=$("$MT" info --require-gpu 2>&1) || { echo "SKIP: no usable GPU: $(grep -E '^(cuda backend|gpus):' <<<"$info" | tr '\n' ' ')"; exit 77; }
}

# The interop tests' Python: the environment scripts/python-env.sh makes beside the binary (build/interop-venv,
# the packages tests/interop/requirements.txt pins; scripts/test.sh makes it), or $MEGATRAIN_INTEROP_PYTHON.
# require_interop_python MODULE...: works offline and sets PY, which runs like that Python ("$PY" SCRIPT ARGS,
# "$PY" -c CODE, "$PY" - <<EOF) in one worker per test that imported the modules once (tests/interop/py_worker.py:
# torch and transformers take seconds to import, more than most checks). Without the environment the test skips
# (77), saying how to make it; an environment that cannot import a named module is broken, and the test fails
# naming it.
INTEROP_PYTHON=${MEGATRAIN_INTEROP_PYTHON:-$(dirname "$MT")/interop-venv/bin/python}
require_interop_python() {
  if [ ! -x "$INTEROP_PYTHON" ]; then
    echo "SKIP: no interop Python at $INTEROP_PYTHON (scripts/python-env.sh $(dirname "$MT") makes it;" \
         "scripts/test.sh does)"
    exit 77
  fi
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  [ -z "$PY_WORKER" ] || return 0
  mkfifo "$WORK/py-requests" "$WORK/py-replies"
  "$INTEROP_PYTHON" "$SRC/tests/interop/py_worker.py" "$WORK/py-requests" "$WORK/py-replies" "$@" &
  PY_WORKER=$!
  exec {PY_REPLIES}<"$WORK/py-replies"
  local ready=""
  read -r ready <&$PY_REPLIES || true
  [ "$ready" = ready ] || fail "the interop Python $INTEROP_PYTHON: ${ready:-it exited}" \
                              "(scripts/python-env.sh installs tests/interop/requirements.txt)"
  exec {PY_REQUESTS}>"$WORK/py-requests"
  PY=interop_py
}

# interop_py ARGS...: what "$INTEROP_PYTHON" ARGS does, run by the test's worker (require_interop_python); its
# output comes once it has finished.
interop_py() {
  local request status=""
  request=$(mktemp "$WORK/py-request.XXXXXX")
  [ "${1:-}" != - ] || cat >"$request.code"
  python3 -c 'import json, os, sys
request, argv = sys.argv[1], sys.argv[2:]
json.dump({"cwd": os.getcwd(), "argv": argv, "env": dict(os.environ), "code_file": request + ".code",
           "out": request + ".out", "err": request + ".err"}, open(request, "w"))' "$request" "$@"
  echo "$request" >&$PY_REQUESTS
  read -r status <&$PY_REPLIES || { echo "the interop Python worker exited" >&2; return 1; }
  cat "$request.out"
  cat "$request.err" >&2
  rm -f "$request" "$request".*
  return "$status"
}

# have_interop_python MODULE...: for a part of a test that needs the interop Python: sets PY and returns 0 when it is
# there, else says the part is skipped (skip_part) and returns 1.
have_interop_python() {
  if [ ! -x "$INTEROP_PYTHON" ]; then
    skip_part "no interop Python at $INTEROP_PYTHON (scripts/python-env.sh $(dirname "$MT") makes it)"
    return 1
  fi
  require_interop_python "$@"
}

# skip_part REASON: a part of a test that cannot run here says so. Under CI (CI=true) nothing but a GPU test may skip
# (scripts/test.sh installs everything else), so there it fails the test instead.
skip_part() {
  [ "${CI:-}" != true ] || fail "a part would be skipped under CI: $1"
  echo "SKIP (part): $1"
}

# A byte-level dataset of the licence texts every Debian system has: data/text_document.
prepare_data() {
  mkdir -p data
  mapfile -t inputs < <(find /usr/share/common-licenses -type f | sort)
  "$MT" data prepare --input "${inputs[@]}" --output data/text_document --tokenizer byte >/dev/null
}

# A tiny config for fast runs; tests adjust it with --set. It pins the CPU reference backend, so these tests
# mean the same on a GPU machine; the gpu_* tests set training.device=cuda.
write_config() {
  { cat <<'YAML'
model: {num_layers: 2, hidden_size: 32, num_heads: 4, ffn_hidden_size: 128, seq_length: 32, vocab_size: 257,
        dropout: 0.1, attention_dropout: 0.1}
YAML
    tiny_run_sections; } > tiny.yaml
}

# The Llama twin of tiny.yaml: llama.yaml, 8 query heads of 4 sharing 4 key/value heads (tensor parallelism up
# to 4), SwiGLU 96 wide, rotary embeddings, untied embeddings, dropout on; the other sections as tiny.yaml's.
write_llama_config() {
  { cat <<'YAML'
model: {arch: llama, num_layers: 2, hidden_size: 32, num_heads: 8, num_query_groups: 4, ffn_hidden_size: 96,
        seq_length: 32, vocab_size: 257, rotary_base: 10000, dropout: 0.1, attention_dropout: 0.1}
YAML
    tiny_run_sections; } > llama.yaml
}

# Everything of the tiny configs but the model.
tiny_run_sections() {
  cat <<'YAML'
training: {micro_batch_size: 4, global_batch_size: 8, train_iters: 20, precision: fp32, seed: 42, device: cpu}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup_iters: 5, weight_decay: 0.1, betas: [0.9, 0.95]}
data: {train: [data/text_document], split: [95, 5, 0]}
checkpoint: {save_dir: "", load: auto}
logging: {dir: run, interval: 1}
YAML
}

# Losses of metrics file $1 for iterations in [$2, $3], one "iteration loss" per line.
losses() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
lo, hi = int(sys.argv[2]), int(sys.argv[3])
for r in rows:
    if "loss" in r and lo <= r["iteration"] <= hi:
        print(r["iteration"], repr(r["loss"]))
PY
}

# Runs megatrain expecting failure: $1 is a pattern the error must contain, the rest the arguments.
expect_error() {
  local pattern=$1; shift
  local rc=0
  "$MT" "$@" >out.txt 2>err.txt || rc=$?
  [ "$rc" -ne 0 ] || fail "expected failure for: $* (exit 0)"
  [ "$rc" -lt 128 ] || fail "crashed with exit $rc for: $*"
  grep -q -- "$pattern" err.txt || { cat err.txt >&2; fail "error for '$*' lacks '$pattern'"; }
  echo "ok: $* -> $(head -c 300 err.txt | tr '\n' ' ')"
}

# A free TCP port on loopback.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Runs megatrain as N ranks started by a shell loop with torchrun-style variables: run_ranks N ARGS...
# Waits for all; fails if any rank fails (their output is in rank<R>.log).
run_ranks() {
  local n=$1; shift
  local port pids=() r rc=0
  port=$(free_port)
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$MT" "$@" >"rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do wait "${pids[$r]}" || { echo "rank $r failed:"; tail -5 "rank$r.log"; rc=1; }; done
  return $rc
}

# Compares the losses of two metrics files over iterations [lo, hi] within a relative tolerance.
same_losses() {
  python3 - "$@" <<'PY'
import json, sys
a_path, b_path, lo, hi, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
def losses(p):
    out = {}
    for l in open(p):
        r = json.loads(l)
        if "loss" in r and lo <= r["iteration"] <= hi:
            out[r["iteration"]] = r["loss"]   # a resumed run's later lines win
    return out
a, b = losses(a_path), losses(b_path)
assert sorted(a) == list(range(lo, hi + 1)) and sorted(b) == sorted(a), f"iterations differ: {sorted(a)} vs {sorted(b)}"
worst = max(abs(a[i] - b[i]) / abs(a[i]) for i in a)
print(f"{b_path} vs {a_path}: iterations {lo}-{hi}, worst relative difference {worst:.2e} (tolerance {tol:g})")
assert worst <= tol, "losses differ"
PY
}

# pipeline("text-generation") on the Hugging Face export in ./hf continues a prompt with text (greedy, 8 new tokens):
# check_text_generation PYTHON LABEL, PYTHON one with torch and transformers.
check_text_generation() {
  "$1" - "$2" <<'PY'
import json, sys
from transformers import pipeline
arch = json.load(open("hf/config.json"))["architectures"][0]
gen = pipeline("text-generation", model="hf", tokenizer="hf", device="cpu")
out = gen("Hello, world", max_new_tokens=8, do_sample=False)[0]["generated_text"]
assert isinstance(out, str) and out.startswith("Hello, world") and len(out) > len("Hello, world"), out
print(f"{sys.argv[1]}: pipeline('text-generation') on the {arch} export: {out!r}")
PY
}

# The mixture-of-experts twin of llama.yaml: moe.yaml, every layer's MLP 4 SwiGLU experts of width 32 with top-2
# routing (softmax, renormalised) beside a shared expert of width 32, the auxiliary and z losses on; the other
# sections as tiny.yaml's.
write_moe_config() {
  { cat <<'YAML'
model: {arch: llama, num_layers: 2, hidden_size: 32, num_heads: 8, num_query_groups: 4, ffn_hidden_size: 96,
        seq_length: 32, vocab_size: 257, rotary_base: 10000, dropout: 0.1, attention_dropout: 0.1,
        moe: {num_experts: 4, top_k: 2, ffn_hidden_size: 32, shared_expert_ffn_hidden_size: 32,
              aux_loss_coeff: 0.01, z_loss_coeff: 0.001}}
YAML
    tiny_run_sections; } > moe.yaml
}
