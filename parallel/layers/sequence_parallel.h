// sequence_parallel.h: moving activations between the sequence-sharded regions of sequence parallelism
// (norms, dropout, residual: each tensor-parallel rank holds positions [r*T/t, (r+1)*T/t) of every sample)
// and the tensor-parallel GEMM regions (every rank holds all positions), as collectives that can travel
// while other work runs (parallel/linear_layers.h overlaps them with its GEMMs).
//
// Layout: activations are (B, T, C), so a sequence shard is B strided blocks and each collective runs on a
// rank-major copy (transpose_blocks, core/tensor/ops.h). Megatron stores (T, B, C), where a shard is one contiguous
// slice and the copies vanish; we keep (B, T, C) because every other op takes it: the attention ops (the CPU
// reference, our CUDA kernel and cuDNN's graph with its strides), the embeddings, dropout's mask coordinates
// and the loss all index (b, t). Switching would touch every kernel and its tests to save two device copies
// per collective that a copy engine does at memory bandwidth, next to GEMMs that dominate the layer.
#pragma once
#include <memory>

#include "core/tensor/tensor.h"
#include "parallel/layers/tensor_parallel.h"

namespace mt {

// An all-gather of sequence shards in flight: the input of a column-parallel GEMM (and the backward of a
// row-parallel output's reduce-scatter).
class SequenceGather {
 public:
  // Posts the all-gather of rows (B*T/t, C), this rank's shard of each of B samples. Without sequence
  // sharding nothing travels and wait() returns rows itself.
  SequenceGather(const Tensor& rows, int64_t B, const TensorParallel& tp);
  // rows (B*T, C) of all positions, batch-major: waits for the gather, then copies it out of rank-major order.
  Tensor wait();

 private:
  Tensor rows_;
  Tensor rank_major_;  // (t, B, T/t * C) what the all-gather writes; undefined without sequence sharding
  int64_t B_ = 0;
  std::unique_ptr<Work> work_;
};

// A sum over the tensor-parallel group in flight: a row-parallel GEMM's partial outputs forward, a
// column-parallel GEMM's input gradients backward.
class SequenceReduction {
 public:
  // Posts the reduction of partial (B*T, C): with sequence parallelism a reduce-scatter into this rank's
  // shard (from a rank-major copy), else an all-reduce of partial in place (nothing on one rank).
  SequenceReduction(Tensor& partial, int64_t B, const TensorParallel& tp);
  // The sum: (B*T/t, C) this rank's shard rows with sequence parallelism, else partial itself.
  Tensor wait();

 private:
  Tensor result_;      // the shard, or partial
  Tensor rank_major_;  // (t, B, T/t * C) the reduce-scatter's input, alive until it is done
  std::unique_ptr<Work> work_;
};

// The blocking forms, for code with nothing to overlap.
// rows (B*T/t, C) of this rank's sequence shard -> (B*T, C) of all positions (all-gather); rows itself
// without sequence parallelism.
Tensor sequence_to_full(const Tensor& rows, int64_t B, const TensorParallel& tp);
// partial (B*T, C) -> its sum over the group: this rank's shard (B*T/t, C) with sequence parallelism
// (reduce-scatter), else partial itself, all-reduced in place.
Tensor sequence_shard_sum(Tensor& partial, int64_t B, const TensorParallel& tp);

}  // namespace mt
