#!/usr/bin/env bash
# The command line: version, help on every subcommand (`help X Y` as `X Y --help`), data prepare/inspect, train, eval, ckpt inspect/export.
source "$(dirname "$0")/lib/common.bash"
"$MT" --version | grep -q "megatrain [0-9]" || fail "--version"
for sub in "" train eval data "data prepare" "data inspect" ckpt "ckpt inspect" "ckpt export"; do
  # shellcheck disable=SC2086
  "$MT" $sub --help > help.txt || fail "megatrain $sub --help exits non-zero"
  grep -qi "usage" help.txt || fail "megatrain $sub --help prints no usage"
done
# `megatrain help [COMMAND [SUBCOMMAND]]` prints exactly what `megatrain [COMMAND [SUBCOMMAND]] --help` prints.
for sub in "" train eval generate data "data prepare" ckpt "ckpt export" "ckpt import" plan bench "bench kernels" info; do
  # shellcheck disable=SC2086
  "$MT" $sub --help > help.txt
  # shellcheck disable=SC2086
  "$MT" help $sub > help_cmd.txt || fail "megatrain help $sub exits non-zero"
  diff help.txt help_cmd.txt >/dev/null || { diff help.txt help_cmd.txt; fail "megatrain help $sub differs from --help"; }
done
expect_error "help: 'data bogus' is not a command (megatrain data --help lists them)" help data bogus
expect_error "help: 'bogus' is not a command (megatrain --help lists them)" help bogus
prepare_data
"$MT" data inspect data/text_document > inspect.txt
grep -qi "documents" inspect.txt || fail "data inspect prints no document count"
write_config
"$MT" train --config tiny.yaml --set training.train_iters=6 --set checkpoint.save_dir=ckpt \
      --set logging.interval=2 > train.txt
grep -q "resolved config" train.txt || fail "the resolved config is not printed"
grep -q "num_layers: 2" train.txt || fail "the resolved config lacks the model"
grep -q "tokens/s" train.txt || fail "no log line"
[ "$(grep -c '"loss"' run/metrics.jsonl)" -eq 3 ] || fail "expected 3 metrics lines at interval 2"
"$MT" ckpt inspect ckpt > ckpt.txt
grep -q "layers.1.mlp.fc2.weight" ckpt.txt || fail "ckpt inspect lists no tensors"
"$MT" ckpt inspect ckpt --verify > verify.txt || fail "ckpt inspect --verify"
"$MT" eval --checkpoint ckpt --data data/text_document --samples 8 > eval.txt
grep -q "mean loss" eval.txt || fail "eval prints no loss"
"$MT" ckpt export ckpt --format hf --output hf
[ -s hf/model.safetensors ] && [ -s hf/config.json ] || fail "export wrote no files"
grep -q '"n_layer": *2' hf/config.json || fail "config.json lacks n_layer"
# info: the build's backends and the GPUs; --require-gpu exits 3 when none can be used.
"$MT" info > info.txt
grep -q "^cuda backend: " info.txt && grep -q "^gpus: " info.txt || fail "info lacks the backend or GPU lines"
# cuDNN: the version loaded and the one built with ("9.19.0 (built with 9.19.0, frontend 1.32.0)"), or not built.
grep -Eq "^cudnn: ([0-9]+\.[0-9]+\.[0-9]+ \(built with [0-9.]+, frontend [0-9.]+\)|not built)" info.txt ||
  fail "info names no cuDNN version: $(grep -i cudnn info.txt || echo 'no cudnn line')"
rc=0
"$MT" info --require-gpu >/dev/null || rc=$?
if grep -q "^gpus: 0" info.txt; then
  [ "$rc" -eq 3 ] || fail "info --require-gpu without a GPU exited $rc, expected 3"
  grep -q "training.device auto: cpu" info.txt || fail "auto should pick the CPU without a GPU"
else
  [ "$rc" -eq 0 ] || fail "info --require-gpu with a GPU exited $rc"
fi
grep -q "TFLOP/s/GPU" train.txt || fail "no TFLOP/s per GPU in the log"
echo "cli ok"
