// test_ops.fused.cpp: the CPU GEMM epilogues and dropout_add equal the unfused sequence of ops bit for bit.
// One of the sources of test_ops (tests/CMakeLists.txt); the shared references are in op_reference.h.
#include <gtest/gtest.h>

#include <cstring>

#include "core/base/rng.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, the references of op_reference.h

// ---- fused ops: each equals the unfused sequence bit for bit -------------------------------------
// The GEMM epilogues and dropout_add exist for the GPU; on the CPU they must compute exactly what the models
// computed with the separate ops, so CPU losses do not move.

void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  const std::vector<float> g = got.to_floats(), w = want.to_floats();
  ASSERT_EQ(g.size(), w.size()) << what;
  EXPECT_EQ(0, std::memcmp(g.data(), w.data(), g.size() * sizeof(float))) << what;
}

TEST(FusedOps, GemmEpiloguesEqualTheSeparateOps) {
  const int64_t M = 7, K = 9, N = 12;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const std::string in_dt = std::string(" ") + std::string(dtype_name(dt));
    const Tensor x = make(rand_vec(M * K, 801, -2, 2), {M, K}, dt), w = make(rand_vec(N * K, 802), {N, K}, dt);
    const Tensor bias = make(rand_vec(N, 803), {N}, dt);
    for (float beta : {0.f, 0.75f}) {
      const Tensor start = make(rand_vec(M * N, 804), {M, N}, dt);
      Tensor fused = start.clone(), ref = start.clone();
      gemm(x, w, fused, {.trans_b = true, .beta = beta, .epilogue = Epilogue::bias, .bias = &bias});
      gemm(x, w, ref, {.trans_b = true, .beta = beta});
      add_bias(ref, bias);
      expect_same_bits(fused, ref, "bias" + in_dt);
    }

    Tensor out = Tensor::empty({M, N}, dt), aux = Tensor::empty({M, N}, dt);
    gemm(x, w, out, {.trans_b = true, .epilogue = Epilogue::gelu_bias, .bias = &bias, .aux = &aux});
    Tensor pre = Tensor::empty({M, N}, dt), act = Tensor::empty({M, N}, dt);
    gemm(x, w, pre, {.trans_b = true});
    add_bias(pre, bias);
    gelu_forward(pre, act);
    expect_same_bits(aux, pre, "gelu_bias aux" + in_dt);
    expect_same_bits(out, act, "gelu_bias out" + in_dt);

    // Backward of fc1 through fc2: dfc1 = (dy @ w2) * gelu'(pre), dbias += its column sums.
    const Tensor dy = make(rand_vec(M * K, 805), {M, K}, dt), w2 = make(rand_vec(K * N, 806), {K, N}, dt);
    const Vec prior = rand_vec(N, 807, -3, 3);
    Tensor dfc1 = Tensor::empty({M, N}, dt), dbias = make(prior, {N});
    gemm(dy, w2, dfc1, {.epilogue = Epilogue::dgelu_bgrad, .aux = &pre, .dbias = &dbias});
    Tensor dgelu = Tensor::empty({M, N}, dt), dfc1_ref = Tensor::empty({M, N}, dt), dbias_ref = make(prior, {N});
    gemm(dy, w2, dgelu);
    gelu_backward(pre, dgelu, dfc1_ref);
    bias_backward(dfc1_ref, dbias_ref);
    expect_same_bits(dfc1, dfc1_ref, "dgelu_bgrad out" + in_dt);
    expect_same_bits(dbias, dbias_ref, "dgelu_bgrad dbias" + in_dt);

    // Weight gradient dW (N, K) += dout^T x with the bias gradient of dout (M tokens, N features).
    const Tensor dout = make(rand_vec(M * N, 808), {M, N}, dt);
    const Tensor dw0 = make(rand_vec(N * K, 809), {N, K});
    Tensor dw = dw0.clone(), dw_ref = dw0.clone(), db = make(prior, {N}), db_ref = make(prior, {N});
    gemm(dout, x, dw, {.trans_a = true, .beta = 1.f, .epilogue = Epilogue::bgrad_a, .dbias = &db});
    gemm(dout, x, dw_ref, {.trans_a = true, .beta = 1.f});
    bias_backward(dout, db_ref);
    expect_same_bits(dw, dw_ref, "bgrad_a dW" + in_dt);
    expect_same_bits(db, db_ref, "bgrad_a dbias" + in_dt);
  }
}

TEST(FusedOps, DropoutAddEqualsDropoutThenAdd) {
  const int64_t B = 2, T = 5, C = 13;
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (float p : {0.f, 0.3f}) {
      const std::string what = std::string(dtype_name(dt)) + " p=" + std::to_string(p);
      const DropoutOptions opt{.p = p,
                               .seed = 77,
                               .site = stream_id("layers.1.mlp.out"),
                               .sample_offset = 2,
                               .row_offset = 3,
                               .col_offset = 5};
      const Tensor x = make(rand_vec(B * T * C, 820, -3, 3), {B, T, C}, dt);
      const Tensor residual = make(rand_vec(B * T * C, 821, -3, 3), {B, T, C}, dt);
      Tensor out = Tensor::empty({B, T, C}, dt), dropped = Tensor::empty({B, T, C}, dt);
      Tensor ref = Tensor::empty({B, T, C}, dt);
      dropout_add(x, residual, out, opt);
      dropout_forward(x, dropped, opt);
      add(residual, dropped, ref);
      expect_same_bits(out, ref, "dropout_add " + what);
      Tensor inplace = residual.clone();  // out aliasing the residual
      dropout_add(x, inplace, inplace, opt);
      expect_same_bits(inplace, ref, "dropout_add in place " + what);
    }
}

TEST(FusedOps, EpilogueArgumentErrors) {
  auto f32 = [](Shape s) { return Tensor::zeros(std::move(s), DType::f32); };
  Tensor a = f32({4, 3}), b = f32({5, 3}), out = f32({4, 5}), bias = f32({5}), aux = f32({4, 5});
  expect_invalid([&] { gemm(a, b, out, {.trans_b = true, .epilogue = Epilogue::gelu_bias, .bias = &bias}); },
                 "gemm: epilogue gelu_bias needs opt.aux");
  expect_invalid([&] { gemm(a, b, out, {.trans_b = true, .bias = &bias}); },
                 "gemm: opt.bias is set but epilogue none does not use it");
  Tensor short_bias = f32({4});
  expect_invalid([&] { gemm(a, b, out, {.trans_b = true, .epilogue = Epilogue::bias, .bias = &short_bias}); },
                 "gemm: bias: expected shape [5]");
  expect_invalid(
      [&] {
        gemm(a, b, out, {.trans_b = true, .beta = 1.f, .epilogue = Epilogue::gelu_bias, .bias = &bias, .aux = &aux});
      },
      "gemm: epilogue gelu_bias needs beta == 0");
  Tensor dbias4 = f32({4}), dbias_half = Tensor::zeros({5}, DType::bf16);
  expect_invalid([&] { gemm(a, b, out, {.trans_b = true, .epilogue = Epilogue::bgrad_a, .dbias = &dbias4}); },
                 "gemm: epilogue bgrad_a needs trans_a");
  expect_invalid(
      [&] { gemm(a, b, out, {.trans_b = true, .epilogue = Epilogue::dgelu_bgrad, .aux = &aux, .dbias = &dbias_half}); },
      "gemm: dbias: expected dtype fp32");
  Tensor x3 = f32({2, 2, 8});
  expect_invalid([&] { dropout_add(x3, f32({2, 2, 7}), x3, {.p = 0.1f}); }, "dropout_add: residual");
}

}  // namespace
}  // namespace mt
