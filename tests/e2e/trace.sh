#!/usr/bin/env bash
# The timeline (logging.trace, issue 27): a 4-stage pipeline's traced iterations come back as one Chrome trace JSON
# file with a track per rank, every microbatch's forward and backward on every rank, each microbatch's forward
# reaching a stage only after the stage before it finished it (one clock for the ranks of a machine), the data-
# parallel reductions on their reducer threads, the optimizer and a checkpoint save; tracing changes no loss; bad
# trace keys are refused naming them.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
common=(--config tiny.yaml --set model.num_layers=4 --set training.micro_batch_size=1 --set training.train_iters=4
        --set optimizer.warmup_iters=1 --set parallel.timeout_s=60)

# PP 4, 8 microbatches: the second and third iterations (the default).
"$MT" "${common[@]}" --nproc 4 --set parallel.pipeline=4 --set logging.dir=plain >/dev/null 2>plain.err \
  || { tail -5 plain.err; fail "untraced PP 4 run"; }
"$MT" "${common[@]}" --nproc 4 --set parallel.pipeline=4 --set logging.trace=true --set logging.dir=pp4 \
      >/dev/null 2>pp4.err || { tail -5 pp4.err; fail "traced PP 4 run"; }
same_losses plain/metrics.jsonl pp4/metrics.jsonl 1 4 0
grep -q "timeline of the traced iterations up to 3: pp4/trace.json (4 ranks" pp4/megatrain.log \
  || fail "the log does not name the timeline"
python3 - pp4/trace.json <<'PY'
import json, sys
from collections import defaultdict
events = json.load(open(sys.argv[1]))["traceEvents"]
procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
assert procs == {r: f"rank {r} (tp 0 dp 0 pp {r})" for r in range(4)}, procs
spans = [e for e in events if e["ph"] == "X"]
iters = sorted({(e["pid"], e["name"]) for e in spans if e["cat"] == "iteration"})
assert iters == [(r, f"iteration {i}") for r in range(4) for i in (2, 3)], iters
compute = defaultdict(list)  # (rank, "F"/"B", microbatch) -> spans over the two iterations
for e in spans:
    if e["cat"] == "compute":
        op, mb_chunk = e["name"].split()
        assert e["args"]["microbatch"] == int(mb_chunk.split(".")[0]) and e["args"]["chunk"] == 0, e
        compute[(e["pid"], op, e["args"]["microbatch"])].append((e["ts"], e["ts"] + e["dur"]))
assert sorted(compute) == sorted((r, op, m) for r in range(4) for op in "FB" for m in range(8)), sorted(compute)
assert all(len(v) == 2 for v in compute.values()), "each forward and backward once per traced iteration"
# Causality across the ranks' clocks: stage r starts microbatch m's forward after stage r - 1 ended it, and its
# backward after stage r + 1 ended that one (the later of the two iterations' spans pair up the same way).
for it in range(2):
    for m in range(8):
        for r in range(1, 4):
            f_prev, f_here = compute[(r - 1, "F", m)][it], compute[(r, "F", m)][it]
            assert f_here[0] >= f_prev[1] - 50, (it, m, r, f_prev, f_here)  # 50 us: the clocks' read granularity
            b_next, b_here = compute[(r, "B", m)][it], compute[(r - 1, "B", m)][it]
            assert b_here[0] >= b_next[1] - 50, (it, m, r, b_next, b_here)
cats = {e["cat"] for e in spans}
assert {"compute", "p2p", "wait", "optimizer", "iteration"} <= cats, cats
print(f"pp4: {len(spans)} spans, {len(compute)} forwards and backwards in order on 4 ranks")
PY
python3 "$SRC/scripts/trace_summary.py" pp4/trace.json

# TP 2 x DP 2 with the distributed optimizer, iteration 3 only, a checkpoint saved there: reduce-scatters on the
# reducer thread's track, the save in the timeline.
"$MT" "${common[@]}" --nproc 4 --set parallel.tensor=2 --set parallel.distributed_optimizer=true \
      --set logging.trace=true --set "logging.trace_iterations=[3]" --set checkpoint.save_dir=ckpt \
      --set checkpoint.save_interval=3 --set logging.dir=dp2 >/dev/null 2>dp2.err || { tail -5 dp2.err; fail "DP 2 run"; }
python3 - dp2/trace.json <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
spans = [e for e in events if e["ph"] == "X"]
assert {e["name"] for e in spans if e["cat"] == "iteration"} == {"iteration 3"}
for r in range(4):
    rs = [e for e in spans if e["pid"] == r and e["name"].startswith("reduce-scatter gradients bucket")]
    assert rs, f"rank {r} has no reduce-scatter"
    assert all(threads[(r, e["tid"])] == "gradients reducer" for e in rs), [threads[(r, e["tid"])] for e in rs]
    assert any(e["cat"] == "checkpoint" and e["pid"] == r for e in spans), f"rank {r} has no checkpoint span"
print("dp2: reduce-scatters on the reducer tracks, the checkpoint save on every rank")
PY

expect_error "logging.trace_iterations: is set, but logging.trace is false" "${common[@]}" \
  --set "logging.trace_iterations=[2]"
expect_error "logging.trace_iterations\[1\]: 2 does not follow 3" "${common[@]}" --set logging.trace=true \
  --set "logging.trace_iterations=[3, 2]"
expect_error "logging.trace_iterations\[0\]: iteration 9 is past training.train_iters=4" "${common[@]}" \
  --set logging.trace=true --set "logging.trace_iterations=[9]"
echo "trace: ok"
