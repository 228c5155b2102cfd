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
scale = {r["iteration"]: r["loss_scale"] for r in rows}
skipped = {r["iteration"]: r["skipped_iters"] for r in rows}
assert [r["iteration"] for r in rows] == list(range(1, 61)), "expected one metrics line per iteration"
# At 2^32 the first step overflows; hysteresis 2 absorbs it, then every further overflow halves the scale.
assert skipped[1] == 1 and scale[1] == 2.0**32, (skipped[1], scale[1])
assert skipped[2] == 2 and scale[2] == 2.0**31, (skipped[2], scale[2])
backoffs = [i for i in range(2, 61) if scale[i] < scale[i - 1]]
assert all(skipped[i] == skipped[i - 1] + 1 for i in backoffs), "a back-off without a counted skip"
# Growth: the scale doubles exactly after `window` = 10 clean steps.
growths = [i for i in range(2, 61) if scale[i] > scale[i - 1]]
assert growths, "the scale never grew after backing off"
for i in growths:
    assert scale[i] == 2 * scale[i - 1], f"iteration {i}: growth by {scale[i] / scale[i - 1]}"
    assert skipped[i] == skipped[i - 10], f"iteration {i}: grew with a skip in the last 10 steps"
print(f"skipped {skipped[60]} steps; backed off at {backoffs[:12]}..., grew at {growths}")
assert rows[-1]["loss"] < rows[0]["loss"], "fp16 training did not lower the loss"
PY
grep -q "loss scale" log.txt || fail "log line lacks the loss scale"
