// test_cuda_ops.gemm_grouped.cpp: the CUDA grouped GEMM (cublasGemmGroupedBatchedEx, and the gemm loop it falls
// back to for fp32 outputs of half inputs and K = 0) against the CPU reference, within gemm's tolerances: shapes
// differing per group, every transpose, alpha and beta, empty groups, MoE's row slices of one tensor.
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); each test skips where no GPU can run it.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, Both, CudaOps, the checks of cuda_op_checks.h

struct GroupShape {
  int64_t M, K, N;
};

class CudaGemmGrouped : public CudaOps, public ::testing::WithParamInterface<std::tuple<bool, bool>> {};

TEST_P(CudaGemmGrouped, MatchesCpuForEveryDtypeOutDtypeAndAlphaBeta) {
  const auto [ta, tb] = GetParam();
  const std::vector<GroupShape> shapes = {{37, 29, 53}, {0, 8, 16}, {64, 96, 128},
                                          {1, 5, 3},    {7, 0, 5},  {130, 257, 67}};
  uint32_t seed = 3000;
  for (DType dt : kFloatTypes) {
    const std::vector<DType> out_dtypes =
        dt == DType::f32 ? std::vector<DType>{DType::f32} : std::vector<DType>{dt, DType::f32};
    for (DType out_dt : out_dtypes)
      for (const auto& [alpha, beta] : {std::pair{1.f, 0.f}, std::pair{0.5f, 0.75f}, std::pair{-1.25f, 1.f}}) {
        std::vector<Both> a, b, c;
        for (const GroupShape& s : shapes) {
          a.push_back(both(rand_vec(s.M * s.K, ++seed), ta ? Shape{s.K, s.M} : Shape{s.M, s.K}, dt));
          b.push_back(both(rand_vec(s.K * s.N, ++seed), tb ? Shape{s.N, s.K} : Shape{s.K, s.N}, dt));
          c.push_back(beta == 0.f ? poisoned({s.M, s.N}, out_dt)
                                  : both(rand_vec(s.M * s.N, ++seed), {s.M, s.N}, out_dt));
        }
        const GemmOptions opt{.trans_a = ta, .trans_b = tb, .alpha = alpha, .beta = beta};
        for (auto d : kDevices) {
          std::vector<Tensor> da, db, dc;
          for (size_t g = 0; g < shapes.size(); ++g) {
            da.push_back(a[g].*d);
            db.push_back(b[g].*d);
            dc.push_back(c[g].*d);
          }
          gemm_grouped(da, db, dc, opt);
        }
        for (size_t g = 0; g < shapes.size(); ++g)
          expect_match(
              c[g], tol_for(dt),
              str("gemm_grouped group ", g, " ", shapes[g].M, "x", shapes[g].K, "x", shapes[g].N, " trans_a=", ta,
                  " trans_b=", tb, " ", dtype_name(dt), " -> ", dtype_name(out_dt), " alpha=", alpha, " beta=", beta));
      }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, CudaGemmGrouped, ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "At" : "A") +
                                  (std::get<1>(info.param) ? "Bt" : "B");
                         });

// MoE's GEMMs: the groups' rows are consecutive slices of one tensor (a zero-row expert among them, slices
// aligned to the element size only): x W1^T forward and the accumulated weight gradient dW += dy^T x.
TEST_F(CudaOps, GemmGroupedOnExpertRowSlices) {
  const int64_t C = 24, F = 40;
  const std::vector<int64_t> rows = {5, 0, 17, 1, 9};
  int64_t R = 0;
  for (int64_t n : rows) R += n;
  for (DType dt : {DType::f32, DType::bf16}) {
    const Both x = both(rand_vec(R * C, 3100), {R, C}, dt);
    const Both dy = both(rand_vec(R * F, 3101), {R, F}, dt);
    Both h = poisoned({R, F}, dt);
    std::vector<Both> w, dw;
    for (size_t l = 0; l < rows.size(); ++l) {
      w.push_back(both(rand_vec(F * C, 3110 + static_cast<uint32_t>(l)), {F, C}, dt));
      dw.push_back(both(rand_vec(F * C, 3120 + static_cast<uint32_t>(l)), {F, C}, DType::f32));
    }
    for (auto d : kDevices) {
      std::vector<Tensor> xs, dys, hs, ws, dws;
      int64_t row = 0;
      for (size_t l = 0; l < rows.size(); ++l) {
        xs.push_back((x.*d).slice(row, row + rows[l]));
        dys.push_back((dy.*d).slice(row, row + rows[l]));
        hs.push_back((h.*d).slice(row, row + rows[l]));
        ws.push_back(w[l].*d);
        dws.push_back(dw[l].*d);
        row += rows[l];
      }
      gemm_grouped(xs, ws, hs, {.trans_b = true});
      // dW (F, C) f32 += dy^T x from half inputs: the gemm fallback; f32 inputs: the grouped call.
      gemm_grouped(dys, xs, dws, {.trans_a = true, .beta = 1.f});
    }
    expect_match(h, tol_for(dt), str("gemm_grouped x W^T on expert rows, ", dtype_name(dt)));
    for (size_t l = 0; l < rows.size(); ++l)
      expect_match(dw[l], tol_for(dt), str("gemm_grouped dW += dy^T x, expert ", l, ", ", dtype_name(dt)));
  }
}

}  // namespace
}  // namespace mt
