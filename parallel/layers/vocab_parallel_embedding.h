// vocab_parallel_embedding.h: the word embedding split over the tensor-parallel group by vocabulary rows
// (Megatron's VocabParallelEmbedding). Rank r holds rows [r*V/t, (r+1)*V/t) of the (padded) table; a token
// outside them looks up zeros, and the sum over the group gives every token its row: an all-reduce, or with
// sequence parallelism a reduce-scatter straight into this rank's sequence shard. Backward all-gathers the
// shard's gradient (with SP) and scatters it into this rank's rows.
#pragma once
#include <string>

#include "core/tensor/parameter.h"
#include "parallel/layers/tensor_parallel.h"

namespace mt {

struct EmbeddingTableOptions {
  std::string name;            // "embedding.word_embeddings": the parameter is <name>.weight
  int64_t num_embeddings = 0;  // global rows (the padded vocabulary)
  int64_t embedding_dim = 0;
  float init_std = 0.02f;
  DType dtype = DType::f32;
  uint64_t seed = 0;
};

class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding() = default;
  // Owns weight (V/t, C), rows [r*V/t, (r+1)*V/t) of <name>.weight. The last pipeline stage of a model with
  // tied embeddings makes one too, as the tied copy its LM head reads (it embeds nothing there).
  VocabParallelEmbedding(const EmbeddingTableOptions& opt, const TensorParallel& tp);

  // tokens (B, T) i32 -> (B, Ts, C): the rows of the tokens, this rank's sequence shard with SP.
  Tensor forward(const Tensor& tokens) const;
  // dout (B, Ts, C), the gradient of forward's output -> accumulates the weight's gradient.
  void backward(const Tensor& tokens, const Tensor& dout);

  Parameter& weight() { return weight_; }
  const Parameter& weight() const { return weight_; }
  int64_t vocab_start() const { return vocab_start_; }  // global row of local row 0

 private:
  TensorParallel tp_;
  Parameter weight_;  // (V/t, C)
  int64_t vocab_start_ = 0;
};

}  // namespace mt
