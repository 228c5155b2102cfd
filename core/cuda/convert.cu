// convert.cu: dtype conversion between device buffers (Tensor::copy_from across dtypes), the fp8 storage dtypes
// included (saturating, as the host's core/base/dtype.h).
#include "core/cuda/kernels.cuh"

namespace mt::cuda {

namespace {

// Eight elements a thread-step when both buffers are 16-byte aligned (one access of at most 16 bytes on the
// 1- or 2-byte side, two on the fp32 side), else one (for_each_vec).
constexpr int kConvertVec = 8;

template <class S, class D, int E>
__global__ void convert_kernel(const S* src, D* dst, int64_t n) {
  for_each_vec<E>(n, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    float f[W];
    load_f32s<W>(src + i, f);
    store_f32s<W>(dst + i, f);
  });
}

template <class S, class D>
void convert_to(const S* src, D* dst, int64_t n) {
  launch_flat<kConvertVec>(
      n, 256,
      [&](auto e, unsigned grid) { convert_kernel<S, D, decltype(e)::value><<<grid, 256, 0, stream()>>>(src, dst, n); },
      src, dst);
  MT_CUDA_LAUNCHED("convert_kernel");
}

// Integer dtypes convert through fp32 like the host's Tensor::copy_from; they only ever meet their own
// dtype in practice (a plain copy), so only the floating and fp8 conversions get kernels.
template <class S>
void convert_from(const S* src, void* dst, DType dst_dtype, int64_t n) {
  if (is_fp8(dst_dtype)) {
    MT_DISPATCH_FP8(dst_dtype, "convert", D, convert_to<S, D>(src, static_cast<D*>(dst), n));
  } else {
    MT_DISPATCH_FLOAT(dst_dtype, "convert", D, convert_to<S, D>(src, static_cast<D*>(dst), n));
  }
}

}  // namespace

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  if (n == 0) return;
  if (src_dtype == dst_dtype) return copy_bytes(dst, Device::cuda, src, Device::cuda, n * dtype_size(src_dtype));
  if (is_fp8(src_dtype)) {
    MT_DISPATCH_FP8(src_dtype, "convert", S, convert_from<S>(static_cast<const S*>(src), dst, dst_dtype, n));
  } else {
    MT_DISPATCH_FLOAT(src_dtype, "convert", S, convert_from<S>(static_cast<const S*>(src), dst, dst_dtype, n));
  }
}

}  // namespace mt::cuda
