// test_lora_linear.cpp: LoRA adapters beside the tensor-parallel linears (parallel/layers/lora_linear.h). On one rank the
// layer computes y = x W^T + b + (alpha / r) (x A^T) B^T and its gradients as the formula says (A initialised as PEFT's
// kaiming-uniform, B zero); over 2 ranks (threads on Gloo), with and without sequence parallelism, the sharded
// adapter gives the unsplit one's output, input gradient and adapter gradients (the replicated factor's partial
// gradients summed over the ranks, as GradBuffer::finalize sums grad_sums.tensor), and a frozen weight gets no
// gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "core/tensor/ops.h"
#include "parallel/layers/parallel_linear.h"
#include "tests/unit/op_test_util.h"
#include "tests/unit/parallel/tp_test_util.h"

namespace mt {
namespace {

using namespace mt::test;
using namespace mt::tp_test;

constexpr int64_t kRank = 3;
constexpr float kAlpha = 6.f;

LinearOptions linear_options(const char* name, int64_t in, int64_t out) {
  return {.name = name, .in_features = in, .out_features = out, .bias = true, .init_std = 0.5f, .seed = 7};
}
LoraOptions lora_options(const char* name, int64_t in, int64_t out) {
  return {.name = name, .in_features = in, .out_features = out, .rank = kRank, .alpha = kAlpha, .seed = 7};
}
// The adapter's parameters of a layer (after its weight and bias).
Parameter& a_of(std::vector<Parameter*> ps) { return *ps.at(ps.size() - 2); }
Parameter& b_of(std::vector<Parameter*> ps) { return *ps.at(ps.size() - 1); }
// Gives B values (global (out, r), this parameter's block): B = 0 would hide B's every use.
void set_b(Parameter& b, const Tensor& global) {
  const int64_t rows_here = b.value.dim(0), cols_here = b.value.dim(1);
  b.value.copy_from(columns(rows(global, b.start[0], rows_here), b.start[1], cols_here));
}

TEST(LoraLinear, InitialisesAsPeftAndComputesTheFormula) {
  constexpr int64_t in = 16, out = 6;
  ColumnParallelLinear layer(linear_options("l", in, out), TensorParallel{});
  layer.add_lora(lora_options("l", in, out));
  Parameter& a = a_of(layer.parameters());
  Parameter& b = b_of(layer.parameters());
  EXPECT_EQ(a.name, "l.lora_a");
  EXPECT_EQ(a.value.shape(), (Shape{kRank, in}));
  EXPECT_EQ(b.value.shape(), (Shape{out, kRank}));
  const float bound = 1.f / std::sqrt(static_cast<float>(in));  // kaiming_uniform_(a = sqrt(5))
  float lo = 0, hi = 0;
  for (float v : values(a.value)) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_LE(hi, bound);
  EXPECT_GE(lo, -bound);
  EXPECT_GT(hi - lo, bound);  // spread over the range, not a constant
  for (float v : values(b.value)) EXPECT_EQ(v, 0.f);

  const Tensor bv = make(rand_vec(out * kRank, 9), {out, kRank});
  set_b(b, bv);
  const Tensor x = make(rand_vec(N * in, 1), {N, in});
  LoraSaved saved;
  const LoraCall call{.saved = &saved};
  const Tensor y = layer.forward(x, B, nullptr, &call);
  // The formula, op by op.
  Tensor want = Tensor::empty({N, out}, DType::f32), h = Tensor::empty({N, kRank}, DType::f32),
         lora = Tensor::empty({N, out}, DType::f32);
  gemm(x, layer.weight().value, want, {.trans_b = true});
  add_bias(want, layer.bias()->value);
  gemm(x, a.value, h, {.trans_b = true});
  gemm(h, b.value, lora, {.trans_b = true});
  scale_(lora, kAlpha / kRank);
  add(want, lora, want);
  expect_close(y, want, "y");
}

struct Case {
  bool sequence_parallel;
  bool column;
};
class LoraParallel : public ::testing::TestWithParam<Case> {};

TEST_P(LoraParallel, ShardedAdapterEqualsTheUnsplitOne) {
  const auto [sp, column] = GetParam();
  constexpr int64_t in = 8, out = 6;
  const Tensor x = make(rand_vec(N * in, 1), {N, in});
  const Tensor dy = make(rand_vec(N * out, 2), {N, out});
  const Tensor bv = make(rand_vec(out * kRank, 3), {out, kRank});
  // The reference on one rank.
  Tensor y_ref, dx_ref, da_ref, db_ref, dw_ref;
  {
    LoraSaved saved;
    const LoraCall call{.saved = &saved};
    if (column) {
      ColumnParallelLinear ref(linear_options("l", in, out), TensorParallel{});
      ref.add_lora(lora_options("l", in, out));
      set_b(b_of(ref.parameters()), bv);
      y_ref = ref.forward(x, B, nullptr, &call);
      dx_ref = ref.backward(dy, x, B, {.lora = &call});
      da_ref = a_of(ref.parameters()).grad.clone();
      db_ref = b_of(ref.parameters()).grad.clone();
    } else {
      RowParallelLinear ref(linear_options("l", in, out), TensorParallel{});
      ref.add_lora(lora_options("l", in, out));
      set_b(b_of(ref.parameters()), bv);
      y_ref = ref.forward(x, B, &call);
      dx_ref = ref.backward(dy, x, B, {.lora = &call});
      da_ref = a_of(ref.parameters()).grad.clone();
      db_ref = b_of(ref.parameters()).grad.clone();
    }
  }
  std::mutex mu;
  std::vector<Tensor> partial(kRanks);  // the replicated factor's gradient on each rank
  run_tp(sp, [&](const TensorParallel& tp) {
    const std::string where = "rank " + std::to_string(tp.rank);
    LoraSaved saved;
    const LoraCall call{.saved = &saved};
    if (column) {  // A replicated, B rows split like W's
      constexpr int64_t out_r = out / kRanks;
      ColumnParallelLinear layer(linear_options("l", in, out), tp);
      layer.add_lora(lora_options("l", in, out));
      Parameter &a = a_of(layer.parameters()), &b = b_of(layer.parameters());
      expect_equal(
          a.value,
          [&] {
            ColumnParallelLinear whole(linear_options("l", in, out), TensorParallel{});
            whole.add_lora(lora_options("l", in, out));
            return a_of(whole.parameters()).value.clone();
          }(),
          where + " initial A");
      EXPECT_TRUE(a.grad_sums.tensor);
      set_b(b, bv);
      const Tensor y = layer.forward(held_rows(x, tp), B, nullptr, &call);
      expect_close(y, columns(y_ref, tp.rank * out_r, out_r), where + " y");
      const Tensor dx = layer.backward(columns(dy, tp.rank * out_r, out_r), held_rows(x, tp), B, {.lora = &call});
      expect_close(dx, held_rows(dx_ref, tp), where + " dx");
      expect_close(b.grad, rows(db_ref, tp.rank * out_r, out_r), where + " dB");
      std::lock_guard lock(mu);
      partial[tp.rank] = a.grad.clone();
    } else {  // A columns split like W's, B replicated
      constexpr int64_t in_r = in / kRanks;
      RowParallelLinear layer(linear_options("l", in, out), tp);
      layer.add_lora(lora_options("l", in, out));
      Parameter &a = a_of(layer.parameters()), &b = b_of(layer.parameters());
      EXPECT_TRUE(b.grad_sums.tensor);
      set_b(b, bv);
      const Tensor x_r = columns(x, tp.rank * in_r, in_r);
      const Tensor y = layer.forward(x_r, B, &call);
      expect_close(y, held_rows(y_ref, tp), where + " y");
      const Tensor dx = layer.backward(held_rows(dy, tp), x_r, B, {.lora = &call});
      expect_close(dx, columns(dx_ref, tp.rank * in_r, in_r), where + " dx");
      expect_close(a.grad, columns(da_ref, tp.rank * in_r, in_r), where + " dA");
      std::lock_guard lock(mu);
      partial[tp.rank] = b.grad.clone();
    }
  });
  Tensor sum = partial[0].clone();
  for (int r = 1; r < kRanks; ++r) add(sum, partial[r], sum);
  expect_close(sum, column ? da_ref : db_ref, column ? "dA summed over the ranks" : "dB summed over the ranks");
}

INSTANTIATE_TEST_SUITE_P(Layouts, LoraParallel,
                         ::testing::Values(Case{false, true}, Case{true, true}, Case{false, false}, Case{true, false}),
                         [](const auto& info) {
                           return std::string(info.param.column ? "Column" : "Row") +
                                  (info.param.sequence_parallel ? "SP" : "");
                         });

TEST(LoraLinear, AFrozenWeightGetsNoGradient) {
  constexpr int64_t in = 8, out = 6;
  for (bool column : {true, false}) {
    LoraSaved saved;
    const LoraCall call{.saved = &saved};
    const Tensor x = make(rand_vec(N * in, 1), {N, in});
    const Tensor dy = make(rand_vec(N * out, 2), {N, out});
    auto check = [&](auto& layer, auto forward) {
      layer.add_lora(lora_options("l", in, out));
      for (Parameter* p : layer.parameters())
        if (!is_lora_parameter(*p)) {
          p->frozen = true;
          p->grad = Tensor();
        }
      forward();
      layer.backward(dy, x, B, {.lora = &call});
      EXPECT_FALSE(layer.weight().grad.defined());
      double moved = 0;  // B's gradient flows (B starts at zero, its gradient does not)
      for (float v : values(b_of(layer.parameters()).grad)) moved += std::abs(v);
      EXPECT_GT(moved, 0);
    };
    if (column) {
      ColumnParallelLinear layer(linear_options("l", in, out), TensorParallel{});
      check(layer, [&] { layer.forward(x, B, nullptr, &call); });
    } else {
      RowParallelLinear layer(linear_options("l", in, out), TensorParallel{});
      check(layer, [&] { layer.forward(x, B, &call); });
    }
  }
}

}  // namespace
}  // namespace mt
