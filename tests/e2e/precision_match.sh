#!/usr/bin/env bash
# fp16 (dynamic loss scaling) and bf16 runs of the tiny model end within 2% of the fp32 loss.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
for p in fp32 bf16 fp16; do
  "$MT" --config tiny.yaml --set training.precision=$p --set training.train_iters=200 \
        --set logging.interval=10 --set logging.dir=run_$p >/dev/null
done
python3 - <<'PY'
import json
def final(p):
    rows = [json.loads(l) for l in open(f"run_{p}/metrics.jsonl") if '"loss"' in l]
    return rows[-1]["loss"], rows[0]["loss"]
ref, start = final("fp32")
assert ref < 0.75 * start, f"fp32 did not train: {start} -> {ref}"
for p in ("bf16", "fp16"):
    loss, _ = final(p)
    rel = abs(loss - ref) / ref
    print(f"{p}: final loss {loss:.5f} vs fp32 {ref:.5f} ({100 * rel:.2f}%)")
    assert rel < 0.02, f"{p} ends {100 * rel:.2f}% from fp32"
PY
