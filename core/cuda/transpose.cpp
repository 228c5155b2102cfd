// transpose.cpp: transpose_blocks on the GPU as strided 2-D copies (cudaMemcpy2DAsync on the compute stream),
// one per index of the shorter leading dimension: a copy engine moves the blocks, no kernel is needed.
#include "core/cuda/ops_cuda.h"
#include "core/cuda/runtime.h"

namespace mt::cuda {

void transpose_blocks(const Tensor& x, Tensor& out) {
  const int64_t P = x.dim(0), Q = x.dim(1);
  const size_t block = static_cast<size_t>(x.dim(2)) * dtype_size(x.dtype());  // bytes of one (L) block
  const auto* src = static_cast<const char*>(x.raw());
  auto* dst = static_cast<char*>(out.raw());
  const size_t p_stride = static_cast<size_t>(Q) * block;  // x's rows are (Q, L), out's (P, L)
  const size_t q_stride = static_cast<size_t>(P) * block;
  if (P <= Q) {
    // x[p, :] (Q contiguous blocks) -> out[:, p] (Q blocks, q_stride apart)
    for (int64_t p = 0; p < P; ++p)
      copy_2d(dst + static_cast<size_t>(p) * block, q_stride, src + static_cast<size_t>(p) * p_stride, block, block,
              static_cast<size_t>(Q));
  } else {
    // x[:, q] (P blocks, p_stride apart) -> out[q, :] (P contiguous blocks)
    for (int64_t q = 0; q < Q; ++q)
      copy_2d(dst + static_cast<size_t>(q) * q_stride, block, src + static_cast<size_t>(q) * block, p_stride, block,
              static_cast<size_t>(P));
  }
}

}  // namespace mt::cuda
