// test_ops.half_storage.cpp: every CPU op on bf16 / fp16 storage equals the fp32 op on the same values, rounded once.
// One of the sources of test_ops (tests/CMakeLists.txt); the shared references are in op_reference.h.
#include <gtest/gtest.h>

#include <functional>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, the references of op_reference.h

// ---- bf16 / fp16 storage -------------------------------------------------------------------------

// run(dt, in) makes its inputs with in(values, shape) and its outputs in dtype dt (f32 for parameter
// gradients and statistics) and returns them. With half storage the outputs must equal those of the fp32
// op on the same (rounded) input values, rounded to the half dtype: bit-exact emulation.
using MakeInput = std::function<Tensor(const Vec&, Shape)>;
void expect_emulated(const std::function<std::vector<Tensor>(DType, const MakeInput&)>& run, const char* what) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const std::vector<Tensor> got = run(dt, [&](const Vec& v, Shape s) { return make(v, std::move(s), dt); });
    const std::vector<Tensor> ref =
        run(DType::f32, [&](const Vec& v, Shape s) { return make(rounded(v, dt), std::move(s), DType::f32); });
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const Vec want = rounded(values(ref[i]), got[i].dtype());
      EXPECT_EQ(values(got[i]), want) << what << " output " << i << " in " << dtype_name(dt);
    }
  }
}

TEST(HalfStorage, OpsEqualTheFp32OpRoundedOnce) {
  const int64_t N = 6, C = 8, B = 2, T = 3, H = 2, D = 4, V = 9;
  const Vec a = rand_vec(N * C, 51, -3, 3), b = rand_vec(N * C, 52), c = rand_vec(C, 53), c2 = rand_vec(C, 60);
  const std::vector<int32_t> ids = {1, 8, 0, 4, 4, 7};
  auto f32 = [](Shape s) { return Tensor::empty(std::move(s), DType::f32); };
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        Tensor out = Tensor::empty({N, C}, dt);
        add(in(a, {N, C}), in(b, {N, C}), out);
        Tensor x = in(a, {N, C}), y = in(b, {N, C});
        scale_(x, 0.3f);
        add_bias(y, in(c, {C}));
        return std::vector<Tensor>{out, x, y};
      },
      "add, scale_, add_bias");
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        Tensor g = Tensor::empty({N, C}, dt), dg = Tensor::empty({N, C}, dt), db = Tensor::zeros({C}, DType::f32);
        gelu_forward(in(a, {N, C}), g);
        gelu_backward(in(a, {N, C}), in(b, {N, C}), dg);
        bias_backward(in(b, {N, C}), db);
        return std::vector<Tensor>{g, dg, db};
      },
      "gelu, bias_backward");
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        Tensor out = Tensor::empty({N, C}, dt), mean = f32({N}), rstd = f32({N}), dx = Tensor::empty({N, C}, dt);
        Tensor dw = Tensor::zeros({C}, DType::f32), db = Tensor::zeros({C}, DType::f32);
        layernorm_forward(in(a, {N, C}), in(c, {C}), in(c2, {C}), out, mean, rstd);
        layernorm_backward(in(b, {N, C}), in(a, {N, C}), in(c, {C}), mean, rstd, dx, dw, db);
        return std::vector<Tensor>{out, mean, rstd, dx, dw, db};
      },
      "layernorm");
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        Tensor out = Tensor::empty({B, T, C}, dt), dtab = Tensor::zeros({V, C}, DType::f32);
        Tensor dwpe = Tensor::zeros({4, C}, DType::f32);
        embedding_forward(Tensor::from_ints(ids, {B, T}), in(rand_vec(V * C, 54), {V, C}), out);
        position_embedding_add(out, in(rand_vec(4 * C, 55), {4, C}), {.position_offset = 1});
        embedding_backward(Tensor::from_ints(ids, {B, T}), in(b, {B, T, C}), dtab);
        position_embedding_backward(in(b, {B, T, C}), dwpe, {.position_offset = 1});
        Tensor drop = Tensor::empty({B, T, C}, dt);
        dropout_forward(in(a, {B, T, C}), drop, {.p = 0.4f, .seed = 5, .site = 6});
        return std::vector<Tensor>{out, dtab, dwpe, drop};
      },
      "embeddings, dropout");
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        const Vec qkv = rand_vec(B * T * H * 3 * D, 56, -2, 2), dout = rand_vec(B * T * H * D, 57);
        const AttentionOptions opt{.dropout_p = 0.1f, .seed = 2, .site = 3};
        Tensor out = Tensor::empty({B, T, H, D}, dt), lse = f32({B, H, T}), dqkv = Tensor::empty({B, T, H, 3, D}, dt);
        attention_forward(in(qkv, {B, T, H, 3, D}), out, lse, opt);
        attention_backward(in(qkv, {B, T, H, 3, D}), out, lse, in(dout, {B, T, H, D}), dqkv, opt);
        return std::vector<Tensor>{out, lse, dqkv};
      },
      "attention");
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        auto [losses, dlogits] = cross_entropy_all(in(rand_vec(N * V, 58, -5, 5), {N, V}), Tensor::from_ints(ids, {N}),
                                                   make(rand_vec(N, 59), {N}));
        return std::vector<Tensor>{losses, dlogits};
      },
      "cross_entropy");
}

TEST(HalfStorage, LlamaOpsEqualTheFp32OpRoundedOnce) {
  const int64_t N = 6, C = 8, F = 5;
  const QkvShape q{2, 3, 2, 2, 6};
  const Vec a = rand_vec(N * C, 90, -3, 3), b = rand_vec(N * C, 91), c = rand_vec(C, 92, 0.5, 1.5);
  const Vec g = rand_vec(N * 2 * F, 93, -5, 5), dg = rand_vec(N * F, 94), qkv = rand_vec(q.numel(), 95, -2, 2);
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        Tensor out = Tensor::empty({N, C}, dt), rstd = Tensor::empty({N}, DType::f32), dx = Tensor::empty({N, C}, dt);
        Tensor dw = Tensor::zeros({C}, DType::f32);
        rmsnorm_forward(in(a, {N, C}), in(c, {C}), out, rstd);
        rmsnorm_backward(in(b, {N, C}), in(a, {N, C}), in(c, {C}), rstd, dx, dw);
        return std::vector<Tensor>{out, rstd, dx, dw};
      },
      "rmsnorm");
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        Tensor out = Tensor::empty({N, F}, dt), dx = Tensor::empty({N, 2 * F}, dt);
        swiglu_forward(in(g, {N, 2 * F}), out);
        swiglu_backward(in(g, {N, 2 * F}), in(dg, {N, F}), dx);
        return std::vector<Tensor>{out, dx};
      },
      "swiglu");
  expect_emulated(
      [&](DType dt, const MakeInput& in) {
        Tensor x = in(qkv, q.shape()), back = in(qkv, q.shape());
        rope_(x, {.position_offset = 2});
        rope_(back, {.position_offset = 2, .inverse = true});
        return std::vector<Tensor>{x, back};
      },
      "rope");
}

}  // namespace
}  // namespace mt
