// test_cuda_ops.norms_llama.cpp: the CUDA LayerNorm, RMSNorm, SwiGLU and RoPE against the CPU reference: aligned and
// misaligned views, in place, deterministic weight gradients, and the RoPE head-dim limit.
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); each test skips where no GPU can run it, and
// cuda_op_checks.h says how the GPU is compared with the CPU.
#include <gtest/gtest.h>

#include <stdexcept>

#include "core/base/rope_scaling.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, Both, CudaOps, the checks of cuda_op_checks.h

// ---- LayerNorm -----------------------------------------------------------------------------------

// Shapes with row lengths around the vector width, activations and weights aligned and not, out aliasing x
// and dx aliasing dout.
TEST_F(CudaOps, LayerNormForwardAndBackward) {
  const auto shapes = norm_shapes({{37, 97}, {4, 768}, {3, 1600}});
  for_each_norm_case(shapes, [](int64_t N, int64_t C, DType dt, int64_t off, DType w_dt, int64_t w_off,
                                const std::string& what) {
    const Vec xv = rand_vec(N * C, 1440, -2, 3), dv = rand_vec(N * C, 1443);
    const Both x = both_at(xv, {N, C}, dt, off), dout = both_at(dv, {N, C}, dt, off);
    const Both w = both_at(rand_vec(C, 1441, 0.5, 1.5), {C}, w_dt, w_off);
    const Both b = both_at(rand_vec(C, 1442), {C}, w_dt, w_off);
    Both out = poisoned_at({N, C}, dt, off), mean = poisoned({N}, DType::f32), rstd = poisoned({N}, DType::f32);
    Both dx = poisoned_at({N, C}, dt, off);
    Both dw = both(rand_vec(C, 1444), {C}, DType::f32), db = both(rand_vec(C, 1445), {C}, DType::f32);
    Both y_inplace = both_at(xv, {N, C}, dt, off), dx_inplace = both_at(dv, {N, C}, dt, off);
    Both mean2 = poisoned({N}, DType::f32), rstd2 = poisoned({N}, DType::f32);
    Both dw2 = both(Vec(C, 0.0), {C}, DType::f32), db2 = both(Vec(C, 0.0), {C}, DType::f32);
    for (auto dev : kDevices) {
      layernorm_forward(x.*dev, w.*dev, b.*dev, out.*dev, mean.*dev, rstd.*dev, {.eps = 1e-5f});
      layernorm_backward(dout.*dev, x.*dev, w.*dev, mean.*dev, rstd.*dev, dx.*dev, dw.*dev, db.*dev);
      // out aliasing x, dx aliasing dout
      layernorm_forward(y_inplace.*dev, w.*dev, b.*dev, y_inplace.*dev, mean2.*dev, rstd2.*dev, {.eps = 1e-5f});
      layernorm_backward(dx_inplace.*dev, x.*dev, w.*dev, mean.*dev, rstd.*dev, dx_inplace.*dev, dw2.*dev, db2.*dev);
    }
    const double tol = tol_for(dt);
    expect_match(out, tol, "layernorm out" + what);
    expect_match(mean, tol, "layernorm mean" + what);
    expect_match(rstd, tol, "layernorm rstd" + what);
    expect_match(dx, tol, "layernorm dx" + what);
    expect_match(dw, tol, "layernorm dweight" + what);
    expect_match(db, tol, "layernorm dbias" + what);
    expect_match(y_inplace, tol, "layernorm out in place of x" + what);
    expect_match(dx_inplace, tol, "layernorm dx in place of dout" + what);
  });
}

// ---- Llama ops: RMSNorm, SwiGLU, RoPE --------------------------------------------------------------

// As LayerNormForwardAndBackward.
TEST_F(CudaOps, RmsNormForwardAndBackward) {
  const auto shapes = norm_shapes({{37, 97}, {4, 768}, {3, 4096}, {300, 64}});
  for_each_norm_case(
      shapes, [](int64_t N, int64_t C, DType dt, int64_t off, DType w_dt, int64_t w_off, const std::string& what) {
        const Vec xv = rand_vec(N * C, 1450, -2, 3), dv = rand_vec(N * C, 1452);
        const Both x = both_at(xv, {N, C}, dt, off), dout = both_at(dv, {N, C}, dt, off);
        const Both w = both_at(rand_vec(C, 1451, 0.5, 1.5), {C}, w_dt, w_off);
        Both out = poisoned_at({N, C}, dt, off), rstd = poisoned({N}, DType::f32);
        Both dx = poisoned_at({N, C}, dt, off), dw = both(rand_vec(C, 1453), {C}, DType::f32);
        Both y_inplace = both_at(xv, {N, C}, dt, off), dx_inplace = both_at(dv, {N, C}, dt, off);
        Both rstd2 = poisoned({N}, DType::f32), dw2 = both(Vec(C, 0.0), {C}, DType::f32);
        for (auto dev : kDevices) {
          rmsnorm_forward(x.*dev, w.*dev, out.*dev, rstd.*dev, {.eps = 1e-6f});
          rmsnorm_backward(dout.*dev, x.*dev, w.*dev, rstd.*dev, dx.*dev, dw.*dev);
          // out aliasing x, dx aliasing dout
          rmsnorm_forward(y_inplace.*dev, w.*dev, y_inplace.*dev, rstd2.*dev, {.eps = 1e-6f});
          rmsnorm_backward(dx_inplace.*dev, x.*dev, w.*dev, rstd.*dev, dx_inplace.*dev, dw2.*dev);
        }
        const double tol = tol_for(dt);
        expect_match(out, tol, "rmsnorm out" + what);
        expect_match(rstd, tol, "rmsnorm rstd" + what);
        expect_match(dx, tol, "rmsnorm dx" + what);
        expect_match(dw, tol, "rmsnorm dweight" + what);
        expect_match(y_inplace, tol, "rmsnorm out in place of x" + what);
        expect_match(dx_inplace, tol, "rmsnorm dx in place of dout" + what);
      });
}

// out aliasing x, dx aliasing dout (the weight gradient reads dout before dx overwrites it), and the weight
// gradient is the same bits on every run (fixed row chunks, no atomics).
TEST_F(CudaOps, RmsNormInPlaceAndDeterministic) {
  const int64_t N = 2049, C = 320;
  for (DType dt : kFloatTypes) {
    const Vec xv = rand_vec(N * C, 364, -2, 2), dv = rand_vec(N * C, 365);
    const Both x = both(xv, {N, C}, dt), w = both(rand_vec(C, 366, 0.5, 1.5), {C}, dt);
    Both y = both(xv, {N, C}, dt), rstd = poisoned({N}, DType::f32);
    Both dx = both(dv, {N, C}, dt), dw = both(Vec(C, 0.0), {C}, DType::f32);
    for (auto d : kDevices) {
      rmsnorm_forward(y.*d, w.*d, y.*d, rstd.*d, {});
      rmsnorm_backward(dx.*d, x.*d, w.*d, rstd.*d, dx.*d, dw.*d);
    }
    expect_match(y, tol_for(dt), str("rmsnorm out in place of x ", dtype_name(dt)));
    expect_match(dx, tol_for(dt), str("rmsnorm dx in place of dout ", dtype_name(dt)));
    expect_match(dw, tol_for(dt), str("rmsnorm dweight ", dtype_name(dt)));
    Tensor dout2 = make(dv, {N, C}, dt).to(Device::cuda), dw2 = make(Vec(C, 0.0), {C}).to(Device::cuda);
    rmsnorm_backward(dout2, x.gpu, w.gpu, rstd.gpu, dout2, dw2);
    EXPECT_EQ(bytes_of(dw.gpu), bytes_of(dw2)) << "rmsnorm dweight is not deterministic, " << dtype_name(dt);
  }
}

TEST_F(CudaOps, SwiGluForwardAndBackward) {
  for (const auto& [N, F] : {std::pair<int64_t, int64_t>{41, 129}, {3, 2816}})
    for (DType dt : kFloatTypes) {
      Vec xv = rand_vec(N * 2 * F, 370, -6, 6);
      for (double g : {-200.0, -90.0, 90.0, 200.0}) xv[2 * static_cast<size_t>(g + 300)] = g;  // tails of exp
      const Both x = both(xv, {N, 2 * F}, dt), dout = both(rand_vec(N * F, 371), {N, F}, dt);
      Both out = poisoned({N, F}, dt), dx = poisoned({N, 2 * F}, dt);
      for (auto d : kDevices) {
        swiglu_forward(x.*d, out.*d);
        swiglu_backward(x.*d, dout.*d, dx.*d);
      }
      expect_match(out, tol_for(dt), str("swiglu_forward ", N, "x", F, " ", dtype_name(dt)));
      expect_match(dx, tol_for(dt), str("swiglu_backward ", N, "x", F, " ", dtype_name(dt)));
    }
}

// Scaled rotary embeddings (llama3's frequencies; yarn's with its attention factor), forward and inverse: the
// host's table of frequencies and the factor reach the kernels as the CPU's rope_ takes them.
TEST_F(CudaOps, RopeScaledFrequenciesAndAttentionFactor) {
  const Shape shape{2, 40, 2, 4, 64};
  for (RopeScalingType type : {RopeScalingType::llama3, RopeScalingType::yarn}) {
    const RopeFrequencies f = rope_frequencies(500000.0, 64,
                                               {.type = type,
                                                .factor = 8,
                                                .low_freq_factor = 1,
                                                .high_freq_factor = 4,
                                                .original_max_position_embeddings = 16});
    for (DType dt : kFloatTypes)
      for (bool inverse : {false, true}) {
        Both qkv = both(rand_vec(shape_numel(shape), 381, -2, 2), shape, dt);
        const RopeOptions opt{.theta = 500000.f,
                              .inv_freq = f.inv_freq,
                              .attention_factor = f.attention_factor,
                              .position_offset = 3,
                              .inverse = inverse};
        for (auto d : kDevices) rope_(qkv.*d, opt);
        expect_match(qkv, tol_for(dt), str("rope_ ", name_of(type), inverse ? " inverse " : " ", dtype_name(dt)));
      }
  }
}

// GPT-shaped (G = H, R = 1), grouped-query and multi-query qkv, forward and inverse, with a position offset
// and far positions. The value slots must come back bit for bit.
TEST_F(CudaOps, RopeForwardAndInverse) {
  struct Case {
    int64_t B, T, G, R, D, offset;
    float theta;
  };
  for (const Case& c : {Case{2, 37, 4, 1, 64, 0, 10000.f}, Case{1, 19, 2, 4, 128, 5, 500000.f},
                        Case{3, 5, 1, 8, 6, 100000, 10000.f}, Case{1, 300, 2, 2, 2, 0, 10000.f}})
    for (DType dt : kFloatTypes)
      for (bool inverse : {false, true}) {
        const Shape shape{c.B, c.T, c.G, c.R + 2, c.D};
        Both qkv = both(rand_vec(shape_numel(shape), 380, -2, 2), shape, dt);
        const RopeOptions opt{.theta = c.theta, .position_offset = c.offset, .inverse = inverse};
        for (auto d : kDevices) rope_(qkv.*d, opt);
        const std::string what = str("rope_ B", c.B, " T", c.T, " G", c.G, " R", c.R, " D", c.D, " offset ", c.offset,
                                     inverse ? " inverse " : " ", dtype_name(dt));
        expect_match(qkv, tol_for(dt), what);
        const Vec got = values(qkv.gpu), before = values(make(rand_vec(shape_numel(shape), 380, -2, 2), shape, dt));
        const int64_t S = c.R + 2;
        int64_t moved = 0;
        for (int64_t btg = 0; btg < c.B * c.T * c.G; ++btg)
          for (int64_t i = 0; i < c.D; ++i) {
            const int64_t k = (btg * S + S - 1) * c.D + i;  // slot R + 1: the value
            moved += got[k] != before[k];
          }
        EXPECT_EQ(moved, 0) << what << ": " << moved << " elements of the value slots changed";
      }
}

// The CUDA kernel passes inv_freq in its parameters (D <= 512); a wider head is refused by name.
TEST_F(CudaOps, RopeRefusesHeadDimsBeyondTheKernelLimit) {
  Tensor qkv = Tensor::zeros({1, 2, 1, 3, 514}, DType::f32, Device::cuda);
  try {
    rope_(qkv, {});
    ADD_FAILURE() << "rope_ with D = 514 did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rope_: the CUDA kernel supports a head dim D up to 512, got 514"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mt
