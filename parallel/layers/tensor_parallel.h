// tensor_parallel.h: the tensor-parallel group as the model sees it. The two operators of the Megatron paper
// live with the layers that use them (parallel/layers/parallel_linear.h): around a column-parallel GEMM the input
// passes unchanged forward and its gradient is summed over the group backward ("f"); after a row-parallel
// GEMM the partial outputs are summed forward and the gradient passes unchanged backward ("g"); with
// sequence parallelism the sums become reduce-scatters and the passes all-gathers (sequence_parallel.h).
// The sums and maxima of the vocabulary-parallel loss use reduce_from_group() and max_over_group().
#pragma once
#include "core/tensor/tensor.h"
#include "parallel/comm/communicator.h"

namespace mt {

struct TensorParallel {
  Communicator* comm = nullptr;  // null when size == 1
  int rank = 0;
  int size = 1;
  bool sequence_parallel = false;  // norms, dropout and residuals on sequence shards (Korthikanti et al.)

  // Whether activations outside the TP regions are sequence shards (sequence parallelism over >1 rank).
  bool sequence_sharded() const { return sequence_parallel && size > 1; }
  // Positions per sequence shard of a T-long sequence, and the first position of this rank's shard.
  int64_t shard_length(int64_t T) const { return sequence_sharded() ? T / size : T; }
  int64_t shard_offset(int64_t T) const { return sequence_sharded() ? rank * (T / size) : 0; }

  // [begin, end) of `total` items (rows, heads, vocabulary entries) held by this rank.
  int64_t begin(int64_t total) const { return total / size * rank; }
  int64_t count(int64_t total) const { return total / size; }

  // Sums t over the group in place: g forward, f backward.
  void reduce_from_group(Tensor& t) const {
    if (size > 1) comm->all_reduce(t, ReduceOp::sum)->wait();
  }
  void max_over_group(Tensor& t) const {
    if (size > 1) comm->all_reduce(t, ReduceOp::max)->wait();
  }
};

}  // namespace mt
