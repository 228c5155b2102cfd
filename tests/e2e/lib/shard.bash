# shard.bash: what the ZeRO stages' tests share (tests/e2e/shard_*.sh, optimizer_offload.sh).

# Runs megatrain with the arguments after $1 into logging.dir $1, quietly; fails with the error's tail.
run() {
  local dir=$1
  shift
  "$MT" "$@" --set logging.dir=$dir >/dev/null 2>$dir.err || { tail -5 $dir.err; fail "$dir failed"; }
}

# The arguments of a run of config $1.yaml at layout "tp pp dp" ($2) with one microbatch per rank (global batch
# = DP x micro batch size 2), SP with TP, after the caller's base[] arguments: sets tp, pp, dp and args[].
one_microbatch_layout() {
  read -r tp pp dp <<<"$2"
  local sp=false
  [ $tp -gt 1 ] && sp=true
  args=(--config $1.yaml "${base[@]}" --nproc $((tp * pp * dp)) --set parallel.tensor=$tp --set parallel.pipeline=$pp
        --set parallel.sequence_parallel=$sp --set training.global_batch_size=$((2 * dp)))
}

# The layout-free checkpoint check. Saved under
# parallel.shard $1 at DP=4 and resumed under none at DP=2 gives the losses of the same save and resume under none
# throughout (exactly: with one microbatch each stage trains as none bit for bit, and the checkpoint holds no trace
# of the layout); and back, none at DP=2 resumed under $1 at DP=4.
# Arguments after the stage go to its runs only (e.g. parallel.shard_group).
check_layout_free_checkpoints() {  # stage [arguments of the stage's runs...]
  local stage=$1
  local extra=("${@:2}")
  local ck=(--config tiny.yaml --set training.train_iters=8 --set optimizer.warmup_iters=2 --set parallel.timeout_s=60
            --set parallel.grad_bucket_size=3000 --set training.micro_batch_size=2 --set training.global_batch_size=8)
  stage_args() {  # stage: its --set arguments in stage_of[]
    stage_of=(--set parallel.shard=$1)
    [ $1 = none ] || stage_of+=(${extra[@]+"${extra[@]}"})
  }
  save_resume() {  # name shard-before world-before shard-after world-after
    rm -rf $1 ck_$1
    stage_args $2
    "$MT" "${ck[@]}" --nproc $3 "${stage_of[@]}" --set logging.dir=$1 --set checkpoint.save_dir=ck_$1 \
          --exit-after 4 >/dev/null
    [ "$(cat ck_$1/latest)" = iter_0000004 ] || fail "$1: no checkpoint at iteration 4"
    stage_args $4
    "$MT" "${ck[@]}" --nproc $5 "${stage_of[@]}" --set logging.dir=$1 --set checkpoint.save_dir=ck_$1 >/dev/null
    losses $1/metrics.jsonl 1 8 > $1.txt
    [ "$(wc -l < $1.txt)" -eq 8 ] || fail "$1: expected 8 losses"
  }
  save_resume ref_down none 4 none 2
  save_resume down $stage 4 none 2
  diff ref_down.txt down.txt >/dev/null || { paste ref_down.txt down.txt; fail "$stage DP=4 -> none DP=2 differs"; }
  save_resume ref_up none 2 none 4
  save_resume up none 2 $stage 4
  diff ref_up.txt up.txt >/dev/null || { paste ref_up.txt up.txt; fail "none DP=2 -> $stage DP=4 differs"; }
  echo "$stage${extra[*]:+ ${extra[*]}} DP=4 -> none DP=2 and none DP=2 -> $stage DP=4: the losses of the same save and resume under none"
}
