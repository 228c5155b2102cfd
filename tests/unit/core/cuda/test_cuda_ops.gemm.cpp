// test_cuda_ops.gemm.cpp: the CUDA GEMM (every transpose, dtype, out dtype, alpha and beta; unaligned rows,
// empty dimensions) and its cuBLASLt epilogues against the CPU reference.
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); each test skips where no GPU can run it, and
// cuda_op_checks.h says how the GPU is compared with the CPU.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, Both, CudaOps, the checks of cuda_op_checks.h

// ---- GEMM ----------------------------------------------------------------------------------------

struct GemmShape {
  int64_t M, K, N;
};

class CudaGemm : public CudaOps, public ::testing::WithParamInterface<std::tuple<bool, bool>> {};

TEST_P(CudaGemm, MatchesCpuForEveryDtypeOutDtypeAndAlphaBeta) {
  const auto [ta, tb] = GetParam();
  uint32_t seed = 100;
  for (const GemmShape& s :
       {GemmShape{37, 29, 53}, GemmShape{1, 5, 3}, GemmShape{64, 96, 128}, GemmShape{130, 257, 67}}) {
    const int64_t M = s.M, K = s.K, N = s.N;
    for (DType dt : kFloatTypes) {
      const std::vector<DType> out_dtypes =
          dt == DType::f32 ? std::vector<DType>{DType::f32} : std::vector<DType>{dt, DType::f32};
      for (DType out_dt : out_dtypes)
        for (const auto& [alpha, beta] : {std::pair{1.f, 0.f}, std::pair{0.5f, 0.75f}, std::pair{-1.25f, 1.f}}) {
          const Both a = both(rand_vec(M * K, ++seed), ta ? Shape{K, M} : Shape{M, K}, dt);
          const Both b = both(rand_vec(K * N, ++seed), tb ? Shape{N, K} : Shape{K, N}, dt);
          Both out = beta == 0.f ? poisoned({M, N}, out_dt) : both(rand_vec(M * N, ++seed), {M, N}, out_dt);
          const GemmOptions opt{.trans_a = ta, .trans_b = tb, .alpha = alpha, .beta = beta};
          for (auto d : kDevices) gemm(a.*d, b.*d, out.*d, opt);
          expect_match(out, tol_for(dt),
                       str("gemm ", M, "x", K, "x", N, " trans_a=", ta, " trans_b=", tb, " ", dtype_name(dt), " -> ",
                           dtype_name(out_dt), " alpha=", alpha, " beta=", beta));
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, CudaGemm, ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "At" : "A") +
                                  (std::get<1>(info.param) ? "Bt" : "B");
                         });

// Row slices start at addresses aligned only to the element size; the GEMM must still pick a usable algorithm.
TEST_F(CudaOps, GemmOnUnalignedRowSlices) {
  const int64_t M = 21, K = 29, N = 37;
  for (DType dt : kFloatTypes) {
    const Both a = both(rand_vec((M + 1) * K, 200), {M + 1, K}, dt);
    const Both b = both(rand_vec((N + 1) * K, 201), {N + 1, K}, dt);
    Both out = both(rand_vec((M + 3) * N, 202), {M + 3, N}, dt);
    for (auto d : kDevices) {
      Tensor o = (out.*d).slice(3, M + 3);
      gemm((a.*d).slice(1, M + 1), (b.*d).slice(1, N + 1), o, {.trans_b = true, .alpha = 1.f, .beta = 0.5f});
    }
    expect_match(out, tol_for(dt), str("gemm on row slices, ", dtype_name(dt)));
  }
}

// K == 0 leaves beta * out (zeros for beta == 0, whatever out held); M == 0 or N == 0 is a no-op.
TEST_F(CudaOps, GemmWithEmptyDimensions) {
  const int64_t M = 7, N = 5;
  for (DType dt : kFloatTypes)
    for (bool ta : {false, true})
      for (float beta : {0.f, 0.5f, 1.f}) {
        const Both a = both({}, ta ? Shape{0, M} : Shape{M, 0}, dt), b = both({}, {0, N}, dt);
        Both out = beta == 0.f ? poisoned({M, N}, dt) : both(rand_vec(M * N, 210), {M, N}, dt);
        for (auto d : kDevices) gemm(a.*d, b.*d, out.*d, {.trans_a = ta, .alpha = 2.f, .beta = beta});
        expect_match(out, tol_for(dt), str("gemm with K = 0, ", dtype_name(dt), " beta=", beta));
      }
  for (DType dt : kFloatTypes) {
    Both empty_rows = poisoned({0, N}, dt), empty_cols = poisoned({M, 0}, dt);
    const Both a0 = both({}, {0, 3}, dt), b = both(rand_vec(3 * N, 211), {3, N}, dt);
    const Both a = both(rand_vec(M * 3, 212), {M, 3}, dt), b0 = both({}, {3, 0}, dt);
    for (auto d : kDevices) {
      gemm(a0.*d, b.*d, empty_rows.*d, {.beta = 1.f});
      gemm(a.*d, b0.*d, empty_cols.*d, {});
    }
    EXPECT_EQ(empty_rows.gpu.numel(), 0);
    EXPECT_EQ(empty_cols.gpu.numel(), 0);
  }
}

// ---- GEMM epilogues and fused kernels ------------------------------------------------------------
// Each cuBLASLt epilogue (core/cuda/gemm.cpp) and the fused residual + dropout kernel against the CPU
// reference, which runs the unfused sequence. Shapes with N a multiple of 8 take cuBLASLt's fused epilogue
// (bf16/f16 for the GELU ones); the others exercise the composed fallback. The fused results round once where
// the CPU rounds twice, hence the dtype tolerances rather than exact equality.

struct EpilogueShape {
  int64_t M, K, N;
};
constexpr EpilogueShape kEpilogueShapes[] = {{64, 40, 96}, {37, 29, 53}, {128, 64, 256}};

TEST_F(CudaOps, GemmBiasEpilogue) {
  uint32_t seed = 900;
  for (const auto& [M, K, N] : kEpilogueShapes)
    for (DType dt : kFloatTypes)
      for (float beta : {0.f, 0.5f}) {
        const Both x = both(rand_vec(M * K, ++seed), {M, K}, dt);
        const Both w = both(rand_vec(N * K, ++seed), {N, K}, dt);  // (out, in): x @ w^T, as linear_forward
        const Both bias = both(rand_vec(N, ++seed), {N}, dt);
        Both out = beta == 0.f ? poisoned({M, N}, dt) : both(rand_vec(M * N, ++seed), {M, N}, dt);
        for (auto d : kDevices)
          gemm(x.*d, w.*d, out.*d, {.trans_b = true, .beta = beta, .epilogue = Epilogue::bias, .bias = &(bias.*d)});
        expect_match(out, tol_for(dt), str("gemm+bias ", M, "x", K, "x", N, " ", dtype_name(dt), " beta=", beta));
      }
}

TEST_F(CudaOps, GemmGeluBiasEpilogueKeepsThePreActivation) {
  uint32_t seed = 920;
  for (const auto& [M, K, N] : kEpilogueShapes)
    for (DType dt : kFloatTypes) {
      const Both x = both(rand_vec(M * K, ++seed), {M, K}, dt);
      const Both w = both(rand_vec(N * K, ++seed), {N, K}, dt);
      const Both bias = both(rand_vec(N, ++seed), {N}, dt);
      Both out = poisoned({M, N}, dt), aux = poisoned({M, N}, dt);
      for (auto d : kDevices)
        gemm(x.*d, w.*d, out.*d,
             {.trans_b = true, .epilogue = Epilogue::gelu_bias, .bias = &(bias.*d), .aux = &(aux.*d)});
      const std::string what = str(" ", M, "x", K, "x", N, " ", dtype_name(dt));
      expect_match(aux, tol_for(dt), "gemm+gelu_bias aux (pre-activation)" + what);
      expect_match(out, tol_for(dt), "gemm+gelu_bias out" + what);
    }
}

TEST_F(CudaOps, GemmDgeluBgradEpilogueAccumulatesTheBiasGradient) {
  uint32_t seed = 940;
  for (const auto& [M, K, N] : kEpilogueShapes)
    for (DType dt : kFloatTypes) {
      const Both dy = both(rand_vec(M * K, ++seed), {M, K}, dt);          // (tokens, C): dmlp
      const Both w2 = both(rand_vec(K * N, ++seed), {K, N}, dt);          // (C, F): fc2's weight
      const Both pre = both(rand_vec(M * N, ++seed, -3, 3), {M, N}, dt);  // fc1's pre-activation
      Both out = poisoned({M, N}, dt);
      Both dbias = both(rand_vec(N, ++seed, -5, 5), {N}, DType::f32);  // nonzero start: must be added to
      for (auto d : kDevices) {
        Tensor aux = pre.*d;
        gemm(dy.*d, w2.*d, out.*d, {.epilogue = Epilogue::dgelu_bgrad, .aux = &aux, .dbias = &(dbias.*d)});
      }
      const std::string what = str(" ", M, "x", K, "x", N, " ", dtype_name(dt));
      expect_match(out, tol_for(dt), "gemm+dgelu_bgrad out" + what);
      expect_match(dbias, tol_for(dt), "gemm+dgelu_bgrad dbias" + what);
    }
}

TEST_F(CudaOps, GemmBgradEpilogueOfTheWeightGradient) {
  uint32_t seed = 960;
  for (const auto& [M, K, N] : kEpilogueShapes)
    for (DType dt : kFloatTypes) {
      // dW (M = out features, N = in features) += dout^T (M, K tokens) @ x (K, N), out f32 as a weight gradient.
      const Both dout = both(rand_vec(K * M, ++seed), {K, M}, dt);
      const Both x = both(rand_vec(K * N, ++seed), {K, N}, dt);
      Both dw = both(rand_vec(M * N, ++seed), {M, N}, DType::f32);
      Both dbias = both(rand_vec(M, ++seed, -5, 5), {M}, DType::f32);
      for (auto d : kDevices)
        gemm(dout.*d, x.*d, dw.*d, {.trans_a = true, .beta = 1.f, .epilogue = Epilogue::bgrad_a, .dbias = &(dbias.*d)});
      const std::string what = str(" ", M, "x", K, "x", N, " ", dtype_name(dt));
      expect_match(dw, tol_for(dt), "gemm+bgrad_a dW" + what);
      expect_match(dbias, tol_for(dt), "gemm+bgrad_a dbias" + what);
    }
}

}  // namespace
}  // namespace mt
