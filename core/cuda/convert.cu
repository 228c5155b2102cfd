// convert.cu: dtype conversion between device buffers (Tensor::copy_from across dtypes).
#include "core/cuda/kernels.cuh"

namespace mt::cuda {

namespace {

template <class S, class D>
__global__ void convert_kernel(const S* src, D* dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = from_f32<D>(to_f32<S>(src[i]));
}

// Integer dtypes convert through fp32 like the host's Tensor::copy_from; they only ever meet their own
// dtype in practice (a plain copy), so only the floating conversions get kernels.
template <class S>
void convert_from(const S* src, void* dst, DType dst_dtype, int64_t n) {
  const unsigned blocks = grid_1d(n, 256);
  MT_DISPATCH_FLOAT(dst_dtype, "convert", D,
                    convert_kernel<S, D><<<blocks, 256, 0, stream()>>>(src, static_cast<D*>(dst), n));
  MT_CUDA_LAUNCHED("convert_kernel");
}

}  // namespace

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  if (n == 0) return;
  if (src_dtype == dst_dtype) return copy_bytes(dst, Device::cuda, src, Device::cuda, n * dtype_size(src_dtype));
  MT_DISPATCH_FLOAT(src_dtype, "convert", S, convert_from<S>(static_cast<const S*>(src), dst, dst_dtype, n));
}

}  // namespace mt::cuda
