#include "parallel/layers/sequence_parallel.h"

#include <stdexcept>

#include <fmt/format.h>

#include "core/tensor/ops.h"

namespace mt {

namespace {

// rows (B*T', C) of B samples as (B, T'*C) split into `parts` blocks per sample: (B, parts, T'/parts * C).
Tensor sample_blocks(const Tensor& rows, int64_t B, int64_t parts, const char* op) {
  if (rows.ndim() != 2 || B <= 0 || rows.dim(0) % (B * parts) != 0)
    throw std::invalid_argument(
        fmt::format("{}: rows {} are not {} samples of {} sequence shards", op, rows.describe(), B, parts));
  return rows.view({B, parts, rows.numel() / (B * parts)});
}

}  // namespace

SequenceGather::SequenceGather(const Tensor& rows, int64_t B, const TensorParallel& tp) : rows_(rows), B_(B) {
  if (!tp.sequence_sharded()) return;
  const Tensor shard = sample_blocks(rows, B, 1, "SequenceGather");  // (B, 1, T/t * C)
  rank_major_ = Tensor::empty({tp.size, B, shard.dim(2)}, rows.dtype(), rows.device(), MemKind::workspace);
  work_ = tp.comm->all_gather(rows, rank_major_);
}

Tensor SequenceGather::wait() {
  if (!rank_major_.defined()) return rows_;
  work_->wait();
  const int64_t t = rank_major_.dim(0), Ns = rows_.dim(0), C = rows_.dim(1);
  Tensor full = Tensor::empty({Ns * t, C}, rows_.dtype(), rows_.device());  // (B*T, C)
  Tensor blocks = full.view({B_, t, rank_major_.dim(2)});
  transpose_blocks(rank_major_, blocks);  // (t, B, .) -> (B, t, .)
  rank_major_ = Tensor();
  rows_ = full;  // a second wait() returns it again
  return full;
}

SequenceReduction::SequenceReduction(Tensor& partial, int64_t B, const TensorParallel& tp) : result_(partial) {
  if (tp.size == 1) return;
  if (!tp.sequence_parallel) {
    work_ = tp.comm->all_reduce(result_, ReduceOp::sum);
    return;
  }
  const Tensor blocks = sample_blocks(partial, B, tp.size, "SequenceReduction");  // (B, t, T/t * C)
  rank_major_ = Tensor::empty({tp.size, B, blocks.dim(2)}, partial.dtype(), partial.device(), MemKind::workspace);
  transpose_blocks(blocks, rank_major_);
  result_ = Tensor::empty({partial.dim(0) / tp.size, partial.dim(1)}, partial.dtype(), partial.device());
  work_ = tp.comm->reduce_scatter(rank_major_, result_);
}

Tensor SequenceReduction::wait() {
  if (work_) work_->wait();
  work_.reset();
  rank_major_ = Tensor();
  return result_;
}

Tensor sequence_to_full(const Tensor& rows, int64_t B, const TensorParallel& tp) {
  return SequenceGather(rows, B, tp).wait();
}

Tensor sequence_shard_sum(Tensor& partial, int64_t B, const TensorParallel& tp) {
  return SequenceReduction(partial, B, tp).wait();
}

}  // namespace mt
