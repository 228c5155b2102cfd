#!/usr/bin/env bash
# `megatrain generate`: a tiny byte model trained a few iterations continues a prompt greedily; the same weights
# saved in another layout (TP2 x PP2, 4 ranks) give the same text; a seed fixes sampled text;
# bf16 runs; bad input fails with a message naming what is wrong.
source "$(dirname "$0")/lib/common.bash"
prepare_data
write_config
# A wider model at a higher learning rate than tiny.yaml's, so its greedy text is more than spaces.
sed -i 's/seq_length: 32/seq_length: 64/' tiny.yaml  # room for a prompt and its continuation
train=(--config tiny.yaml --set training.train_iters=200 --set model.hidden_size=64 --set model.ffn_hidden_size=256
       --set training.global_batch_size=16 --set optimizer.lr=1e-2 --set optimizer.min_lr=1e-3)
"$MT" "${train[@]}" --set checkpoint.save_dir=ckpt1 >/dev/null
# The same weights saved by TP2 x PP2 ranks: one more iteration at learning rate 1e-30 (AdamW then moves no weight by an ulp).
"$MT" "${train[@]}" --set training.train_iters=201 --set optimizer.lr=1e-30 --set optimizer.min_lr=1e-30 \
      --set checkpoint.load=ckpt1 --set checkpoint.save_dir=ckpt4 --nproc 4 --set parallel.tensor=2 \
      --set parallel.pipeline=2 >/dev/null
[ -f ckpt1/iter_0000200/tokenizer.yaml ] || fail "the checkpoint has no tokenizer.yaml"

gen() { "$MT" generate --device cpu "$@" 2>gen.err; }
prompt="Permission is hereby granted to "
a=$(gen --load ckpt1 --prompt "$prompt" --greedy --max-new-tokens 24 --ids)
b=$(gen --load ckpt4 --prompt "$prompt" --greedy --max-new-tokens 24 --ids)
echo "TP1 PP1: $a"
echo "TP2 PP2: $b"
[ "$(wc -w <<<"$a")" -ge 1 ] || fail "no tokens generated"
[ "$a" = "$b" ] || fail "greedy ids differ between checkpoints saved in two layouts"
grep -q "stop: " gen.err || fail "no summary on stderr: $(cat gen.err)"
text=$(gen --load ckpt1 --prompt "$prompt" --greedy --max-new-tokens 24)
echo "text: $prompt|$text"
[ "$(gen --load ckpt1/iter_0000200 --prompt "$prompt" --temperature 0 --max-new-tokens 24)" = "$text" ] ||
  fail "--temperature 0 and a checkpoint directory named directly should give the greedy text"

# A prompt file gives what --prompt gives.
printf '%s' "$prompt" > prompt.txt
[ "$(gen --load ckpt1 --prompt-file prompt.txt --greedy --max-new-tokens 24)" = "$text" ] || fail "--prompt-file differs"

# Sampling: the same seed gives the same text, another seed (almost surely) other text.
s1=$(gen --load ckpt1 --prompt "$prompt" --seed 7 --temperature 1.5 --top-k 50 --top-p 0.95 --max-new-tokens 32 --ids)
s2=$(gen --load ckpt1 --prompt "$prompt" --seed 7 --temperature 1.5 --top-k 50 --top-p 0.95 --max-new-tokens 32 --ids)
s3=$(gen --load ckpt1 --prompt "$prompt" --seed 8 --temperature 1.5 --top-k 50 --top-p 0.95 --max-new-tokens 32 --ids)
[ "$s1" = "$s2" ] || fail "the same seed gave different samples"
[ "$s1" != "$s3" ] || fail "seeds 7 and 8 gave the same 32 sampled tokens"
[ "$(wc -w <<<"$s1")" -eq 32 ] || [ "${s1##* }" = 256 ] || fail "sampling stopped early: $s1"

# bf16 runs (its greedy text may differ from fp32's in the last bits' ties, so only its length is checked).
gen --load ckpt1 --prompt "$prompt" --greedy --max-new-tokens 8 --precision bf16 --ids >/dev/null ||
  fail "bf16 generation failed: $(cat gen.err)"

# A budget beyond the context stops when the context is full.
long=$(printf 'a%.0s' $(seq 1 60))
gen --load ckpt1 --prompt "$long" --greedy --max-new-tokens 100 --ids >/dev/null
grep -q "stop: context full\|stop: end of document" gen.err || fail "no context-full stop: $(cat gen.err)"

# Bad input.
expect_error "no checkpoint there" generate --load nowhere --prompt hi
expect_error "--prompt" generate --load ckpt1
expect_error "empty" generate --load ckpt1 --prompt ""
expect_error "cannot open" generate --load ckpt1 --prompt-file missing.txt
expect_error "max_position_embeddings=64" generate --load ckpt1 --prompt "$(printf 'b%.0s' $(seq 1 65))"
expect_error "--temperature -1" generate --load ckpt1 --prompt hi --temperature -1
expect_error "--top-p 1.5" generate --load ckpt1 --prompt hi --top-p 1.5
expect_error "--top-k -2" generate --load ckpt1 --prompt hi --top-k -2
expect_error "max-new-tokens" generate --load ckpt1 --prompt hi --max-new-tokens 0
expect_error "excludes" generate --load ckpt1 --prompt hi --greedy --temperature 0.7
# A model whose data had no tokenizer sidecar: the byte tokenizer only when the vocabulary is 257.
mkdir -p nosc && cp data/text_document.bin data/text_document.idx nosc/
"$MT" --config tiny.yaml --set training.train_iters=6 --set checkpoint.save_dir=ckpt300 \
      --set model.vocab_size=300 --set "data.train=[nosc/text_document]" >/dev/null
expect_error "no tokenizer.yaml" generate --load ckpt300 --prompt hi
"$MT" --config tiny.yaml --set training.train_iters=6 --set checkpoint.save_dir=ckpt257 \
      --set "data.train=[nosc/text_document]" >/dev/null
gen --load ckpt257 --prompt hi --greedy --max-new-tokens 4 --ids >/dev/null || fail "byte fallback: $(cat gen.err)"
echo "PASS"
