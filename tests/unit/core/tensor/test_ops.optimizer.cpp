// test_ops.optimizer.cpp: the CPU optimizer ops (AdamW, sum of squares, the inf/NaN check) against a double reference,
// and the fused step ops (multi-tensor AdamW, grad stats, accumulate_mean) against the per-tensor ones.
// One of the sources of test_ops (tests/CMakeLists.txt); the shared references are in op_reference.h.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/tensor/op_reference.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, the references of op_reference.h

// ---- optimizer ops -------------------------------------------------------------------------------

TEST(OptimizerOps, AdamWMatchesADoubleReferenceOverSteps) {
  const int64_t n = 50;
  const AdamWOptions base{
      .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_scale = 0.5f};
  Vec p = rand_vec(n, 46), m(n, 0.0), v(n, 0.0);
  Tensor master = make(p, {n}), exp_avg = Tensor::zeros({n}, DType::f32), exp_avg_sq = Tensor::zeros({n}, DType::f32);
  for (int64_t step = 1; step <= 3; ++step) {
    const Vec g = rand_vec(n, 47 + static_cast<uint32_t>(step), -2, 2);
    AdamWOptions o = base;
    o.step = step;
    adamw_step(master, make(g, {n}), exp_avg, exp_avg_sq, o);
    const double b1 = o.beta1, b2 = o.beta2, lr = o.lr, wd = o.weight_decay;
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g[i] * o.grad_scale;
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      const double mhat = m[i] / (1 - std::pow(b1, step)), vhat = v[i] / (1 - std::pow(b2, step));
      p[i] -= lr * (mhat / (std::sqrt(vhat) + o.eps) + wd * p[i]);
    }
    EXPECT_CLOSE(values(exp_avg), m, 1e-6);
    EXPECT_CLOSE(values(exp_avg_sq), v, 1e-6);
    EXPECT_CLOSE(values(master), p, 1e-6);
  }
}

TEST(OptimizerOps, SumSquaresAndInfNanCheck) {
  const Vec x = rand_vec(1000, 50, -3, 3);
  double want = 0;
  for (double v : x) want += v * v;
  EXPECT_NEAR(sum_squares(make(x, {10, 100})), want, 1e-9 * want);
  // Several tensors at once (the gradient norm): the same total, empty tensors and lists included.
  const Tensor whole = make(x, {1000});
  EXPECT_NEAR(sum_squares(std::vector<Tensor>{whole.slice(0, 1), whole.slice(1, 1), whole.slice(1, 600),
                                              whole.slice(600, 1000)}),
              want, 1e-9 * want);
  EXPECT_EQ(sum_squares(std::vector<Tensor>{}), 0.0);
  EXPECT_THROW(sum_squares(std::vector<Tensor>{whole, make(x, {1000}, DType::bf16)}), std::invalid_argument);
  EXPECT_FALSE(has_inf_or_nan(make(x, {1000})));
  EXPECT_FALSE(has_inf_or_nan(make({3e38, -3e38, 0}, {3})));
  for (double bad : {double(INFINITY), -double(INFINITY), double(NAN)})
    for (int64_t at : {0, 517, 999}) {
      Vec y = x;
      y[at] = bad;
      EXPECT_TRUE(has_inf_or_nan(make(y, {1000}))) << bad << " at " << at;
    }
}

// ---- fused step ops ------------------------------------------------------------------------------

std::vector<uint32_t> bits(const Tensor& t) {
  std::vector<uint32_t> out;
  for (float f : t.to_floats()) out.push_back(std::bit_cast<uint32_t>(f));
  return out;
}

// The multi-tensor AdamW is the per-tensor one bit for bit (masters, moments), decay flags and all, and
// writes each value as the master rounded to its dtype, over several steps.
TEST(FusedStepOps, MultiTensorAdamWEqualsPerTensorBitForBit) {
  for (DType value_dt : {DType::f32, DType::bf16, DType::f16}) {
    const std::vector<int64_t> sizes{7, 0, 300, 1, 4097};
    struct State {
      Tensor master, m, v, value;
    };
    std::vector<State> fused, single;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const Vec p = rand_vec(sizes[k], 600 + static_cast<uint32_t>(k));
      for (auto* set : {&fused, &single})
        set->push_back({make(p, {sizes[k]}), Tensor::zeros({sizes[k]}, DType::f32),
                        Tensor::zeros({sizes[k]}, DType::f32), make(p, {sizes[k]}, value_dt)});
    }
    for (int64_t step = 1; step <= 4; ++step) {
      const AdamWOptions opt{.lr = 1e-2f,
                             .beta1 = 0.9f,
                             .beta2 = 0.95f,
                             .eps = 1e-8f,
                             .weight_decay = 0.1f,
                             .step = step,
                             .grad_scale = 0.37f};
      std::vector<AdamWTensors> ts;
      for (size_t k = 0; k < sizes.size(); ++k) {
        const Tensor g = make(rand_vec(sizes[k], 700 + static_cast<uint32_t>(10 * step + k), -2, 2), {sizes[k]});
        const bool decay = k % 2 == 0;
        ts.push_back({.master = fused[k].master,
                      .grad = g,
                      .exp_avg = fused[k].m,
                      .exp_avg_sq = fused[k].v,
                      .value = value_dt == DType::f32 ? Tensor() : fused[k].value,
                      .decay = decay});
        AdamWOptions one = opt;
        one.weight_decay = decay ? opt.weight_decay : 0.f;
        adamw_step(single[k].master, g, single[k].m, single[k].v, one);
        single[k].value.copy_from(single[k].master);
      }
      adamw_multi_step(ts, opt);
      for (size_t k = 0; k < sizes.size(); ++k) {
        const std::string what =
            std::string(dtype_name(value_dt)) + " tensor " + std::to_string(k) + " step " + std::to_string(step);
        EXPECT_EQ(bits(fused[k].master), bits(single[k].master)) << what;
        EXPECT_EQ(bits(fused[k].m), bits(single[k].m)) << what;
        EXPECT_EQ(bits(fused[k].v), bits(single[k].v)) << what;
        if (value_dt != DType::f32) {
          EXPECT_EQ(bits(fused[k].value), bits(single[k].value)) << what;
        }
      }
    }
  }
}

// One pass gives the sum of squares in buffer order, in double (the reference order, exactly) and the inf/NaN
// verdict; sum_squares and has_inf_or_nan report the same pass.
TEST(FusedStepOps, GradStatsEqualSumSquaresAndInfCheck) {
  const Vec x = rand_vec(1000, 610, -3, 3);
  const Tensor whole = make(x, {1000});
  const std::vector<Tensor> parts{whole.slice(0, 1), whole.slice(1, 1), whole.slice(1, 600), whole.slice(600, 1000)};
  const GradStats st = grad_stats(parts);
  double in_order = 0.0;
  for (float v : whole.to_floats()) in_order += static_cast<double>(v) * v;
  EXPECT_EQ(st.sum_squares, in_order);
  EXPECT_EQ(sum_squares(parts), in_order);
  EXPECT_FALSE(st.found_inf);
  // The device-side form: [sum, flag] as f64.
  Tensor out = f64_zeros(2, Device::cpu);
  grad_stats(parts, out);
  EXPECT_EQ(read_f64(out), (std::vector<double>{st.sum_squares, 0.0}));
  const GradStats none = grad_stats(std::vector<Tensor>{});
  EXPECT_EQ(none.sum_squares, 0.0);
  EXPECT_FALSE(none.found_inf);
  EXPECT_FALSE(grad_stats({make({3e38, -3e38, 0}, {3})}).found_inf);  // large but finite
  for (double bad : {double(INFINITY), -double(INFINITY), double(NAN)})
    for (int64_t at : {0, 517, 999}) {
      Vec y = x;
      y[at] = bad;
      const Tensor t = make(y, {1000});
      const GradStats b = grad_stats({whole.slice(0, 10), t.slice(0, 600), t.slice(600, 1000)});
      EXPECT_TRUE(b.found_inf) << bad << " at " << at;
      EXPECT_EQ(b.found_inf, has_inf_or_nan(t));
      EXPECT_FALSE(std::isfinite(b.sum_squares)) << bad << " at " << at;
    }
}

// The loss accumulated on the device is the host reading's value: the double sum, the mean rounded to f32.
TEST(FusedStepOps, AccumulateMeanIsTheHostReading) {
  Tensor sum = f64_zeros(1, Device::cpu);
  double want = 0;
  for (uint32_t k = 0; k < 3; ++k) {
    const Vec l = rand_vec(37 + k, 620 + k, 0, 9);
    double s = 0;
    for (double v : l) s += static_cast<float>(v);
    want += static_cast<float>(s / static_cast<double>(l.size()));
    accumulate_mean(make(l, {static_cast<int64_t>(l.size())}), sum);
  }
  EXPECT_EQ(read_f64(sum)[0], want);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    Tensor x = Tensor::zeros({1500}, dt);
    fill_(x, 0.1f);
    for (float v : x.to_floats()) ASSERT_EQ(v, round_to(dt, 0.1f)) << dtype_name(dt);
  }
}

TEST(FusedStepOps, ArgumentErrors) {
  const Tensor a = Tensor::zeros({4}, DType::f32), b = Tensor::zeros({5}, DType::f32);
  Tensor stats = f64_zeros(3, Device::cpu);
  EXPECT_THROW(grad_stats({a}, stats), std::invalid_argument);
  EXPECT_THROW(grad_stats({Tensor::zeros({4}, DType::bf16)}), std::invalid_argument);
  EXPECT_THROW(adamw_multi_step({{.master = a, .grad = b, .exp_avg = a, .exp_avg_sq = a}}, {}), std::invalid_argument);
  EXPECT_THROW(adamw_multi_step(
                   {{.master = a, .grad = a, .exp_avg = a, .exp_avg_sq = a, .value = Tensor::zeros({4}, DType::bf16)},
                    {.master = a, .grad = a, .exp_avg = a, .exp_avg_sq = a, .value = Tensor::zeros({4}, DType::f16)}},
                   {}),
               std::invalid_argument);
  Tensor sum = f64_zeros(1, Device::cpu);
  EXPECT_THROW(accumulate_mean(Tensor::zeros({0}, DType::f32), sum), std::invalid_argument);
}

}  // namespace
}  // namespace mt
