#include "parallel/layers/vocab_parallel_embedding.h"

#include <stdexcept>

#include <fmt/format.h>

#include "core/tensor/ops.h"
#include "parallel/layers/sequence_parallel.h"

namespace mt {

VocabParallelEmbedding::VocabParallelEmbedding(const EmbeddingTableOptions& opt, const TensorParallel& tp)
    : tp_(tp), vocab_start_(tp.begin(opt.num_embeddings)) {
  const int64_t V = opt.num_embeddings, C = opt.embedding_dim;
  if (V <= 0 || V % tp.size != 0)
    throw std::invalid_argument(
        fmt::format("{}: num_embeddings={} must be positive and divisible by tensor-parallel "
                    "size {}",
                    opt.name, V, tp.size));
  weight_ = make_parameter_slice(opt.name + ".weight",
                                 {.global = {V, C}, .start = {vocab_start_, 0}, .local = {tp.count(V), C}}, opt.dtype,
                                 Init::normal, opt.init_std, opt.seed);
  weight_.vocabulary_rows = true;  // padded to the layout: checkpoints of other layouts give the rows both hold
}

Tensor VocabParallelEmbedding::forward(const Tensor& tokens) const {
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = weight_.value.dim(1);
  Tensor partial = Tensor::empty({B * T, C}, weight_.value.dtype(), weight_.value.device());  // (N, C)
  Tensor partial_btc = partial.view({B, T, C});
  embedding_forward(tokens, weight_.value, partial_btc, {.vocab_start = vocab_start_});
  // Each row comes from the one rank holding its token: sum over the group (into sequence shards with SP).
  return sequence_shard_sum(partial, B, tp_).view({B, tp_.shard_length(T), C});
}

void VocabParallelEmbedding::backward(const Tensor& tokens, const Tensor& dout) {
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = dout.dim(2);
  const Tensor dfull = sequence_to_full(dout.view({dout.numel() / C, C}), B, tp_).view({B, T, C});
  embedding_backward(tokens, dfull, weight_.grad, {.vocab_start = vocab_start_});
}

}  // namespace mt
