#!/usr/bin/env bash
# Resume is exact: 20 iterations straight and 10 + resume + 10 log identical losses for iterations 11-20,
# in fp32 and bf16 (dropout on).
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
for precision in fp32 bf16; do
  rm -rf run straight resumed
  "$MT" --config tiny.yaml --set training.precision=$precision --set logging.dir=straight >/dev/null
  "$MT" --config tiny.yaml --set training.precision=$precision --set logging.dir=resumed \
        --set checkpoint.save_dir=resumed/ckpt --exit-after 10 >/dev/null
  [ -f resumed/ckpt/latest ] || fail "no checkpoint after --exit-after 10"
  "$MT" --config tiny.yaml --set training.precision=$precision --set logging.dir=resumed \
        --set checkpoint.save_dir=resumed/ckpt >/dev/null
  losses straight/metrics.jsonl 11 20 > a.txt
  losses resumed/metrics.jsonl 11 20 > b.txt
  [ "$(wc -l < a.txt)" -eq 10 ] || fail "$precision: expected 10 losses, got $(wc -l < a.txt)"
  diff a.txt b.txt || fail "$precision: losses after resume differ"
  losses resumed/metrics.jsonl 1 10 > c.txt
  losses straight/metrics.jsonl 1 10 > d.txt
  diff c.txt d.txt || fail "$precision: losses before the checkpoint differ"
  echo "$precision: iterations 11-20 identical after resume"
done
