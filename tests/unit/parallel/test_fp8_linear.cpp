// test_fp8_linear.cpp: the fp8 GEMM path of the tensor-parallel linear layers (parallel/layers/fp8_linear.h) and the
// scale update under it (fp8_update_scale):
// - one rank against a straightforward host reference: amax, scale = fp8_max / amax, the saturating RNE cast,
//   products of the fp8 values summed in double and scaled once; forward, dx and dW, e4m3 and hybrid (e5m2 dY);
// - 2 tensor-parallel ranks (with and without sequence parallelism) against one rank in fp8: the amaxes of the
//   shards are reduced over the group, so every rank quantises as one rank does (equal up to fp32 summation order);
// - the delayed recipe: scales from the history only, updated once per step with the running amax.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/base/dtype.h"
#include "core/tensor/ops.h"
#include "parallel/layers/fp8_linear.h"
#include "parallel/layers/parallel_linear.h"
#include "parallel/comm/thread_ranks.h"
#include "tests/unit/op_test_util.h"
#include "tests/unit/parallel/tp_test_util.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make

using namespace mt::tp_test;  // kRanks, B, T, run_tp, the slicing and the comparisons

// ---- the host reference ----------------------------------------------------------------------------------------
struct Quant {
  std::vector<float> q;  // the fp8 values as floats
  float scale_inv;
};
Quant quantize_ref(const std::vector<float>& x, bool e5m2) {
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::abs(v));
  const float fmax = e5m2 ? 57344.f : 448.f;
  const float scale = amax > 0 ? fmax / amax : 1.f;
  Quant out{.q = {}, .scale_inv = 1.f / scale};
  for (float v : x)
    out.q.push_back(e5m2 ? e5m2_to_float(float_to_e5m2(v * scale)) : e4m3_to_float(float_to_e4m3(v * scale)));
  return out;
}
// (M, N) = op(a) (M, K) @ op(b) (K, N) * sa * sb, summed in double.
std::vector<double> matmul_ref(const Quant& a, const Quant& b, int64_t M, int64_t Nn, int64_t K, bool ta, bool tb) {
  std::vector<double> out(static_cast<size_t>(M * Nn));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < Nn; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += double{a.q[static_cast<size_t>(ta ? k * M + i : i * K + k)]} *
             b.q[static_cast<size_t>(tb ? j * K + k : k * Nn + j)];
      out[static_cast<size_t>(i * Nn + j)] = s * a.scale_inv * b.scale_inv;
    }
  return out;
}
void expect_near_ref(const Tensor& got, const std::vector<double>& want, const std::string& what) {
  const std::vector<float> g = got.to_floats();
  ASSERT_EQ(g.size(), want.size()) << what;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], want[i], 1e-5 * scale) << what << " element " << i;
}

std::shared_ptr<Fp8Context> context(DType grad, bool delayed = false) {
  return std::make_shared<Fp8Context>(Fp8Options{.grad_dtype = grad, .delayed = delayed, .history_len = 4},
                                      Device::cpu);
}
LinearOptions options(const char* name, int64_t in, int64_t out, bool bias) {
  return {.name = name, .in_features = in, .out_features = out, .bias = bias, .init_std = 0.5f, .seed = 7};
}

class Fp8LinearFormats : public ::testing::TestWithParam<DType> {};

// Runs `layer` (one rank, fp8 with dY in `grad`) forward and backward on x and dy and checks y, dx and dW against
// the reference; returns y.
template <class Layer>
Tensor check_against_reference(Layer& layer, DType grad, const Tensor& x, const Tensor& dy) {
  auto ctx = context(grad);
  layer.enable_fp8({.ctx = ctx, .id = ctx->add("layer")});
  ctx->allocate();
  const int64_t in = x.dim(1), out = dy.dim(1);
  const Tensor w = layer.weight().value.clone();
  const Tensor y = layer.forward(x, B);
  const Tensor dx = layer.backward(dy, x, B);
  const Quant qx = quantize_ref(x.to_floats(), false), qw = quantize_ref(w.to_floats(), false);
  const Quant qdy = quantize_ref(dy.to_floats(), grad == DType::e5m2);
  expect_near_ref(y, matmul_ref(qx, qw, N, out, in, false, true), "y");  // + a zero bias
  expect_near_ref(dx, matmul_ref(qdy, qw, N, in, out, false, false), "dx");
  expect_near_ref(layer.weight().grad, matmul_ref(qdy, qx, out, in, N, true, false), "dW");
  // Not the plain GEMM: the quantisation shows.
  Tensor y_plain = Tensor::empty({N, out}, DType::f32);
  gemm(x, w, y_plain, {.trans_b = true});
  EXPECT_NE(y.to_floats(), y_plain.to_floats());
  return y;
}

TEST_P(Fp8LinearFormats, ColumnParallelMatchesTheReference) {
  constexpr int64_t in = 16, out = 8;
  const Tensor dy = make(rand_vec(N * out, 2, -1e-3, 1e-3), {N, out});  // small: the scale matters
  ColumnParallelLinear layer(options("col", in, out, true), TensorParallel{});
  check_against_reference(layer, GetParam(), make(rand_vec(N * in, 1, -3, 3), {N, in}), dy);
  // The bias gradient sums the unquantised dY.
  std::vector<double> db(out, 0.0);
  const std::vector<float> d = dy.to_floats();
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < out; ++j) db[static_cast<size_t>(j)] += d[static_cast<size_t>(i * out + j)];
  expect_near_ref(layer.bias()->grad, db, "db");
}

TEST_P(Fp8LinearFormats, RowParallelMatchesTheReference) {
  constexpr int64_t in = 16, out = 8;
  RowParallelLinear layer(options("row", in, out, false), TensorParallel{});
  check_against_reference(layer, GetParam(), make(rand_vec(N * in, 3, -2, 2), {N, in}),
                          make(rand_vec(N * out, 4, -1e-4, 1e-4), {N, out}));
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8LinearFormats, ::testing::Values(DType::e4m3, DType::e5m2),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- layouts ---------------------------------------------------------------------------------------------------
class Fp8LinearLayouts : public ::testing::TestWithParam<bool> {};  // sequence parallelism

TEST_P(Fp8LinearLayouts, MlpOnTwoRanksMatchesOneRank) {
  const bool sp = GetParam();
  constexpr int64_t C = 8, F = 16, F_r = F / kRanks;
  const Tensor x = make(rand_vec(N * C, 11, -2, 2), {N, C});
  const Tensor dy = make(rand_vec(N * C, 12, -1e-3, 1e-3), {N, C});
  struct Out {
    Tensor y, dx, dw1, dw2;
  };
  auto mlp = [&](const TensorParallel& tp, const Tensor& x_held, const Tensor& dy_held) {
    auto ctx = context(DType::e5m2);
    ColumnParallelLinear fc1(options("fc1", C, F, true), tp);
    RowParallelLinear fc2(options("fc2", F, C, true), tp);
    fc1.enable_fp8({.ctx = ctx, .id = ctx->add("fc1")});
    fc2.enable_fp8({.ctx = ctx, .id = ctx->add("fc2")});
    ctx->allocate();
    const auto [y, dx] = mlp_forward_backward(fc1, fc2, x_held, dy_held);
    return Out{y, dx, fc1.weight().grad.clone(), fc2.weight().grad.clone()};
  };
  const Out ref = mlp(TensorParallel{}, x, dy);
  run_tp(sp, [&](const TensorParallel& tp) {
    const Out got = mlp(tp, held_rows(x, tp), held_rows(dy, tp));
    const std::string where = (sp ? "SP rank " : "TP rank ") + std::to_string(tp.rank);
    // Equal up to fp32 rounding of sums in another order: the quantised values are the same on both sides (a scale
    // from a shard's amax alone moves many elements by a whole fp8 step, far beyond this).
    expect_close(got.y, held_rows(ref.y, tp), where + " y", 8);
    expect_close(got.dx, held_rows(ref.dx, tp), where + " dx", 8);
    expect_close(got.dw1, rows(ref.dw1, tp.rank * F_r, F_r), where + " fc1 dW", 8);
    expect_close(got.dw2, columns(ref.dw2, tp.rank * F_r, F_r), where + " fc2 dW", 8);
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, Fp8LinearLayouts, ::testing::Values(false, true), [](const auto& info) {
  return std::string(info.param ? "SequenceParallel" : "TensorParallel");
});

// ---- the delayed recipe and the scale update ----------------------------------------------------------------------
TEST(Fp8Linear, DelayedScalesComeFromEarlierIterations) {
  constexpr int64_t in = 8, out = 4;
  auto ctx = std::make_shared<Fp8Context>(
      Fp8Options{.grad_dtype = DType::e4m3, .delayed = true, .history_len = 2, .use_max = true, .margin = 1},
      Device::cpu);
  ColumnParallelLinear layer(options("col", in, out, false), TensorParallel{});
  layer.enable_fp8({.ctx = ctx, .id = ctx->add("col")});
  ctx->allocate();
  const TensorParallel one{};
  auto x_of = [&](float hi) { return make(rand_vec(N * in, 5, -hi, hi), {N, in}); };
  auto input_scale = [&] { return ctx->scales(0).to_floats().at(0); };
  auto amax = [](const Tensor& t) {
    float a = 0;
    for (float v : t.to_floats()) a = std::max(a, std::abs(v));
    return a;
  };
  // Iteration 1: no history yet, so current scaling; the state's scale moves only at the step.
  const Tensor x1 = x_of(4), x2 = x_of(1);
  layer.forward(x1, B);
  EXPECT_FALSE(ctx->delayed_scales_ready());
  EXPECT_EQ(input_scale(), 1.f);
  ctx->step(nullptr, nullptr);
  EXPECT_EQ(ctx->filled(), 1);
  EXPECT_EQ(input_scale(), 448.f / amax(x1) / 2);  // margin 1
  // Iteration 2 quantises with iteration 1's scale, whatever its own amax.
  const Fp8Tensor q = ctx->quantize(0, Fp8Operand::input, x2, false, one);
  EXPECT_EQ(q.scale_inv.to_floats().at(0), 1.f / (448.f / amax(x1) / 2));
  ctx->step(nullptr, nullptr);  // the history holds amax(x1), amax(x2): max -> still x1's
  EXPECT_EQ(input_scale(), 448.f / amax(x1) / 2);
  ctx->set_recording(false);  // evaluation records nothing
  layer.forward(x_of(100), B);
  ctx->set_recording(true);
  layer.forward(x2, B);
  ctx->step(nullptr, nullptr);  // amax(x1) rolled out: x2's twice
  EXPECT_EQ(input_scale(), 448.f / amax(x2) / 2);
}

// The weight's cast is kept over an iteration's microbatches and dropped with the weight (ZeRO-3 releases a unit's
// weights after it computes): cast again from the gathered values it is the same fp8 tensor; a step makes it stale.
TEST(Fp8Linear, WeightCastsAreKeptPerIterationAndDroppedWithTheirWeights) {
  constexpr int64_t in = 8, out = 4;
  auto ctx = std::make_shared<Fp8Context>(Fp8Options{.grad_dtype = DType::e5m2}, Device::cpu);
  ColumnParallelLinear layer(options("col", in, out, false), TensorParallel{});
  layer.enable_fp8({.ctx = ctx, .id = ctx->add("col")});
  ctx->allocate();
  const TensorParallel one{};
  Parameter& w = *layer.parameters().at(0);
  ASSERT_EQ(w.name, "col.weight");
  const Fp8Tensor& first = ctx->weight(0, w.value, false, one);
  const Tensor q = first.q;
  EXPECT_EQ(ctx->weight(0, w.value, false, one).q.raw(), q.raw()) << "cast again within the iteration";
  Parameter other = make_parameter("col.bias", {out}, DType::f32, Init::zeros, 0.f, 1);
  ctx->drop_weights({&other});  // not a registered weight: nothing dropped
  EXPECT_EQ(ctx->weight(0, w.value, false, one).q.raw(), q.raw());
  ctx->drop_weights({&w});
  const Fp8Tensor& again = ctx->weight(0, w.value, false, one);
  EXPECT_NE(again.q.raw(), q.raw()) << "the dropped cast was kept";
  EXPECT_EQ(again.q.to_floats(), q.to_floats());
  EXPECT_EQ(again.qt.to_floats(), first.qt.to_floats());
  const void* before_step = again.q.raw();
  ctx->step(nullptr, nullptr);
  EXPECT_NE(ctx->weight(0, w.value, false, one).q.raw(), before_step) << "a step leaves the cast stale";
}

TEST(Fp8UpdateScale, RollsTheHistoryAndKeepsTheScaleForZeroOrNonFiniteAmax) {
  const float inf = INFINITY;
  Tensor amax = Tensor::from_floats(std::vector<float>{2.f, 0.f, NAN, inf, 1e-40f}, {5});
  Tensor history = Tensor::from_floats(std::vector<float>{8, 1, 0, 0, 0, 0, 0, 0, 0, 0}, {5, 2});
  Tensor scale = Tensor::from_floats(std::vector<float>{1, 3, 3, 3, 3}, {5});
  Tensor scale_inv = Tensor::empty({5}, DType::f32);
  const Tensor fmax = Tensor::from_floats(std::vector<float>{448, 448, 448, 57344, FLT_MAX}, {5});
  fp8_update_scale(amax, history, scale, scale_inv, fmax, {.margin = 0, .use_max = true});
  const std::vector<float> h = history.to_floats();
  EXPECT_EQ(h[0], 2.f);
  EXPECT_EQ(h[1], 8.f);  // rolled: the old newest entry moved on, the oldest (1) dropped
  EXPECT_EQ(h[2], 0.f);
  EXPECT_TRUE(std::isnan(h[4]));
  EXPECT_EQ(h[6], inf);
  const std::vector<float> s = scale.to_floats();
  EXPECT_EQ(s[0], 448.f / 8.f);  // the history's max
  EXPECT_EQ(s[1], 3.f);          // zero amax: kept
  EXPECT_EQ(s[2], 3.f);          // NaN: kept
  EXPECT_EQ(s[3], 3.f);          // inf: kept
  EXPECT_EQ(s[4], FLT_MAX);      // overflow: the largest float
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(scale_inv.to_floats()[i], 1.f / s[i]);
  // most_recent and the margin.
  Tensor h2 = Tensor::from_floats(std::vector<float>{8, 1}, {1, 2});
  Tensor s2 = Tensor::from_floats(std::vector<float>{1}, {1}), si2 = Tensor::empty({1}, DType::f32);
  fp8_update_scale(Tensor::from_floats(std::vector<float>{2}, {1}), h2, s2, si2,
                   Tensor::from_floats(std::vector<float>{448}, {1}), {.margin = 2, .use_max = false});
  EXPECT_EQ(s2.to_floats().at(0), 448.f / 2 / 4);
}

TEST(Fp8UpdateScale, RefusesBadArguments) {
  Tensor amax = Tensor::zeros({2}, DType::f32), history = Tensor::zeros({3, 2}, DType::f32);
  Tensor scale = Tensor::zeros({2}, DType::f32), scale_inv = Tensor::zeros({2}, DType::f32);
  const Tensor fmax = Tensor::zeros({2}, DType::f32);
  EXPECT_THROW(fp8_update_scale(amax, history, scale, scale_inv, fmax), std::invalid_argument);
  Tensor h2 = Tensor::zeros({2, 2}, DType::f32);
  EXPECT_THROW(fp8_update_scale(amax, h2, scale, scale_inv, fmax, {.margin = -1}), std::invalid_argument);
}

TEST(GemmFp8, RefusesNonFp8InputsAndTheBgradEpilogue) {
  const Tensor one = Tensor::from_floats(std::vector<float>{1}, {1});
  Tensor a = Tensor::zeros({4, 4}, DType::e4m3), f = Tensor::zeros({4, 4}, DType::f32);
  Tensor out = Tensor::zeros({4, 4}, DType::f32), db = Tensor::zeros({4}, DType::f32);
  EXPECT_THROW(gemm_fp8(f, one, a, one, out), std::invalid_argument);
  EXPECT_THROW(gemm_fp8(a, one, a, one, out, {.trans_a = true, .epilogue = Epilogue::bgrad_a, .dbias = &db}),
               std::invalid_argument);
  Tensor bad = Tensor::zeros({3, 4}, DType::f32);
  EXPECT_THROW(gemm_fp8(a, one, a, one, bad), std::invalid_argument);
}

}  // namespace
}  // namespace mt
