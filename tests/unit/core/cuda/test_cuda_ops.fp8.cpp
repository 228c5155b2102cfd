// test_cuda_ops.fp8.cpp: the fp8 dtypes and scaling ops on the GPU, bit for bit the CPU's: conversions to and from
// e4m3 / e5m2 (copy_from, on tails and misaligned views, and a strided sweep over every float32 bit pattern),
// fp8_amax, fp8_quantize (with and without its fused amax), fp8_quantize_transpose (the fused cast-and-transpose),
// fp8_dequantize and fp8_update_scale; and gemm_fp8
// (cuBLASLt's fp8 matmul, TN layout, scales on the device) against the CPU's exact emulation, within fp32
// summation order and one rounding of the output.
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); each test skips where no GPU can run it.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/ops_fp8.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, Both, CudaOps, the checks of cuda_op_checks.h

constexpr DType kFp8Types[] = {DType::e4m3, DType::e5m2};

// The index of the first element where gpu and cpu (same dtype and shape) differ, or -1: fp8 codes byte for byte
// (every NaN is the code 0x7f on both), floating values bit for bit except that any NaN equals any NaN (a NaN's
// payload is not specified: the GPU widens fp8 through half and its arithmetic makes canonical NaNs).
int64_t first_mismatch(const Tensor& gpu, const Tensor& cpu) {
  if (is_fp8(cpu.dtype())) {
    const Tensor h = gpu.to(Device::cpu);
    for (int64_t i = 0; i < cpu.numel(); ++i)
      if (h.data<uint8_t>()[i] != cpu.data<uint8_t>()[i]) return i;
    return -1;
  }
  const std::vector<float> g = gpu.to_floats(), c = cpu.to_floats();
  for (size_t i = 0; i < c.size(); ++i)
    if (!(std::isnan(g[i]) && std::isnan(c[i])) && std::bit_cast<uint32_t>(g[i]) != std::bit_cast<uint32_t>(c[i]))
      return static_cast<int64_t>(i);
  return -1;
}

// Inputs that reach every branch of the casts: ties, subnormals, saturation, infinities, NaN, signed zeros.
Vec fp8_inputs(int64_t n, uint32_t seed) {
  Vec x = rand_vec(n, seed, -600, 600);
  const double specials[] = {464.0,
                             -464.0,
                             449.0,
                             61440.0,
                             1e9,
                             -1e9,
                             0x1p-10,
                             0x1p-17,
                             0x1p-9,
                             3 * 0x1p-10,
                             1.0625,
                             1.1875,
                             -0.0,
                             0.0,
                             1e-30,
                             -1e-30,
                             std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(),
                             std::numeric_limits<double>::quiet_NaN()};
  for (size_t i = 0; i < std::size(specials) && i < x.size(); ++i) x[(i * 7919) % x.size()] = specials[i];
  return x;
}

TEST_F(CudaOps, Fp8ConvertMatchesTheHostOnTailsAndMisalignedViews) {
  const DType floats[] = {DType::f32, DType::bf16, DType::f16};
  for (int64_t n : kTailSizes) {
    const Vec x = fp8_inputs(n, 2901);
    for (DType q : kFp8Types)
      for (DType f : floats)
        for (const auto& [src_dt, dst_dt] :
             {std::pair{f, q}, std::pair{q, f}, std::pair{q, q == DType::e4m3 ? DType::e5m2 : DType::e4m3}})
          for (int64_t src_off : kViewOffsets)
            for (int64_t dst_off : kViewOffsets) {
              const Both src = both_at(x, {n}, src_dt, src_off);
              Both dst = poisoned_at({n}, dst_dt, dst_off);
              dst.cpu.copy_from(src.cpu);
              dst.gpu.copy_from(src.gpu);
              const int64_t at = first_mismatch(dst.gpu, dst.cpu);
              EXPECT_EQ(at, -1) << dtype_name(src_dt) << " at offset " << src_off << " -> " << dtype_name(dst_dt)
                                << " at offset " << dst_off << ", n=" << n << ": first difference at " << at
                                << " (value " << (at >= 0 ? x[at] : 0.0) << ")";
            }
  }
}

// Float32 bit patterns 0, 257, 514, ... (every exponent, both signs, NaNs and infinities) cast on the GPU and on the
// host, and every code of each format widened on both.
TEST_F(CudaOps, Fp8ConvertSweepsFloat32BitPatterns) {
  constexpr uint64_t kStride = 257;
  const auto n = static_cast<int64_t>((uint64_t{1} << 32) / kStride);
  Tensor x = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = std::bit_cast<float>(static_cast<uint32_t>(i * kStride));
  const Tensor x_gpu = x.to(Device::cuda);
  for (DType q : kFp8Types) {
    Tensor host = Tensor::empty({n}, q), dev = Tensor::empty({n}, q, Device::cuda);
    host.copy_from(x);
    dev.copy_from(x_gpu);
    const int64_t at = first_mismatch(dev, host);
    EXPECT_EQ(at, -1) << "f32 -> " << dtype_name(q) << ": first difference at float bits " << std::hex
                      << (at >= 0 ? static_cast<uint32_t>(at * kStride) : 0u);
    Tensor codes = Tensor::empty({256}, q);
    for (int c = 0; c < 256; ++c) codes.data<uint8_t>()[c] = static_cast<uint8_t>(c);
    Tensor wide_host = Tensor::empty({256}, DType::f32), wide_dev = Tensor::empty({256}, DType::f32, Device::cuda);
    wide_host.copy_from(codes);
    wide_dev.copy_from(codes.to(Device::cuda));
    EXPECT_EQ(first_mismatch(wide_dev, wide_host), -1) << dtype_name(q) << " -> f32";
  }
}

TEST_F(CudaOps, Fp8AmaxMatchesTheHost) {
  for (int64_t n : {int64_t{1}, int64_t{13}, int64_t{1003}, int64_t{8 * 1024 + 5}, int64_t{3'000'001}})
    for (DType dt : kFloatTypes)
      for (int64_t off : kViewOffsets)
        for (int variant = 0; variant < 3; ++variant) {
          Vec x = rand_vec(n, 77 + static_cast<uint32_t>(n), -5, 5);
          x[static_cast<size_t>(n / 2)] = -9.5;  // the largest magnitude, negative, mid-tensor
          if (variant == 1) x[static_cast<size_t>(n - 1)] = std::numeric_limits<double>::quiet_NaN();
          const Both xs = both_at(x, {n}, dt, off);
          for (float start : {0.f, 100.f, variant == 2 ? std::numeric_limits<float>::quiet_NaN() : 1.f}) {
            Both amax = both({start}, {1}, DType::f32);
            fp8_amax(xs.cpu, amax.cpu);
            fp8_amax(xs.gpu, amax.gpu);
            EXPECT_EQ(first_mismatch(amax.gpu, amax.cpu), -1)
                << dtype_name(dt) << " n=" << n << " offset " << off << " variant " << variant << " start " << start
                << ": host " << amax.cpu.item() << ", GPU " << amax.gpu.item();
          }
        }
}

TEST_F(CudaOps, Fp8QuantizeAndDequantizeMatchTheHost) {
  for (int64_t n : kTailSizes)
    for (DType dt : kFloatTypes)
      for (DType q : kFp8Types)
        for (float s : {1.f, 0.7f, 300.f, 0x1p-7f})
          for (int64_t off : kViewOffsets)
            for (bool with_amax : {false, true}) {
              const Both x = both_at(fp8_inputs(n, 4400 + static_cast<uint32_t>(n)), {n}, dt, off);
              const Both scale = both({s}, {1}, DType::f32);
              Both out = poisoned_at({n}, q, off == 0 ? 1 : 0);  // the other alignment than x's
              Both amax = both({0.5}, {1}, DType::f32);
              fp8_quantize(x.cpu, scale.cpu, out.cpu, with_amax ? &amax.cpu : nullptr);
              fp8_quantize(x.gpu, scale.gpu, out.gpu, with_amax ? &amax.gpu : nullptr);
              const std::string what = str(dtype_name(dt), " -> ", dtype_name(q), " n=", n, " scale ", s, " offset ",
                                           off, with_amax ? " with amax" : "");
              const int64_t at = first_mismatch(out.gpu, out.cpu);
              EXPECT_EQ(at, -1) << "fp8_quantize " << what << ": first difference at " << at;
              EXPECT_EQ(first_mismatch(amax.gpu, amax.cpu), -1)
                  << "fp8_quantize amax " << what << ": host " << amax.cpu.item() << ", GPU " << amax.gpu.item();
              for (DType back_dt : kFloatTypes) {
                Both back = poisoned_at({n}, back_dt, off);
                const Both scale_inv = both({1.0 / s}, {1}, DType::f32);
                fp8_dequantize(out.cpu, scale_inv.cpu, back.cpu);
                fp8_dequantize(out.gpu, scale_inv.gpu, back.gpu);
                const int64_t at_back = first_mismatch(back.gpu, back.cpu);
                EXPECT_EQ(at_back, -1) << "fp8_dequantize to " << dtype_name(back_dt) << " of " << what
                                       << ": first difference at " << at_back;
              }
            }
}

TEST_F(CudaOps, Fp8UpdateScaleMatchesTheHost) {
  constexpr int64_t n = 300, H = 5;  // two blocks of rows
  const Vec amax_v = rand_vec(n, 71, 0, 500);
  Vec amax_s = amax_v;
  amax_s[3] = 0;
  amax_s[5] = std::numeric_limits<double>::quiet_NaN();
  amax_s[7] = std::numeric_limits<double>::infinity();
  amax_s[9] = 1e-40;
  Vec fmax(n);
  for (int64_t i = 0; i < n; ++i) fmax[static_cast<size_t>(i)] = i % 2 ? 448 : 57344;
  for (bool use_max : {true, false})
    for (int margin : {0, 3}) {
      const Both amax = both(amax_s, {n}, DType::f32), fp8_max = both(fmax, {n}, DType::f32);
      Both history = both(rand_vec(n * H, 72, 0, 400), {n, H}, DType::f32);
      Both scale = both(rand_vec(n, 73, 1, 2), {n}, DType::f32), scale_inv = poisoned({n}, DType::f32);
      for (auto dev : kDevices)
        fp8_update_scale(amax.*dev, history.*dev, scale.*dev, scale_inv.*dev, fp8_max.*dev,
                         {.margin = margin, .use_max = use_max});
      const std::string what = str("use_max ", use_max, " margin ", margin);
      EXPECT_EQ(first_mismatch(history.gpu, history.cpu), -1) << "history " << what;
      EXPECT_EQ(first_mismatch(scale.gpu, scale.cpu), -1) << "scale " << what;
      EXPECT_EQ(first_mismatch(scale_inv.gpu, scale_inv.cpu), -1) << "scale_inv " << what;
    }
}

// The fused cast-and-transpose against the CPU's cast then byte transpose: odd shapes (partial tiles, the scalar
// form), multiples of 8 (the vector form) with and without a misaligned view (the scalar form again), more tiles
// than one block row or column, saturating scales and the special values (fp8_inputs), either layout alone or both,
// with and without the fused amax.
TEST_F(CudaOps, Fp8QuantizeTransposeMatchesTheHost) {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},   {1, 13},  {13, 1},   {3, 5},     {63, 65},
                                                {64, 64}, {8, 200}, {136, 72}, {257, 129}, {200, 1032}};
  for (const auto& [R, C] : shapes)
    for (DType dt : kFloatTypes)
      for (DType q : kFp8Types)
        for (float s : {0.7f, 300.f})
          for (int64_t off : kViewOffsets)
            for (int layout = 0; layout < 3; ++layout)  // both, rows only, transposed only
              for (bool with_amax : {false, true}) {
                if ((layout != 0 || dt != DType::bf16) && (with_amax || s != 300.f)) continue;  // fewer cases
                const Both x = both_at(fp8_inputs(R * C, 4500 + static_cast<uint32_t>(R * C)), {R, C}, dt, off);
                const Both scale = both({s}, {1}, DType::f32);
                Both out = layout == 2 ? Both{} : poisoned_at({R, C}, q, off);
                Both out_t = layout == 1 ? Both{} : poisoned_at({C, R}, q, off);
                Both amax = both({0.5}, {1}, DType::f32);
                for (auto dev : kDevices)
                  fp8_quantize_transpose(x.*dev, scale.*dev, out.*dev, out_t.*dev, with_amax ? &(amax.*dev) : nullptr);
                const std::string what = str(dtype_name(dt), " -> ", dtype_name(q), " ", R, "x", C, " scale ", s,
                                             " offset ", off, " layout ", layout, with_amax ? " with amax" : "");
                if (layout != 2) EXPECT_EQ(first_mismatch(out.gpu, out.cpu), -1) << "cast " << what;
                if (layout != 1) EXPECT_EQ(first_mismatch(out_t.gpu, out_t.cpu), -1) << "transpose " << what;
                EXPECT_EQ(first_mismatch(amax.gpu, amax.cpu), -1)
                    << "amax " << what << ": host " << amax.cpu.item() << ", GPU " << amax.gpu.item();
              }
}

// gemm_fp8 on the GPU (cuBLASLt, scale pointers on the device, operands transposed into the TN form) against the
// CPU's emulation: every transpose combination of the linear layers' GEMMs, e4m3 x e4m3 and e5m2 x e4m3 (the
// hybrid format's gradients), bf16 and accumulated f32 outputs, the bias epilogue.
TEST_F(CudaOps, GemmFp8MatchesTheCpuEmulation) {
  constexpr int64_t M = 32, N = 48, K = 64;
  for (DType qa : kFp8Types)
    for (DType out_dt : {DType::bf16, DType::f32})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (bool bias : {false, true}) {
            if (bias && out_dt == DType::f32) continue;  // the layers add a bias to bf16 outputs only
            const Shape sa = ta ? Shape{K, M} : Shape{M, K}, sb = tb ? Shape{N, K} : Shape{K, N};
            const Both xa = both(rand_vec(M * K, 81, -3, 3), sa, DType::f32);
            const Both xb = both(rand_vec(K * N, 82, -0.1, 0.1), sb, DType::f32);
            const Both scale_a = both({100.0}, {1}, DType::f32), scale_b = both({3000.0}, {1}, DType::f32);
            const Both inv_a = both({1 / 100.0}, {1}, DType::f32), inv_b = both({1 / 3000.0}, {1}, DType::f32);
            const Both bias_v = both(rand_vec(N, 83), {N}, out_dt);
            Both q_a = poisoned(sa, qa), q_b = poisoned(sb, DType::e4m3);
            Both out = both(rand_vec(M * N, 84), {M, N}, out_dt);
            for (auto dev : kDevices) {
              fp8_quantize(xa.*dev, scale_a.*dev, q_a.*dev);
              fp8_quantize(xb.*dev, scale_b.*dev, q_b.*dev);
              GemmOptions g{.trans_a = ta, .trans_b = tb, .beta = out_dt == DType::f32 ? 1.f : 0.f};
              if (bias) {
                g.epilogue = Epilogue::bias;
                g.bias = &(bias_v.*dev);
              }
              gemm_fp8(q_a.*dev, inv_a.*dev, q_b.*dev, inv_b.*dev, out.*dev, g);
            }
            EXPECT_EQ(first_mismatch(q_a.gpu, q_a.cpu), -1);
            // fp32 outputs within 1e-3: Hopper's fp8 tensor cores accumulate with fewer bits than fp32 (1.5e-4 of the
            // largest measured on an H200 against the CPU's fp32 sums).
            expect_match(out, out_dt == DType::bf16 ? 1e-2 : 1e-3,
                         str("gemm_fp8 ", dtype_name(qa), " x e4m3 -> ", dtype_name(out_dt), " trans_a ", ta,
                             " trans_b ", tb, bias ? " bias" : ""));
          }
}

// A scale_inv 4 bytes into an array (the delayed recipe's first layout, which cuBLASLt refused with status 15) is
// refused by name before cuBLASLt sees it.
TEST_F(CudaOps, GemmFp8RefusesMisalignedScalePointers) {
  const Both a = both(rand_vec(32 * 32, 85), {32, 32}, DType::f32), scales = both({1.0, 1.0}, {2}, DType::f32);
  Both qa = poisoned({32, 32}, DType::e4m3);
  Both out = poisoned({32, 32}, DType::bf16);
  fp8_quantize(a.gpu, scales.gpu.slice(0, 1), qa.gpu);
  EXPECT_THROW(gemm_fp8(qa.gpu, scales.gpu.slice(1, 2), qa.gpu, scales.gpu.slice(0, 1), out.gpu, {.trans_b = true}),
               std::invalid_argument);
  EXPECT_NO_THROW(gemm_fp8(qa.gpu, scales.gpu.slice(0, 1), qa.gpu, scales.gpu.slice(0, 1), out.gpu, {.trans_b = true}));
}

}  // namespace
}  // namespace mt
