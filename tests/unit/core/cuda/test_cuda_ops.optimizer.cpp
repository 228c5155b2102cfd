// test_cuda_ops.optimizer.cpp: the CUDA optimizer ops (sum of squares, the inf/NaN check, AdamW) and the fused step
// ops (multi-tensor AdamW, grad stats, accumulate_mean) against the CPU's, bit for bit where the CPU's are.
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); each test skips where no GPU can run it, and
// cuda_op_checks.h says how the GPU is compared with the CPU.
#include <gtest/gtest.h>

#include <limits>

#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, Both, CudaOps, the checks of cuda_op_checks.h

// ---- optimizer ops -------------------------------------------------------------------------------

TEST_F(CudaOps, SumSquares) {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    const Both x = both(rand_vec(n, 420, -3, 3), {n}, DType::f32);
    const double cpu = sum_squares(x.cpu), gpu = sum_squares(x.gpu);
    EXPECT_LE(std::abs(gpu - cpu), 1e-5 * std::abs(cpu))
        << "sum_squares of " << n << " values: gpu " << gpu << ", cpu " << cpu;
  }
}

// The gradient norm's form: many tensors (one empty) in one call, against the CPU's.
TEST_F(CudaOps, SumSquaresOfManyTensors) {
  std::vector<Tensor> cpu_xs, gpu_xs;
  for (int64_t n : {int64_t{5}, int64_t{0}, int64_t{4097}, int64_t{300001}, int64_t{1}}) {
    const Both x = both(rand_vec(n, 440 + static_cast<uint32_t>(n % 97), -2, 2), {n}, DType::f32);
    cpu_xs.push_back(x.cpu);
    gpu_xs.push_back(x.gpu);
  }
  const double cpu = sum_squares(cpu_xs), gpu = sum_squares(gpu_xs);
  EXPECT_LE(std::abs(gpu - cpu), 1e-9 * std::abs(cpu)) << "gpu " << gpu << ", cpu " << cpu;
  EXPECT_EQ(sum_squares(gpu_xs), gpu);  // deterministic
}

TEST_F(CudaOps, HasInfOrNan) {
  const int64_t n = 100003;
  const Vec x = rand_vec(n, 430, -3, 3);
  EXPECT_FALSE(has_inf_or_nan(make(x, {n}).to(Device::cuda)));
  EXPECT_FALSE(has_inf_or_nan(make({3e38, -3e38, 0}, {3}).to(Device::cuda)));
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [bad, at] : {std::pair{nan, int64_t{77777}}, std::pair{inf, n - 1}, std::pair{-inf, int64_t{0}},
                                std::pair{nan, int64_t{5}}}) {
    Vec y = x;
    y[at] = bad;
    EXPECT_TRUE(has_inf_or_nan(make(y, {n}).to(Device::cuda))) << bad << " at " << at;
  }
}

TEST_F(CudaOps, AdamWOverThreeSteps) {
  const int64_t n = 10007;
  Both master = both(rand_vec(n, 440), {n}, DType::f32);
  Both exp_avg = both(Vec(n, 0.0), {n}, DType::f32), exp_avg_sq = both(Vec(n, 0.0), {n}, DType::f32);
  for (int64_t step = 1; step <= 3; ++step) {
    const Both grad = both(rand_vec(n, 441 + static_cast<uint32_t>(step), -2, 2), {n}, DType::f32);
    const AdamWOptions opt{.lr = 1e-2f,
                           .beta1 = 0.9f,
                           .beta2 = 0.95f,
                           .eps = 1e-8f,
                           .weight_decay = 0.1f,
                           .step = step,
                           .grad_scale = 0.5f};
    for (auto d : kDevices) adamw_step(master.*d, grad.*d, exp_avg.*d, exp_avg_sq.*d, opt);
    expect_match(master, 1e-5, str("adamw master, step ", step));
    expect_match(exp_avg, 1e-5, str("adamw exp_avg, step ", step));
    expect_match(exp_avg_sq, 1e-5, str("adamw exp_avg_sq, step ", step));
  }
}

// ---- fused step ops (multi-tensor AdamW, one-pass grad stats, the loss on the device) --------------

// More tensors than one launch's table holds (256), sizes around the per-block chunks, one empty.
std::vector<int64_t> many_sizes() {
  std::vector<int64_t> sizes{4097, 0, 65537, 1, 200003};
  for (int k = 0; k < 300; ++k) sizes.push_back(1 + (k * 37) % 130);
  return sizes;
}

// Bit for bit the CPU's: masters, moments and the rounded values, over three steps.
TEST_F(CudaOps, MultiTensorAdamWEqualsCpu) {
  for (DType value_dt : {DType::bf16, DType::f32}) {
    const std::vector<int64_t> sizes = many_sizes();
    std::vector<Both> master, m, v, value;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const Vec p = rand_vec(sizes[k], 800 + static_cast<uint32_t>(k));
      master.push_back(both(p, {sizes[k]}, DType::f32));
      m.push_back(both(Vec(sizes[k], 0.0), {sizes[k]}, DType::f32));
      v.push_back(both(Vec(sizes[k], 0.0), {sizes[k]}, DType::f32));
      value.push_back(both(p, {sizes[k]}, value_dt));
    }
    for (int64_t step = 1; step <= 3; ++step) {
      const AdamWOptions opt{.lr = 1e-2f,
                             .beta1 = 0.9f,
                             .beta2 = 0.95f,
                             .eps = 1e-8f,
                             .weight_decay = 0.1f,
                             .step = step,
                             .grad_scale = 0.37f};
      std::vector<AdamWTensors> ts[2];
      for (size_t k = 0; k < sizes.size(); ++k) {
        const Both g =
            both(rand_vec(sizes[k], 900 + static_cast<uint32_t>(7 * step + k), -2, 2), {sizes[k]}, DType::f32);
        for (int d = 0; d < 2; ++d)
          ts[d].push_back({.master = master[k].*kDevices[d],
                           .grad = g.*kDevices[d],
                           .exp_avg = m[k].*kDevices[d],
                           .exp_avg_sq = v[k].*kDevices[d],
                           .value = value_dt == DType::f32 ? Tensor() : value[k].*kDevices[d],
                           .decay = k % 3 != 1});
      }
      for (auto& t : ts) adamw_multi_step(t, opt);
      for (size_t k = 0; k < sizes.size(); ++k) {
        const std::string what = str(dtype_name(value_dt), " tensor ", k, " step ", step);
        expect_exact(master[k], "adamw_multi_step master, " + what);
        expect_exact(m[k], "adamw_multi_step exp_avg, " + what);
        expect_exact(v[k], "adamw_multi_step exp_avg_sq, " + what);
        if (value_dt != DType::f32) expect_exact(value[k], "adamw_multi_step value, " + what);
      }
    }
  }
}

TEST_F(CudaOps, GradStatsEqualCpu) {
  const std::vector<int64_t> sizes = many_sizes();
  std::vector<Both> xs;
  std::vector<Tensor> cpu_xs, gpu_xs;
  for (size_t k = 0; k < sizes.size(); ++k) {
    xs.push_back(both(rand_vec(sizes[k], 1000 + static_cast<uint32_t>(k), -2, 2), {sizes[k]}, DType::f32));
    cpu_xs.push_back(xs.back().cpu);
    gpu_xs.push_back(xs.back().gpu);
  }
  const GradStats cpu = grad_stats(cpu_xs), gpu = grad_stats(gpu_xs);
  EXPECT_LE(std::abs(gpu.sum_squares - cpu.sum_squares), 1e-9 * cpu.sum_squares)
      << "gpu " << gpu.sum_squares << ", cpu " << cpu.sum_squares;
  EXPECT_FALSE(gpu.found_inf);
  EXPECT_EQ(grad_stats(gpu_xs).sum_squares, gpu.sum_squares);  // deterministic
  EXPECT_EQ(grad_stats(std::vector<Tensor>{}).sum_squares, 0.0);
  // An inf or NaN in a tensor of the first launch, of the second, or in a long tensor's last chunk.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [bad, k, at] : {std::tuple{inf, size_t{2}, int64_t{65536}}, std::tuple{nan, size_t{290}, int64_t{0}},
                                   std::tuple{-inf, size_t{4}, int64_t{200002}}}) {
    Vec y = values(xs[k].cpu);
    y[at] = bad;
    std::vector<Tensor> with_bad = gpu_xs;
    with_bad[k] = make(y, {sizes[k]}).to(Device::cuda);
    const GradStats st = grad_stats(with_bad);
    EXPECT_TRUE(st.found_inf) << bad << " in tensor " << k << " at " << at;
    EXPECT_FALSE(std::isfinite(st.sum_squares));
  }
}

TEST_F(CudaOps, AccumulateMeanAndFill) {
  Both sum = {f64_zeros(1, Device::cpu), f64_zeros(1, Device::cuda)};
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{16384}}) {
    const Both l = both(rand_vec(n, 1100 + static_cast<uint32_t>(n), 0, 9), {n}, DType::f32);
    for (auto d : kDevices) accumulate_mean(l.*d, sum.*d);
  }
  const double cpu = read_f64(sum.cpu)[0], gpu = read_f64(sum.gpu)[0];
  EXPECT_LE(std::abs(gpu - cpu), 1e-6 * cpu) << "gpu " << gpu << ", cpu " << cpu;
  for (DType dt : kFloatTypes) {
    Both x = poisoned({70001}, dt);
    for (auto d : kDevices) fill_(x.*d, 0.1f);
    expect_exact(x, str("fill_ ", dtype_name(dt)));
  }
}

// The masked loss's sum (supervised fine-tuning): weights with zeros (masked targets) and others, on both devices.
TEST_F(CudaOps, AccumulateWeightedSum) {
  Both sum = {f64_zeros(1, Device::cpu), f64_zeros(1, Device::cuda)};
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{16384}}) {
    const Both l = both(rand_vec(n, 1200 + static_cast<uint32_t>(n), 0, 9), {n}, DType::f32);
    Vec w = rand_vec(n, 1300 + static_cast<uint32_t>(n), 0, 1);
    for (int64_t i = 0; i < n; i += 3) w[static_cast<size_t>(i)] = 0;  // masked
    const Both wt = both(w, {n}, DType::f32);
    for (auto d : kDevices) accumulate_weighted_sum(l.*d, wt.*d, sum.*d);
  }
  const double cpu = read_f64(sum.cpu)[0], gpu = read_f64(sum.gpu)[0];
  EXPECT_GT(cpu, 0);
  EXPECT_LE(std::abs(gpu - cpu), 1e-6 * cpu) << "gpu " << gpu << ", cpu " << cpu;
}

}  // namespace
}  // namespace mt
