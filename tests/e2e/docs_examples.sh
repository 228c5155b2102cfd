#!/usr/bin/env bash
# Every ```bash block of README.md and docs/*.md runs, so that the docs' examples cannot rot.
#
# tests/e2e/lib/docs_blocks.py extracts the blocks (and fails on a fence without a language: what is not meant to
# run is fenced ```text, ```yaml, ...). Each file gets a scratch directory of its own, a fresh clone as a new user
# has it after the build: build/megatrain (the binary under test, through the wrapper below), configs/, scripts/,
# tests/, bench/ and README.md. Its blocks run there in order (a block may use what an earlier one wrote), each with
# `bash -e -o pipefail`: a command of a doc that fails fails this test, naming the file and line.
#
# What a new user is told to have first:
#  - docs/*.md run on the demo's data ("scripts/demo.sh prepares it"): data/demo/licenses_text_document is prepared
#    as scripts/demo.sh does. README.md starts with nothing: its first commands must prepare what it trains on.
#
# Overrides, so that the whole runs in about 30 s on 2 cores:
#  - build/megatrain appends `--set training.train_iters=$DOCS_TRAIN_ITERS --set optimizer.warmup_iters=1` (2
#    iterations by default, the warmup shorter) to every training run (`megatrain --config ...`, `megatrain train
#    ...`); a resumed run then has nothing left to do, which is fine.
#  - SUBSTITUTIONS below: sed expressions applied to one file's blocks before they run, each with its reason.
#
# Blocks passed over, by the rules of skip_reason below (each printed with its reason, never silently):
#  - builds the project or runs the whole test suite (scripts/demo.sh, scripts/test.sh, scripts/install-deps.sh,
#    cmake): the caller has built it, and ctest runs the suite;
#  - needs the CUDA toolkit or a GPU (scripts/gpu-*.sh);
#  - downloads Python packages (pip install);
#  - needs the interop Python (tests/interop/hf_tiny_model.py, scripts/lora_example.sh, build/interop-venv: torch,
#    transformers, matplotlib), unless scripts/python-env.sh made it beside the binary (under CI=true, where
#    scripts/test.sh makes it, its absence fails the test instead);
#  - starts TensorBoard's server (tensorboard --logdir), which runs until stopped;
#  - needs Slurm (srun, sbatch).
source "$(dirname "$0")/lib/common.bash"
DOCS_TRAIN_ITERS=${DOCS_TRAIN_ITERS:-2}

# file|sed expression|why
SUBSTITUTIONS=(
  "README.md|s/seq_length: 16384/seq_length: 1024/|the 16k-token context-parallel example takes about 40 s on 2 "\
"cores; 1024 tokens run the same commands"
  "docs/parallelism.md|s/MASTER_PORT=29500/MASTER_PORT=$(free_port)/|a free port: another test may hold 29500"
  "docs/planner.md|s/bench kernels -o rates.yaml/& --min-seconds 0.005/|each rate timed 5 ms instead of 50 (about"\
" 17 s instead of 27): the next command needs a rates file, not precise rates"
)

INTEROP_VENV=$(dirname "$(dirname "$INTEROP_PYTHON")")  # common.bash's interop Python, its environment

# Why block $1 is passed over, or nothing when it runs.
skip_reason() {
  local b=$1
  if grep -Eq 'scripts/(demo|test|install-deps)\.sh|^cmake ' "$b"; then
    echo "builds the project or runs the whole test suite (the caller has built it; ctest runs the suite)"
  elif grep -Eq 'scripts/gpu-[a-z]+\.sh' "$b"; then
    echo "needs the CUDA toolkit or a GPU"
  elif grep -Eq 'pip install' "$b"; then
    echo "downloads Python packages"
  elif grep -Eq 'hf_tiny_model\.py|scripts/lora_example\.sh|build/interop-venv' "$b" && ! [ -x "$INTEROP_PYTHON" ]; then
    [ "${CI:-}" != true ] || fail "$b needs the interop Python, which CI has (scripts/test.sh makes $INTEROP_VENV)"
    echo "needs the interop Python ($INTEROP_VENV: scripts/python-env.sh makes it)"
  elif grep -Eq '^[^#]*tensorboard --logdir' "$b"; then
    echo "starts TensorBoard's server (where it is installed), which runs until stopped"
  elif grep -Eq '(^|[;&|[:space:]])(srun|sbatch)[[:space:]]' "$b"; then
    echo "needs Slurm"
  fi
}

# A fresh clone's tree, after the build, in directory $1.
scratch_tree() {
  mkdir -p "$1/build"
  cat > "$1/build/megatrain" <<SH
#!/usr/bin/env bash
# The binary under test; training runs cut to $DOCS_TRAIN_ITERS iterations (tests/e2e/docs_examples.sh).
case "\${1-}" in
  --config|-c|train) exec "$MT" "\$@" --set training.train_iters=$DOCS_TRAIN_ITERS --set optimizer.warmup_iters=1 ;;
esac
exec "$MT" "\$@"
SH
  chmod +x "$1/build/megatrain"
  [ ! -d "$INTEROP_VENV" ] || ln -s "$INTEROP_VENV" "$1/build/interop-venv"
  ln -s "$SRC/configs" "$SRC/tests" "$SRC/bench" "$1/"
  cp -r "$SRC/scripts" "$SRC/README.md" "$1/"  # copies: scripts find build/megatrain beside them
}

python3 "$SRC/tests/e2e/lib/docs_blocks.py" blocks "$SRC/README.md" "$SRC"/docs/*.md >/dev/null ||
  fail "tests/e2e/lib/docs_blocks.py: the docs' fences are not all labelled (see above)"
ran=() skipped=()
start=$(date +%s.%N)
prepared=""
while IFS=$'\t' read -r id path line; do
  file=${path#"$SRC/"}
  dir=$WORK/run/${file//\//_}
  if [ ! -d "$dir" ]; then
    scratch_tree "$dir"
    if [ "$file" != README.md ]; then  # the demo's data, as scripts/demo.sh prepares it
      mkdir -p "$dir/data/demo"
      if [ -z "$prepared" ]; then
        mapfile -t inputs < <(find /usr/share/common-licenses -type f | sort; echo "$SRC/README.md")
        "$MT" data prepare --input "${inputs[@]}" --output "$WORK/demo_data" --tokenizer byte >/dev/null
        prepared=yes
      fi
      cp "$WORK/demo_data.bin" "$dir/data/demo/licenses_text_document.bin"
      cp "$WORK/demo_data.idx" "$dir/data/demo/licenses_text_document.idx"
    fi
  fi
  block=blocks/$id.sh
  for s in "${SUBSTITUTIONS[@]}"; do
    IFS='|' read -r sfile expr why <<<"$s"
    if [ "$sfile" = "$file" ] && sed -n "${expr}p" "$block" | grep -q .; then
      sed -i "$expr" "$block"
      echo "$file:$line: changed for this test ($expr): $why"
    fi
  done
  reason=$(skip_reason "$block")
  if [ -n "$reason" ]; then
    skipped+=("$file:$line: $reason")
    continue
  fi
  t0=$(date +%s.%N)
  if ! (cd "$dir" && bash -e -o pipefail "$WORK/$block") > "$WORK/$id.log" 2>&1; then
    tail -n 30 "$WORK/$id.log"
    echo "--- the block:"
    cat "$WORK/$block"
    fail "the bash block at $file:$line fails"
  fi
  ran+=("$file:$line ($(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')") s)")
done < blocks/blocks.tsv
echo "ran ${#ran[@]} blocks:"
printf '  %s\n' "${ran[@]}"
echo "passed over ${#skipped[@]} blocks:"
printf '  %s\n' "${skipped[@]+"${skipped[@]}"}"
python3 -c "print(f'docs examples: {$(date +%s.%N) - $start:.1f} s')"
