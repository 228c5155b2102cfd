#!/usr/bin/env bash
# fp8_curve.sh: the fp8 loss curve against bf16 over ITERS iterations (issue 29), on configs/gpt-tiny.yaml and
# configs/llama-tiny.yaml (2 layers, hidden 64, sequence 64, global batch 16; the byte-level licence texts of this
# machine, as the demo), one CPU rank, no checkpoints or validation: bf16, then training.fp8 (FORMAT) with the
# current and the delayed recipe (amax history 16). Prints,
# per model and recipe, the worst and the mean relative difference of the per-iteration loss from bf16's, and of
# the mean loss over the last 50 iterations.
#
# Usage: bench/fp8_curve.sh [build/megatrain]
# Env: ITERS (300), RECIPES ("current delayed"; "fp32" adds fp32 against bf16, the gap a mere change of rounding
# makes on these runs), MODELS ("gpt-tiny llama-tiny"), FORMAT (hybrid), EXTRA (more --set arguments for every run,
# e.g. a wider model: EXTRA="--set model.hidden_size=256 --set model.ffn_hidden_size=1024"), SEED (training.seed of
# every run; the configs' 1234 if unset: it draws the initial weights and the data order), KEEP (a folder to copy
# each run's metrics.jsonl into, as MODEL_RUN.jsonl, for later comparison).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MT=${1:-$ROOT/build/megatrain}
[[ -x $MT ]] || { echo "fp8_curve: no megatrain binary at $MT" >&2; exit 1; }
ITERS=${ITERS:-300} RECIPES=${RECIPES:-current delayed} MODELS=${MODELS:-gpt-tiny llama-tiny} FORMAT=${FORMAT:-hybrid}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
MT=$(readlink -f "$MT")
mkdir -p data/demo
mapfile -t inputs < <(find /usr/share/common-licenses -type f | sort)
"$MT" data prepare --input "${inputs[@]}" --output data/demo/licenses_text_document --tokenizer byte >/dev/null
read -r -a extra <<<"${EXTRA:-}"
[[ -n ${SEED:-} ]] && extra+=(--set training.seed=$SEED)
[[ -n ${KEEP:-} ]] && { mkdir -p "$KEEP"; KEEP=$(readlink -f "$KEEP"); }
common=(--set training.train_iters=$ITERS --set training.precision=bf16 --set logging.interval=1
        --set logging.eval_interval=0 --set checkpoint.save_dir= --set checkpoint.load=none "${extra[@]}")
compare() {  # bf16 metrics, fp8 metrics, label
  [[ -n ${KEEP:-} ]] && cp "$1" "$KEEP/${1%%/*}.jsonl" && cp "$2" "$KEEP/${2%%/*}.jsonl"
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
def losses(p):
    return {r["iteration"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
its = sorted(a)
rel = [abs(b[i] - a[i]) / abs(a[i]) for i in its]
tail = its[-50:]
ma, mb = sum(a[i] for i in tail) / len(tail), sum(b[i] for i in tail) / len(tail)
print(f"{sys.argv[3]:<22} iters {len(its)}  max rel {max(rel):.4f}  mean rel {sum(rel)/len(rel):.4f}  "
      f"last-50 mean bf16 {ma:.4f} fp8 {mb:.4f} ({(mb - ma) / ma:+.4f})  final bf16 {a[its[-1]]:.4f} fp8 {b[its[-1]]:.4f}")
PY
}
for model in $MODELS; do
  "$MT" --config "$ROOT/configs/$model.yaml" "${common[@]}" --set logging.dir=${model}_bf16 >/dev/null
  for recipe in $RECIPES; do
    if [ "$recipe" = fp32 ]; then
      "$MT" --config "$ROOT/configs/$model.yaml" "${common[@]}" --set training.precision=fp32 \
            --set logging.dir=${model}_fp32 >/dev/null
      compare ${model}_bf16/metrics.jsonl ${model}_fp32/metrics.jsonl "$model fp32 (no fp8)"
      continue
    fi
    "$MT" --config "$ROOT/configs/$model.yaml" "${common[@]}" --set training.fp8.format=$FORMAT --set training.fp8.recipe=$recipe \
          --set training.fp8.amax_history_len=16 --set logging.dir=${model}_$recipe >/dev/null
    compare ${model}_bf16/metrics.jsonl ${model}_$recipe/metrics.jsonl "$model $FORMAT $recipe"
  done
done
