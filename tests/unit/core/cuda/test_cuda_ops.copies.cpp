// test_cuda_ops.copies.cpp: copies across devices and dtypes on the GPU (the host's round to nearest even, bit for
// bit, on tails and misaligned views), and the caching allocator's reuse of freed blocks.
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); each test skips where no GPU can run it, and
// cuda_op_checks.h says how the GPU is compared with the CPU.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, Both, CudaOps, the checks of cuda_op_checks.h

// ---- copies across devices and dtypes ------------------------------------------------------------

// Every (device, dtype) -> (device, dtype) copy touching the GPU equals the host's round to nearest even:
// the value rounded to the source dtype, then to the destination dtype.
TEST_F(CudaOps, CopyFromAcrossDevicesAndDtypes) {
  Vec x = rand_vec(1000, 450, -4, 4);
  for (double v : {1.0 + 0x1p-8, 1.0 + 3 * 0x1p-8, 1.0 + 0x1p-11, 1.0 + 3 * 0x1p-11, 65504.0, 65519.0, 65520.0, 70000.0,
                   -1e9, 1e38, 0x1p-24, 0x1p-25, 3 * 0x1p-25, 1e-6, -0.0, 0.0, std::numeric_limits<double>::infinity(),
                   -std::numeric_limits<double>::infinity()})
    x.push_back(static_cast<float>(v));
  const int64_t n = static_cast<int64_t>(x.size());
  for (Device src_dev : {Device::cpu, Device::cuda})
    for (DType src_dt : kFloatTypes)
      for (Device dst_dev : {Device::cpu, Device::cuda})
        for (DType dst_dt : kFloatTypes) {
          if (src_dev == Device::cpu && dst_dev == Device::cpu) continue;
          const Tensor src = make(x, {n}, src_dt).to(src_dev);
          Tensor dst = make(Vec(n, std::numeric_limits<double>::quiet_NaN()), {n}, dst_dt).to(dst_dev);
          dst.copy_from(src);
          const std::vector<float> got = dst.to_floats();
          int64_t bad = 0, first = -1;
          for (int64_t i = 0; i < n; ++i) {
            const float want = round_to(dst_dt, round_to(src_dt, static_cast<float>(x[i])));
            if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want) && bad++ == 0) first = i;
          }
          EXPECT_EQ(bad, 0) << device_name(src_dev) << " " << dtype_name(src_dt) << " -> " << device_name(dst_dev)
                            << " " << dtype_name(dst_dt) << ": first mismatch at " << first << " (value "
                            << (first >= 0 ? x[first] : 0.0) << ")";
        }
}

// Device-to-device dtype conversion (copy_from), source and destination each aligned or not: the host's round
// to nearest even, bit for bit.
TEST_F(CudaOps, ConvertOnTailsAndMisalignedViews) {
  for (int64_t n : kTailSizes) {
    Vec x = rand_vec(n, 1420, -70000, 70000);  // past fp16's range too
    x[0] = 1.0 + 0x1p-8;                       // a bf16 tie
    for (DType src_dt : kFloatTypes)
      for (DType dst_dt : kFloatTypes) {
        if (src_dt == dst_dt) continue;
        for (int64_t src_off : kViewOffsets)
          for (int64_t dst_off : kViewOffsets) {
            const Both src = both_at(x, {n}, src_dt, src_off);
            Both dst = poisoned_at({n}, dst_dt, dst_off);
            dst.gpu.copy_from(src.gpu);
            const std::vector<float> got = dst.gpu.to_floats();
            int64_t bad = 0, first = -1;
            for (int64_t i = 0; i < n; ++i) {
              const float want = round_to(dst_dt, round_to(src_dt, static_cast<float>(x[i])));
              if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want) && bad++ == 0) first = i;
            }
            EXPECT_EQ(bad, 0) << "convert " << dtype_name(src_dt) << " at offset " << src_off << " -> "
                              << dtype_name(dst_dt) << " at offset " << dst_off << ", n=" << n << ": first mismatch at "
                              << first;
          }
      }
  }
}

// ---- caching allocator ---------------------------------------------------------------------------

// A second round of the same allocations is served from the cache: no new cudaMalloc.
TEST_F(CudaOps, CachingAllocatorReusesFreedBlocks) {
#if defined(MEGATRAIN_WITH_CUDA)
  auto round = [] {
    std::vector<Tensor> ts;
    for (const auto& [shape, dt] : {std::pair<Shape, DType>{{1000}, DType::f32},
                                    {{37, 53}, DType::bf16},
                                    {{4096, 1024}, DType::f32},
                                    {{3, 5, 7}, DType::f16},
                                    {{1, 1}, DType::f32},
                                    {{2048, 3000}, DType::bf16},
                                    {{1000}, DType::f32}})
      ts.push_back(Tensor::empty(shape, dt, Device::cuda));
  };
  round();
  const cuda::CacheStats first = cuda::cache_stats();
  round();
  const cuda::CacheStats second = cuda::cache_stats();
  EXPECT_EQ(second.device_mallocs, first.device_mallocs);
  EXPECT_GE(second.cache_hits, first.cache_hits + 7);
  EXPECT_EQ(second.reserved_bytes, first.reserved_bytes);
#endif
}

}  // namespace
}  // namespace mt
