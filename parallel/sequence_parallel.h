// sequence_parallel.h: moving activations between the sequence-sharded regions of sequence parallelism
// (norms, dropout, residual: each tensor-parallel rank holds positions [r*T/t, (r+1)*T/t) of every sample)
// and the tensor-parallel GEMM regions (every rank holds all positions). Activations are (B, T, C), so a
// sequence shard is B strided blocks; the collectives run on a rank-major copy.
#pragma once
#include "core/tensor.h"
#include "parallel/tensor_parallel.h"

namespace mt {

// shard (B, T/t, C) -> full (B, T, C): the all-gather before a column-parallel GEMM (and the backward of
// scatter_sequence_sum).
void gather_sequence(const Tensor& shard, Tensor& full, const TensorParallel& tp);

// full (B, T, C) partial sums -> shard (B, T/t, C) of their sum over the group: the reduce-scatter after a
// row-parallel GEMM (and the backward of gather_sequence).
void scatter_sequence_sum(const Tensor& full, Tensor& shard, const TensorParallel& tp);

// The two transitions as the model code uses them, on row views (tokens x C) of B samples:
// rows (B*T/t, C) of this rank's sequence shard -> (B*T, C) of all positions (all-gather); the rows themselves
// without sequence parallelism.
Tensor sequence_to_full(const Tensor& rows, int64_t B, const TensorParallel& tp);
// partial (B*T, C) row-parallel output -> its sum over the group: this rank's shard (B*T/t, C) with sequence
// parallelism (reduce-scatter), else `partial` itself, all-reduced in place.
Tensor sequence_shard_sum(Tensor& partial, int64_t B, const TensorParallel& tp);

}  // namespace mt
