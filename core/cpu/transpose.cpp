// transpose.cpp: transpose_blocks on the CPU, one memcpy per block.
#include <cstring>

#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

void transpose_blocks(const Tensor& x, Tensor& out) {
  const int64_t P = x.dim(0), Q = x.dim(1);
  const size_t block = static_cast<size_t>(x.dim(2)) * dtype_size(x.dtype());  // bytes of one (L) block
  const auto* src = static_cast<const char*>(x.raw());
  auto* dst = static_cast<char*>(out.raw());
  for (int64_t p = 0; p < P; ++p)
    for (int64_t q = 0; q < Q; ++q)
      std::memcpy(dst + static_cast<size_t>(q * P + p) * block, src + static_cast<size_t>(p * Q + q) * block, block);
}

}  // namespace mt::cpu
