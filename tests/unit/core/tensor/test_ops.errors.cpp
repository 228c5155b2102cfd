// test_ops.errors.cpp: the CPU ops' argument errors name the op and the argument.
// One of the sources of test_ops (tests/CMakeLists.txt); the shared references are in op_reference.h.
#include <gtest/gtest.h>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, the references of op_reference.h

// ---- argument errors -----------------------------------------------------------------------------

TEST(OpErrors, NameTheOpAndTheArgument) {
  auto f32 = [](Shape s) { return Tensor::zeros(std::move(s), DType::f32); };
  Tensor x = f32({4, 64}), out = f32({4, 64}), mean = f32({4}), rstd = f32({4});
  expect_invalid([&] { layernorm_forward(x, f32({32}), f32({64}), out, mean, rstd); },
                 "layernorm_forward: weight: expected shape [64], got [32]");
  expect_invalid(
      [&] {
        Tensor dw = Tensor::zeros({64}, DType::bf16), db = f32({64}), dx = f32({4, 64});
        layernorm_backward(out, x, f32({64}), mean, rstd, dx, dw, db);
      },
      "layernorm_backward: dweight: expected dtype fp32, got bf16");
  Tensor c = f32({4, 5});
  expect_invalid([&] { gemm(f32({4, 3}), f32({5, 3}), c); }, "gemm: inner dimensions differ");
  expect_invalid([&] { gemm(f32({4, 3}), Tensor::zeros({3, 5}, DType::bf16), c); }, "gemm: b: expected dtype fp32");
  expect_invalid([&] { gemm(f32({4, 3}), f32({3, 6}), c); }, "gemm: out: expected shape [4, 6], got [4, 5]");
  expect_invalid([&] { add(x, Tensor::zeros({4, 64}, DType::bf16), out); }, "add: b: expected dtype fp32");
  expect_invalid([&] { add_bias(x, f32({63})); }, "add_bias: bias");
  expect_invalid([&] { dropout_forward(x, out, {.p = 0.1f}); }, "dropout_forward: x: expected a 3-D tensor");
  Tensor x3 = f32({2, 2, 64});
  expect_invalid([&] { dropout_forward(x3, x3, {.p = 1.f}); }, "dropout_forward: dropout probability");
  Tensor ids = Tensor::from_ints(std::vector<int32_t>{0, 1, 2, 3}, {2, 2});
  expect_invalid([&] { embedding_forward(ids, f32({5, 64}), out); }, "embedding_forward: out");
  expect_invalid(
      [&] {
        embedding_forward(f32({2, 2}), f32({5, 64}), x3);
      },
      "embedding_forward: ids: expected dtype i32");
  expect_invalid(
      [&] {
        position_embedding_add(x3, f32({3, 64}), {.position_offset = 2});
      },
      "position_embedding_add: position_offset");
  Tensor qkv = f32({1, 4, 2, 3, 8}), att = f32({1, 4, 2, 8}), lse = f32({1, 2, 4});
  expect_invalid([&] { attention_forward(qkv, att, mean, {}); }, "attention_forward: lse: expected shape [1, 2, 4]");
  expect_invalid([&] { attention_forward(f32({1, 4, 2, 2, 8}), att, lse, {}); }, "attention_forward: qkv");
  Tensor rowmax22 = f32({2, 2});
  expect_invalid([&] { cross_entropy_rowmax(x, rowmax22); }, "cross_entropy_rowmax: rowmax: expected shape [4]");
  expect_invalid([&] { cross_entropy_partials(x, f32({4}), mean, rstd, rstd); }, "cross_entropy_partials: targets");
  expect_invalid([&] { adamw_step(mean, rstd, rstd, rstd, {.step = 0}); }, "adamw_step: step");
  expect_invalid([&] { sum_squares(Tensor::zeros({3}, DType::bf16)); }, "sum_squares: x: expected dtype fp32");
  expect_invalid([&] { has_inf_or_nan(Tensor()); }, "has_inf_or_nan: x");
}

TEST(OpErrors, LlamaOpsNameTheOpAndTheArgument) {
  auto f32 = [](Shape s) { return Tensor::zeros(std::move(s), DType::f32); };
  Tensor x = f32({4, 64}), out = f32({4, 64}), rstd = f32({4}), dw = f32({64});
  expect_invalid([&] { rmsnorm_forward(x, f32({32}), out, rstd); },
                 "rmsnorm_forward: weight: expected shape [64], got [32]");
  Tensor rstd41 = f32({4, 1}), dw63 = f32({63});
  expect_invalid([&] { rmsnorm_forward(x, f32({64}), out, rstd41); },
                 "rmsnorm_forward: rstd: expected shape [4], got [4, 1]");
  expect_invalid([&] { rmsnorm_forward(x, f32({64}), out, rstd, {.eps = -1.f}); }, "rmsnorm_forward: eps");
  expect_invalid(
      [&] {
        Tensor dx = Tensor::zeros({4, 64}, DType::bf16);
        rmsnorm_backward(out, x, f32({64}), rstd, dx, dw);
      },
      "rmsnorm_backward: dx: expected dtype fp32 (that of x), got bf16");
  expect_invalid([&] { rmsnorm_backward(out, x, f32({64}), rstd, out, dw63); },
                 "rmsnorm_backward: dweight: expected shape [64], got [63]");

  expect_invalid([&] { swiglu_forward(f32({4, 7}), out); }, "swiglu_forward: x: expected (N, 2F) with an even");
  expect_invalid([&] { swiglu_forward(x, out); }, "swiglu_forward: out: expected shape [4, 32], got [4, 64]");
  expect_invalid(
      [&] {
        Tensor o = Tensor::zeros({4, 32}, DType::f16);
        swiglu_forward(x, o);
      },
      "swiglu_forward: out: expected dtype fp32, got fp16");
  expect_invalid(
      [&] {
        swiglu_backward(x, f32({4, 31}), out);
      },
      "swiglu_backward: dout: expected shape [4, 32], got [4, 31]");
  expect_invalid([&] { swiglu_backward(x, f32({4, 32}), rstd); }, "swiglu_backward: dx");

  Tensor qkv = f32({1, 4, 2, 3, 8});
  expect_invalid([&] { rope_(x, {}); }, "rope_: qkv: expected a 5-D tensor (B, T, G, R + 2, D), got [4, 64]");
  expect_invalid(
      [&] {
        Tensor odd = f32({1, 4, 2, 3, 7});
        rope_(odd, {});
      },
      "rope_: qkv: expected shape (B, T, G, R + 2, D) with R >= 1 and an even D > 0, got [1, 4, 2, 3, 7]");
  expect_invalid(
      [&] {
        Tensor no_query = f32({1, 4, 2, 2, 8});
        rope_(no_query, {});
      },
      "rope_: qkv: expected shape (B, T, G, R + 2, D) with R >= 1");
  expect_invalid([&] { rope_(qkv, {.theta = 0.f}); }, "rope_: theta: must be a finite number > 0, got 0");
  expect_invalid([&] { rope_(qkv, {.position_offset = -1}); }, "rope_: position_offset: must be >= 0, got -1");
  expect_invalid(
      [&] {
        Tensor ids = Tensor::from_ints(std::vector<int32_t>(64, 0), {1, 4, 2, 1, 8});
        rope_(ids, {});
      },
      "rope_: qkv: expected a floating dtype");
}

}  // namespace
}  // namespace mt
