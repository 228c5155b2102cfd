#!/usr/bin/env bash
# fp16 with the dynamic loss scaler: the scale backs off from 2^32 with skipped steps counted, then
# grows after `window` clean steps.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
"$MT" --config tiny.yaml --set training.precision=fp16 --set training.train_iters=60 \
      --set training.loss_scale.window=10 > log.txt
python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("run/metrics.jsonl") if '"loss"' in l]
scales = [r["loss_scale"] for r in rows]
skipped = rows[-1]["skipped_iters"]
first = rows[0]
assert first["loss_scale"] <= 2.0**32, first
assert skipped > 0, "no step was skipped starting from 2^32"
assert min(scales) < 2.0**32, "the scale never backed off"
low = scales.index(min(scales))
assert any(s > min(scales) for s in scales[low:]), "the scale never grew after backing off"
assert rows[-1]["loss"] < rows[0]["loss"], "fp16 training did not lower the loss"
print(f"skipped {skipped} steps, scale 2^32 -> {min(scales):g} -> {scales[-1]:g}")
PY
grep -q "loss scale" log.txt || fail "log line lacks the loss scale"
