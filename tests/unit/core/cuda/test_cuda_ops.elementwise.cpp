// test_cuda_ops.elementwise.cpp: the CUDA bias, add, scale, transpose and GELU ops against the CPU reference, and the
// 16-byte vector and scalar forms of the flat ops, SwiGLU and the bias on tails and misaligned views.
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); each test skips where no GPU can run it, and
// cuda_op_checks.h says how the GPU is compared with the CPU.
#include <gtest/gtest.h>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, Both, CudaOps, the checks of cuda_op_checks.h

// ---- bias and elementwise ------------------------------------------------------------------------

TEST_F(CudaOps, AddBias) {
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{37, 53}, {4, 1024}})
    for (DType dt : kFloatTypes) {
      Both x = both(rand_vec(N * C, 300, -3, 3), {N, C}, dt);
      const Both bias = both(rand_vec(C, 301), {C}, dt);
      for (auto d : kDevices) add_bias(x.*d, bias.*d);
      expect_match(x, tol_for(dt), str("add_bias ", dtype_name(dt)));
    }
}

TEST_F(CudaOps, BiasBackwardAccumulates) {
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{300, 67}, {1024, 8}, {3, 2048}})
    for (DType dt : kFloatTypes) {
      const Both dout = both(rand_vec(N * C, 310), {N, C}, dt);
      Both dbias = both(rand_vec(C, 311, -5, 5), {C}, DType::f32);  // nonzero start: must be added to
      for (auto d : kDevices) bias_backward(dout.*d, dbias.*d);
      expect_match(dbias, tol_for(dt), str("bias_backward ", N, "x", C, " ", dtype_name(dt)));
    }
}

TEST_F(CudaOps, AddAndScale) {
  const int64_t N = 37, C = 129;
  for (DType dt : kFloatTypes) {
    const Both a = both(rand_vec(N * C, 320, -4, 4), {N, C}, dt), b = both(rand_vec(N * C, 321), {N, C}, dt);
    Both out = poisoned({N, C}, dt);
    for (auto d : kDevices) add(a.*d, b.*d, out.*d);
    expect_match(out, tol_for(dt), str("add ", dtype_name(dt)));

    Both inplace = both(rand_vec(N * C, 322), {N, C}, dt);  // out aliasing a
    for (auto d : kDevices) add(inplace.*d, b.*d, inplace.*d);
    expect_match(inplace, tol_for(dt), str("add in place ", dtype_name(dt)));

    Both x = both(rand_vec(N * C, 323, -4, 4), {N, C}, dt);
    for (auto d : kDevices) scale_(x.*d, -0.37f);
    expect_match(x, tol_for(dt), str("scale_ ", dtype_name(dt)));
  }
}

// Both loop orders of the CUDA version (one strided copy per index of the shorter leading dimension), exact.
TEST_F(CudaOps, TransposeBlocksMovesEveryBlock) {
  for (auto [P, Q, L] : {std::tuple<int64_t, int64_t, int64_t>{2, 5, 7}, {5, 2, 7}, {3, 3, 1}, {1, 4, 6}})
    for (DType dt : kFloatTypes) {
      const Both x = both(rand_vec(P * Q * L, 330), {P, Q, L}, dt);
      Both out = poisoned({Q, P, L}, dt);
      for (auto d : kDevices) transpose_blocks(x.*d, out.*d);
      expect_exact(out, str("transpose_blocks ", P, "x", Q, "x", L, " ", dtype_name(dt)));
    }
}

TEST_F(CudaOps, GeluForwardAndBackward) {
  const int64_t N = 41, C = 257;
  for (DType dt : kFloatTypes) {
    const Both x = both(rand_vec(N * C, 330, -5, 5), {N, C}, dt), dout = both(rand_vec(N * C, 331), {N, C}, dt);
    Both out = poisoned({N, C}, dt), dx = poisoned({N, C}, dt);
    for (auto d : kDevices) {
      gelu_forward(x.*d, out.*d);
      gelu_backward(x.*d, dout.*d, dx.*d);
    }
    expect_match(out, tol_for(dt), str("gelu_forward ", dtype_name(dt)));
    expect_match(dx, tol_for(dt), str("gelu_backward ", dtype_name(dt)));
  }
}

// ---- 16-byte vector forms: tails, odd row lengths, misaligned views ---------------------------------
// Each op on sizes and row lengths around the vector width (tails), on views at offset 0 and 1 (the vector and
// scalar forms), against the CPU; where an op has no reduction, its two GPU results must also be the same bits:
// the two forms do the same arithmetic per element. (The norms' cases are in their tests above.)

TEST_F(CudaOps, FlatOpsOnTailsAndMisalignedViews) {
  for (int64_t n : kTailSizes)
    for (DType dt : kFloatTypes) {
      const std::string size = str(" n=", n, " ", dtype_name(dt));
      const Vec av = rand_vec(n, 1400, -4, 4), bv = rand_vec(n, 1401), dv = rand_vec(n, 1402);
      std::vector<Tensor> sums, inplaces, scaleds, gelus, dgelus;
      for (int64_t off : kViewOffsets) {
        const std::string what = str(size, " at offset ", off);
        const Both a = both_at(av, {n}, dt, off), b = both_at(bv, {n}, dt, off), d = both_at(dv, {n}, dt, off);
        Both sum = poisoned_at({n}, dt, off), inplace = both_at(av, {n}, dt, off);
        Both scaled = both_at(av, {n}, dt, off), g = poisoned_at({n}, dt, off), dg = poisoned_at({n}, dt, off);
        for (auto dev : kDevices) {
          add(a.*dev, b.*dev, sum.*dev);
          add(inplace.*dev, b.*dev, inplace.*dev);  // out aliasing a
          scale_(scaled.*dev, -0.37f);
          gelu_forward(a.*dev, g.*dev);
          gelu_backward(a.*dev, d.*dev, dg.*dev);
        }
        expect_match(sum, tol_for(dt), "add" + what);
        expect_match(inplace, tol_for(dt), "add in place" + what);
        expect_match(scaled, tol_for(dt), "scale_" + what);
        expect_match(g, tol_for(dt), "gelu_forward" + what);
        expect_match(dg, tol_for(dt), "gelu_backward" + what);
        sums.push_back(sum.gpu);
        inplaces.push_back(inplace.gpu);
        scaleds.push_back(scaled.gpu);
        gelus.push_back(g.gpu);
        dgelus.push_back(dg.gpu);
      }
      expect_same_bits(sums, "add" + size);
      expect_same_bits(inplaces, "add in place" + size);
      expect_same_bits(scaleds, "scale_" + size);
      expect_same_bits(gelus, "gelu_forward" + size);
      expect_same_bits(dgelus, "gelu_backward" + size);
      // One operand misaligned among aligned ones: the scalar form for all.
      const Both a = both_at(av, {n}, dt, 0), b = both_at(bv, {n}, dt, 1);
      Both sum = poisoned_at({n}, dt, 0);
      for (auto dev : kDevices) add(a.*dev, b.*dev, sum.*dev);
      expect_match(sum, tol_for(dt), "add with b misaligned" + size);
      EXPECT_TRUE(bytes_of(sum.gpu) == bytes_of(sums[0])) << "add with b misaligned" << size;
    }
}

TEST_F(CudaOps, SwiGluOnTailsAndMisalignedViews) {
  for (int64_t F : {1, 7, 8, 13, 1000, 1003})
    for (int64_t N : {1, 3})
      for (DType dt : kFloatTypes) {
        const std::string size = str(" ", N, "x", F, " ", dtype_name(dt));
        Vec xv = rand_vec(N * 2 * F, 1410, -6, 6);
        xv[0] = 200.0;  // a tail of exp
        const Vec dv = rand_vec(N * F, 1411);
        std::vector<Tensor> outs, dxs;
        for (int64_t off : kViewOffsets) {
          const std::string what = str(size, " at offset ", off);
          const Both x = both_at(xv, {N, 2 * F}, dt, off), dout = both_at(dv, {N, F}, dt, off);
          Both out = poisoned_at({N, F}, dt, off), dx = poisoned_at({N, 2 * F}, dt, off);
          for (auto dev : kDevices) {
            swiglu_forward(x.*dev, out.*dev);
            swiglu_backward(x.*dev, dout.*dev, dx.*dev);
          }
          expect_match(out, tol_for(dt), "swiglu_forward" + what);
          expect_match(dx, tol_for(dt), "swiglu_backward" + what);
          outs.push_back(out.gpu);
          dxs.push_back(dx.gpu);
        }
        expect_same_bits(outs, "swiglu_forward" + size);
        expect_same_bits(dxs, "swiglu_backward" + size);
      }
}

TEST_F(CudaOps, AddBiasOnOddRowsAndMisalignedViews) {
  for (int64_t C : kRowLengths)
    for (int64_t N : {1, 7})
      for (DType dt : kFloatTypes)
        for (const auto& [bias_dt, bias_off] : param_placements(dt)) {
          const std::string size =
              str(" ", N, "x", C, " ", dtype_name(dt), " bias ", dtype_name(bias_dt), " at offset ", bias_off);
          const Vec xv = rand_vec(N * C, 1430, -3, 3), bv = rand_vec(C, 1431);
          std::vector<Tensor> xs;
          for (int64_t off : kViewOffsets) {
            Both x = both_at(xv, {N, C}, dt, off);
            const Both bias = both_at(bv, {C}, bias_dt, bias_off);
            for (auto dev : kDevices) add_bias(x.*dev, bias.*dev);
            expect_match(x, tol_for(dt), str("add_bias", size, ", x at offset ", off));
            xs.push_back(x.gpu);
          }
          expect_same_bits(xs, "add_bias" + size);
        }
}

}  // namespace
}  // namespace mt
