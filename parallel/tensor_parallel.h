// tensor_parallel.h: the tensor-parallel group as the model sees it, and the two operators of the Megatron
// paper. Around a column-parallel GEMM the input passes unchanged forward and its gradient is summed over the
// group backward ("f"); after a row-parallel GEMM the partial outputs are summed forward and the gradient
// passes unchanged backward ("g"). Both directions reduce with reduce_from_group().
#pragma once
#include "core/tensor.h"
#include "parallel/communicator.h"

namespace mt {

struct TensorParallel {
  Communicator* comm = nullptr;  // null when size == 1
  int rank = 0;
  int size = 1;
  bool sequence_parallel = false;  // norms, dropout and residuals on sequence shards (Korthikanti et al.)

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
