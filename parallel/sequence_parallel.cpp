#include "parallel/sequence_parallel.h"

#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/runtime.h"
#endif

namespace mt {

namespace {

// Copies between (B, t, Ts, C) blocks of `a` and (t, B, Ts, C) of `b` (both on one device).
// to_rank_major: a -> b, else b -> a.
void permute_blocks(const Tensor& a, const Tensor& b, int64_t B, int64_t t, int64_t Ts, int64_t C, bool to_rank_major) {
  const size_t block = static_cast<size_t>(Ts * C) * dtype_size(a.dtype());
  auto* pa = static_cast<char*>(a.raw());
  auto* pb = static_cast<char*>(b.raw());
  if (a.device() != Device::cpu) {
#if defined(MEGATRAIN_WITH_CUDA)
    // Sample bi's t blocks are contiguous in a and B blocks apart in b: one strided copy per sample.
    for (int64_t bi = 0; bi < B; ++bi) {
      char* x = pa + static_cast<size_t>(bi * t) * block;
      char* y = pb + static_cast<size_t>(bi) * block;
      if (to_rank_major)
        cuda::copy_2d(y, static_cast<size_t>(B) * block, x, block, block, static_cast<size_t>(t));
      else
        cuda::copy_2d(x, block, y, static_cast<size_t>(B) * block, block, static_cast<size_t>(t));
    }
    return;
#else
    throw std::runtime_error("sequence parallelism: device tensors need the CUDA backend");
#endif
  }
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t r = 0; r < t; ++r) {
      char* x = pa + static_cast<size_t>(bi * t + r) * block;  // (b, r) in batch-major
      char* y = pb + static_cast<size_t>(r * B + bi) * block;  // (r, b) in rank-major
      if (to_rank_major)
        std::memcpy(y, x, block);
      else
        std::memcpy(x, y, block);
    }
}

void check(const Tensor& shard, const Tensor& full, const TensorParallel& tp, const char* op) {
  if (shard.ndim() != 3 || full.ndim() != 3 || shard.dim(0) != full.dim(0) || shard.dim(2) != full.dim(2) ||
      shard.dim(1) * tp.size != full.dim(1) || shard.dtype() != full.dtype())
    throw std::invalid_argument(fmt::format("{}: shard {} does not match full {} over {} ranks", op, shard.describe(),
                                            full.describe(), tp.size));
}

}  // namespace

void gather_sequence(const Tensor& shard, Tensor& full, const TensorParallel& tp) {
  check(shard, full, tp, "gather_sequence");
  if (tp.size == 1) return full.copy_from(shard);
  const int64_t B = shard.dim(0), Ts = shard.dim(1), C = shard.dim(2);
  Tensor gathered = Tensor::empty({tp.size, B, Ts, C}, full.dtype(), full.device(), MemKind::workspace);
  tp.comm->all_gather(shard, gathered)->wait();
  permute_blocks(full, gathered, B, tp.size, Ts, C, /*to_rank_major=*/false);
}

void scatter_sequence_sum(const Tensor& full, Tensor& shard, const TensorParallel& tp) {
  check(shard, full, tp, "scatter_sequence_sum");
  if (tp.size == 1) return shard.copy_from(full);
  const int64_t B = shard.dim(0), Ts = shard.dim(1), C = shard.dim(2);
  Tensor rank_major = Tensor::empty({tp.size, B, Ts, C}, full.dtype(), full.device(), MemKind::workspace);
  permute_blocks(full, rank_major, B, tp.size, Ts, C, /*to_rank_major=*/true);
  tp.comm->reduce_scatter(rank_major, shard)->wait();
}

Tensor sequence_to_full(const Tensor& rows, int64_t B, const TensorParallel& tp) {
  if (!tp.sequence_sharded()) return rows;
  const int64_t Ts = rows.dim(0) / B, C = rows.dim(1);
  Tensor full = Tensor::empty({B, Ts * tp.size, C}, rows.dtype(), rows.device());
  gather_sequence(rows.view({B, Ts, C}), full, tp);
  return full.view({B * Ts * tp.size, C});
}

Tensor sequence_shard_sum(Tensor& partial, int64_t B, const TensorParallel& tp) {
  if (!tp.sequence_sharded()) {
    tp.reduce_from_group(partial);
    return partial;
  }
  const int64_t T = partial.dim(0) / B, C = partial.dim(1), Ts = T / tp.size;
  Tensor shard = Tensor::empty({B, Ts, C}, partial.dtype(), partial.device());
  scatter_sequence_sum(partial.view({B, T, C}), shard, tp);
  return shard.view({B * Ts, C});
}

}  // namespace mt
