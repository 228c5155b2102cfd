#!/usr/bin/env bash
# Pipeline parallelism (1F1B and interleaved 1F1B over the schedules of parallel/schedule, tied embeddings
# summed between the first and last stage) keeps the single-rank loss curve, alone and combined with TP, SP
# and DP, fp32 within 1e-4 and bf16 within 1e-2, dropout on; a checkpoint saved at TP=2 x PP=2 x DP=2 resumes
# at TP=4 x PP=1 x DP=2 and at one rank, continuing the uninterrupted losses within 1e-4.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
common=(--config tiny.yaml --set model.num_layers=4 --set training.micro_batch_size=1
        --set training.global_batch_size=8 --set training.train_iters=8 --set parallel.timeout_s=60
        --set logging.eval_interval=4 --set logging.eval_iters=1)
for precision in fp32 bf16; do
  tol=1e-4; [ $precision = bf16 ] && tol=1e-2
  "$MT" "${common[@]}" --set training.precision=$precision --set logging.dir=one_$precision >/dev/null
  # world tp pp vp dp sp
  # world tp pp vp dp sp zero
  for layout in "2 1 2 1 1 false false" "4 1 4 1 1 false false" "2 1 2 2 1 false false" "8 2 2 1 2 true true" \
                "8 2 2 2 2 false false" "4 1 2 1 2 false true"; do
    read -r world tp pp vp dp sp zero <<<"$layout"
    dir=tp${tp}pp${pp}vp${vp}dp${dp}sp${sp}zero${zero}_$precision
    "$MT" "${common[@]}" --nproc "$world" --set training.precision=$precision --set parallel.tensor=$tp \
          --set parallel.pipeline=$pp --set parallel.virtual_pipeline=$vp --set parallel.sequence_parallel=$sp \
          --set parallel.distributed_optimizer=$zero --set logging.dir=$dir >/dev/null 2>"$dir.err" || { tail -5 "$dir.err"; fail "$dir failed"; }
    same_losses one_$precision/metrics.jsonl $dir/metrics.jsonl 1 8 $tol
  done
done
# Validation losses (evaluation runs a forward_only schedule through the pipeline executor) agree too, in
# every fp32 layout: plain, interleaved, with TP, SP and DP.
python3 - <<'PY'
import glob, json
def valid(p):
    return [r["valid_loss"] for r in map(json.loads, open(p)) if "valid_loss" in r]
a = valid("one_fp32/metrics.jsonl")
layouts = sorted(glob.glob("tp*_fp32/metrics.jsonl"))
assert len(layouts) == 6, layouts
for path in layouts:
    b = valid(path)
    assert len(a) == 2 and len(b) == 2 and all(abs(x - y) <= 1e-4 * x for x, y in zip(a, b)), (path, a, b)
    print("validation losses", path, a, b)
PY
# Save at TP=2 x PP=2 x DP=2 (distributed optimizer) after iteration 4; resume at TP=4 x PP=1 x DP=2 and at one rank.
"$MT" "${common[@]}" --nproc 8 --set parallel.tensor=2 --set parallel.pipeline=2 --set logging.dir=saved \
      --set parallel.distributed_optimizer=true \
      --set checkpoint.save_dir=ckpt --exit-after 4 >/dev/null 2>saved.err || { tail -5 saved.err; fail "save run"; }
[ "$(cat ckpt/latest)" = iter_0000004 ] || fail "no checkpoint at iteration 4"
"$MT" ckpt inspect ckpt --verify >/dev/null || fail "the TP=2 x PP=2 x DP=2 checkpoint does not verify"
cp -r ckpt ckpt1
"$MT" "${common[@]}" --nproc 8 --set parallel.tensor=4 --set logging.dir=resumed8 --set checkpoint.save_dir=ckpt \
      >/dev/null 2>resumed8.err || { tail -5 resumed8.err; fail "resume at TP=4 x DP=2"; }
same_losses one_fp32/metrics.jsonl resumed8/metrics.jsonl 5 8 1e-4
"$MT" "${common[@]}" --set logging.dir=resumed1 --set checkpoint.save_dir=ckpt1 >/dev/null
same_losses one_fp32/metrics.jsonl resumed1/metrics.jsonl 5 8 1e-4
