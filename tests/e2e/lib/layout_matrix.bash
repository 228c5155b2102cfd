# layout_matrix.bash: the layout-invariance matrix, shared by layout_matrix_fp32.sh and layout_matrix_bf16.sh.
# Every layout with TP, PP, DP in {1, 2, 4} and 1 < TP x PP x DP <= 8 trains the tiny model (dropout on) 6
# iterations and must give the single-rank losses within the tolerance, in each variant:
#   full: sequence parallelism (TP > 1), the distributed optimizer (DP > 1), interleaving with 2 virtual
#         stages (PP = 2);
#   plain: none of them (DP > 1 then uses the bucketed all-reduce overlapped with backward).
# Small gradient buckets make the overlapped reduction run in several pieces.
# MATRIX_MAX_DEGREE (default 4) bounds TP, PP and DP; MATRIX_ARGS (an array) adds settings to every run,
# the single-rank reference included (the GPU version runs on cuda with host-staged Gloo). MATRIX_CONFIG names the
# model's config file (default tiny.yaml; llama.yaml for the Llama rows).

# matrix_args ARRAY PRECISION LAYERS [ARG...]: into the array named ARRAY, the settings every run of a matrix shares:
# MATRIX_CONFIG's model (default tiny.yaml) with LAYERS layers, micro batch 1, global batch 8, 6 iterations, small
# gradient buckets, the precision; then ARG... and MATRIX_ARGS.
matrix_args() {
  local -n into=$1
  local precision=$2 layers=$3
  shift 3
  into=(--config "${MATRIX_CONFIG:-tiny.yaml}" --set model.num_layers=$layers --set training.micro_batch_size=1
        --set training.global_batch_size=8 --set training.train_iters=6 --set parallel.timeout_s=60
        --set parallel.grad_bucket_size=5000 --set training.precision=$precision "$@"
        ${MATRIX_ARGS[@]+"${MATRIX_ARGS[@]}"})
}

run_layout_matrix() {  # precision tolerance variant...
  local precision=$1 tol=$2; shift 2
  local max=${MATRIX_MAX_DEGREE:-4}
  local common
  matrix_args common "$precision" 8
  "$MT" "${common[@]}" --set logging.dir=one >/dev/null
  local count=0 expected=0 tp pp dp variant world sp zero vp dir
  for variant in "$@"; do
    for tp in 1 2 4; do for pp in 1 2 4; do for dp in 1 2 4; do
      world=$((tp * pp * dp))
      [ $world -le 8 ] && [ $world -gt 1 ] && [ $tp -le $max ] && [ $pp -le $max ] && [ $dp -le $max ] || continue
      expected=$((expected + 1))
      sp=false; zero=false; vp=1
      if [ "$variant" = full ]; then
        [ $tp -gt 1 ] && sp=true
        [ $dp -gt 1 ] && zero=true
        [ $pp -eq 2 ] && vp=2
      fi
      dir=${variant}_tp${tp}pp${pp}dp${dp}
      "$MT" "${common[@]}" --nproc $world --set parallel.tensor=$tp --set parallel.pipeline=$pp \
            --set parallel.virtual_pipeline=$vp --set parallel.sequence_parallel=$sp \
            --set parallel.distributed_optimizer=$zero --set logging.dir=$dir >/dev/null 2>$dir.err \
        || { tail -5 $dir.err; fail "$dir failed"; }
      same_losses one/metrics.jsonl $dir/metrics.jsonl 1 6 "$tol"
      count=$((count + 1))
    done; done; done
  done
  [ $max -ne 4 ] || [ $expected -eq $((16 * $#)) ] || fail "expected $((16 * $#)) layouts, found $expected"
  [ $count -eq $expected ] || fail "expected $expected multi-rank runs, ran $count"
  echo "all $count runs match one rank ($precision)"
}

# Untied embeddings (model.tie_embeddings=false: the first stage owns the embedding, the last its own lm_head)
# in a handful of layouts with PP, TP, DP and interleaving; each must give the untied single-rank losses.
# Before the embedding group was limited to tied embeddings, every PP layout here deadlocked.
run_untied_layouts() {  # precision tolerance
  local precision=$1 tol=$2
  local common
  MATRIX_CONFIG=tiny.yaml matrix_args common "$precision" 4 --set model.tie_embeddings=false
  "$MT" "${common[@]}" --set logging.dir=untied_one >/dev/null
  local layout tp pp dp vp sp zero world dir count=0
  # tp pp dp vp sp zero
  for layout in "1 2 1 1 false false" "1 2 2 2 false true" "2 2 1 1 true false" "1 4 1 1 false false" \
                "2 1 2 1 false false"; do
    read -r tp pp dp vp sp zero <<<"$layout"
    world=$((tp * pp * dp))
    dir=untied_tp${tp}pp${pp}dp${dp}vp${vp}
    "$MT" "${common[@]}" --nproc $world --set parallel.tensor=$tp --set parallel.pipeline=$pp \
          --set parallel.virtual_pipeline=$vp --set parallel.sequence_parallel=$sp \
          --set parallel.distributed_optimizer=$zero --set logging.dir=$dir >/dev/null 2>$dir.err \
      || { tail -5 $dir.err; fail "$dir failed"; }
    same_losses untied_one/metrics.jsonl $dir/metrics.jsonl 1 6 "$tol"
    count=$((count + 1))
  done
  echo "all $count untied-embedding runs match one rank ($precision)"
}

# Sharded gradients (parallel.shard: gradients, ZeRO-2) in a few layouts: DP 4, TP 2 with SP x DP 2, PP 2
# interleaved x DP 2, and PP 2 ZB-H1 x DP 2 (a W deferred past the next microbatch's B); sharded parameters
# (parameters, ZeRO-3) in the same layouts but ZB-H1 (refused); each must give the single-rank losses within the
# tolerance (the matrix's reference run, `one`, made by run_layout_matrix first); and two with hybrid sharding
# (parallel.shard_group 2 of DP 4).
run_shard_layouts() {  # precision tolerance
  local precision=$1 tol=$2
  local common
  matrix_args common "$precision" 8
  [ -f one/metrics.jsonl ] || "$MT" "${common[@]}" --set logging.dir=one >/dev/null
  local layout tp pp dp vp sched sp dir count=0
  # tp pp dp vp schedule
  for layout in "1 1 4 1 auto" "2 1 2 1 auto" "1 2 2 2 auto" "1 2 2 1 zb-h1"; do
    read -r tp pp dp vp sched <<<"$layout"
    sp=false; [ $tp -gt 1 ] && sp=true
    for stage in gradients parameters; do
      [ $stage = parameters ] && [ $sched = zb-h1 ] && continue
      dir=shard_tp${tp}pp${pp}dp${dp}vp${vp}_${sched}_$stage
      "$MT" "${common[@]}" --nproc $((tp * pp * dp)) --set parallel.tensor=$tp --set parallel.pipeline=$pp \
            --set parallel.virtual_pipeline=$vp --set parallel.sequence_parallel=$sp --set parallel.pipeline_schedule=$sched \
            --set parallel.shard=$stage --set logging.dir=$dir >/dev/null 2>$dir.err \
        || { tail -5 $dir.err; fail "$dir failed"; }
      same_losses one/metrics.jsonl $dir/metrics.jsonl 1 6 "$tol"
      count=$((count + 1))
    done
  done
  # Hybrid sharding (parallel.shard_group 2 of DP 4): ZeRO-2 alone and ZeRO-3 with PP 2.
  for layout in "1 1 4 gradients" "1 2 4 parameters"; do
    read -r tp pp dp stage <<<"$layout"
    dir=shard_group2_tp${tp}pp${pp}dp${dp}_$stage
    "$MT" "${common[@]}" --nproc $((tp * pp * dp)) --set parallel.tensor=$tp --set parallel.pipeline=$pp \
          --set parallel.shard=$stage --set parallel.shard_group=2 --set logging.dir=$dir >/dev/null 2>$dir.err \
      || { tail -5 $dir.err; fail "$dir failed"; }
    same_losses one/metrics.jsonl $dir/metrics.jsonl 1 6 "$tol"
    count=$((count + 1))
  done
  echo "all $count sharded-gradient and sharded-parameter runs (hybrid ones included) match one rank ($precision)"
}

# Context parallelism (parallel.context) in the matrix's setting, a representative subset (the full set, 9 layouts
# per architecture over 10 iterations, and the checkpoints moved between CP degrees, is e2e.context_parallel):
# each "cp comm tp pp dp" layout, with SP (TP > 1) and the distributed optimizer over data x context (DP > 1), must
# give the single-rank losses within the tolerance. Dropout off in every run, the reference included (context
# parallelism with dropout, its masks keyed by global positions, is e2e.context_parallel's).
run_context_layouts() {  # precision tolerance "cp comm tp pp dp"...
  local precision=$1 tol=$2; shift 2
  local common
  matrix_args common "$precision" 8 --set model.dropout=0 --set model.attention_dropout=0
  "$MT" "${common[@]}" --set logging.dir=context_one >/dev/null
  local layout cp comm tp pp dp sp zero dir count=0
  for layout in "$@"; do
    read -r cp comm tp pp dp <<<"$layout"
    sp=false; zero=false
    [ "$tp" -gt 1 ] && sp=true
    [ "$dp" -gt 1 ] && zero=true
    dir=context_cp${cp}${comm}_tp${tp}pp${pp}dp${dp}
    "$MT" "${common[@]}" --nproc $((cp * tp * pp * dp)) --set parallel.context=$cp --set parallel.context_comm=$comm \
          --set parallel.tensor=$tp --set parallel.pipeline=$pp --set parallel.data=$dp \
          --set parallel.sequence_parallel=$sp --set parallel.distributed_optimizer=$zero --set logging.dir=$dir \
          >/dev/null 2>$dir.err || { tail -5 $dir.err; fail "$dir failed"; }
    same_losses context_one/metrics.jsonl $dir/metrics.jsonl 1 6 "$tol"
    count=$((count + 1))
  done
  echo "all $count context-parallel runs match one rank ($precision)"
}

# Gloo's TCP path (parallel.gloo_shared_memory false) in layouts whose small collectives otherwise go through shared
# memory: TP 2 x PP 2 x DP 2 and TP 4 x DP 2 of the variant `full` (run_layout_matrix ran them) must give their
# losses bit for bit (both paths sum the ranks' parts in rank order).
run_tcp_layouts() {  # precision
  local precision=$1
  local common
  matrix_args common "$precision" 8 --set parallel.gloo_shared_memory=false
  local layout tp pp dp vp dir
  for layout in "2 2 2 2" "4 1 2 1"; do
    read -r tp pp dp vp <<<"$layout"
    dir=tcp_tp${tp}pp${pp}dp${dp}
    [ -f full_tp${tp}pp${pp}dp${dp}/metrics.jsonl ] || fail "run_layout_matrix full made no full_tp${tp}pp${pp}dp${dp}"
    "$MT" "${common[@]}" --nproc $((tp * pp * dp)) --set parallel.tensor=$tp --set parallel.pipeline=$pp \
          --set parallel.virtual_pipeline=$vp --set parallel.sequence_parallel=true \
          --set parallel.distributed_optimizer=true --set logging.dir=$dir >/dev/null 2>$dir.err \
      || { tail -5 $dir.err; fail "$dir failed"; }
    [ "$(losses $dir/metrics.jsonl 1 6)" = "$(losses full_tp${tp}pp${pp}dp${dp}/metrics.jsonl 1 6)" ] \
      || fail "$dir: the losses over TCP differ from those through shared memory"
  done
  echo "TCP-only runs give the shared-memory runs' losses bit for bit ($precision)"
}
