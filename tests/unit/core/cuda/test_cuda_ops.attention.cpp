// test_cuda_ops.attention.cpp: the CUDA attention against the CPU reference: the kernel, cuDNN's fused attention (which
// path runs, and that it is deterministic), and grouped-query attention on both paths.
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); each test skips where no GPU can run it, and
// cuda_op_checks.h says how the GPU is compared with the CPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <ostream>
#include <stdexcept>

#include "core/base/rng.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"
#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/attention_backend.h"
#endif

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, Both, CudaOps, the checks of cuda_op_checks.h

// ---- attention -----------------------------------------------------------------------------------

struct AttnCase {
  bool causal;
  float dropout_p;
  int64_t B, T, H, D;
  bool flat_out;  // out and dout as the (B, T, H * D) view the models use
};

// gtest prints parameters it cannot name as raw bytes (padding included); say what the case is instead.
void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << (c.causal ? "causal" : "full") << " p=" << c.dropout_p << " B=" << c.B << " T=" << c.T << " H=" << c.H
      << " D=" << c.D << (c.flat_out ? " flat" : "");
}

class CudaAttention : public CudaOps, public ::testing::WithParamInterface<AttnCase> {};

TEST_P(CudaAttention, ForwardAndBackwardMatchCpu) {
  const AttnCase c = GetParam();
  const int64_t B = c.B, T = c.T, H = c.H, D = c.D;
  const AttentionOptions opt{.causal = c.causal,
                             .dropout_p = c.dropout_p,
                             .seed = 17,
                             .site = stream_id("layers.2.attn.probs"),
                             .sample_offset = 5,
                             .head_offset = 2};
  const Shape out_shape = c.flat_out ? Shape{B, T, H * D} : Shape{B, T, H, D};
  for (DType dt : kFloatTypes) {
    const Both qkv = both(rand_vec(B * T * H * 3 * D, 390, -2, 2), {B, T, H, 3, D}, dt);
    const Both dout = both(rand_vec(B * T * H * D, 391), out_shape, dt);
    Both out = poisoned(out_shape, dt), lse = poisoned({B, H, T}, DType::f32);
    Both dqkv = poisoned({B, T, H, 3, D}, dt);
    for (auto d : kDevices) {
      attention_forward(qkv.*d, out.*d, lse.*d, opt);
      attention_backward(qkv.*d, out.*d, lse.*d, dout.*d, dqkv.*d, opt);
    }
    const std::string what = str(" ", dtype_name(dt));
    expect_match(out, tol_for(dt), "attention out" + what);
    expect_match(lse, tol_for(dt), "attention lse" + what);
    expect_match(dqkv, tol_for(dt), "attention dqkv" + what);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttention,
    ::testing::Values(AttnCase{true, 0.f, 2, 37, 3, 16, false}, AttnCase{true, 0.1f, 2, 37, 3, 16, false},
                      AttnCase{false, 0.f, 2, 37, 3, 16, false}, AttnCase{false, 0.1f, 2, 37, 3, 16, false},
                      AttnCase{true, 0.f, 1, 130, 2, 64, true}, AttnCase{true, 0.1f, 1, 130, 2, 64, true},
                      AttnCase{false, 0.f, 1, 130, 2, 64, true}, AttnCase{false, 0.1f, 1, 130, 2, 64, true}),
    [](const auto& info) {
      const AttnCase& c = info.param;
      return str(c.causal ? "Causal" : "Full", c.dropout_p > 0 ? "Dropout" : "NoDropout", "_B", c.B, "_T", c.T, "_H",
                 c.H, "_D", c.D);
    });

// ---- attention paths: cuDNN's fused attention and the kernel -------------------------------------
// MEGATRAIN_ATTENTION picks the path (core/cuda/attention_backend.h); each test sets it and checks which path
// ran with last_attention_path(), so a silent fallback to the kernel cannot pass for cuDNN.

#if defined(MEGATRAIN_WITH_CUDA)
// The choice by dtype, dropout and mode needs no GPU: it runs wherever the CUDA backend is built.
TEST(AttentionPath, ChosenByDtypeDropoutAndMode) {
  std::string why;
  {
    AttentionModeScope mode("auto");
    EXPECT_EQ(cuda::attention_path(DType::f32, 0.f, &why), cuda::AttentionPath::kernel);
    EXPECT_NE(why.find("bf16 or fp16"), std::string::npos) << why;
    EXPECT_EQ(cuda::attention_path(DType::bf16, 0.1f, &why), cuda::AttentionPath::kernel);
    EXPECT_NE(why.find("dropout 0.1 needs layout-invariant masks"), std::string::npos) << why;
    const auto fused = cuda::cudnn_built() ? cuda::AttentionPath::cudnn : cuda::AttentionPath::kernel;
    EXPECT_EQ(cuda::attention_path(DType::bf16, 0.f), fused);
    EXPECT_EQ(cuda::attention_path(DType::f16, 0.f), fused);
    EXPECT_NE(cuda::attention_path_description(DType::bf16, 0.1f).find("megatrain kernel (dropout 0.1"),
              std::string::npos);
    if (cuda::cudnn_built()) {
      EXPECT_NE(cuda::attention_path_description(DType::bf16, 0.f).find("cuDNN fused (flash)"), std::string::npos);
    }
  }
  {
    AttentionModeScope mode("kernel");
    EXPECT_EQ(cuda::attention_path(DType::bf16, 0.f, &why), cuda::AttentionPath::kernel);
    EXPECT_EQ(why, "MEGATRAIN_ATTENTION=kernel");
  }
  {
    AttentionModeScope mode("cudnn");  // forcing cuDNN where it cannot run is an error, not a silent fallback
    EXPECT_THROW(cuda::attention_path(DType::f32, 0.f), std::runtime_error);
    EXPECT_THROW(cuda::attention_path(DType::bf16, 0.1f), std::runtime_error);
    if (cuda::cudnn_built())
      EXPECT_EQ(cuda::attention_path(DType::bf16, 0.f), cuda::AttentionPath::cudnn);
    else
      EXPECT_THROW(cuda::attention_path(DType::bf16, 0.f), std::runtime_error);
  }
  {
    AttentionModeScope mode("flash");
    EXPECT_THROW(cuda::attention_mode(), std::runtime_error);
  }
}

TEST(AttentionPath, CudnnVersionIsNamedOrNotBuilt) {
  const std::string v = cuda::cudnn_version();
  if (cuda::cudnn_built())
    EXPECT_NE(v.find("(built with 9."), std::string::npos) << v;
  else
    EXPECT_EQ(v.rfind("not built", 0), 0u) << v;
}

// Skips unless a GPU and the cuDNN path are there.
class CudnnAttention : public CudaOps {
 protected:
  void SetUp() override {
    CudaOps::SetUp();
    if (IsSkipped()) return;
    if (!cuda::cudnn_built()) GTEST_SKIP() << "built without cuDNN: " << cuda::cudnn_version();
  }
};

struct CudnnCase {
  int64_t B, T, H, D;
  bool causal;
};

void PrintTo(const CudnnCase& c, std::ostream* os) {
  *os << (c.causal ? "causal" : "full") << " B=" << c.B << " T=" << c.T << " H=" << c.H << " D=" << c.D;
}

// The forward and backward of one case on both devices, the GPU under the current MEGATRAIN_ATTENTION.
struct AttnRun {
  Both qkv, dout, out, lse, dqkv;
};

AttnRun run_attention(const CudnnCase& c, DType dt, uint32_t seed, cuda::AttentionPath expect_path) {
  const int64_t B = c.B, T = c.T, H = c.H, D = c.D;
  const AttentionOptions opt{.causal = c.causal};
  AttnRun r{both(rand_vec(B * T * H * 3 * D, seed, -2, 2), {B, T, H, 3, D}, dt),
            both(rand_vec(B * T * H * D, seed + 1), {B, T, H, D}, dt), poisoned({B, T, H, D}, dt),
            poisoned({B, H, T}, DType::f32), poisoned({B, T, H, 3, D}, dt)};
  const AttentionCalls before = attention_calls();
  for (auto d : kDevices) {
    attention_forward(r.qkv.*d, r.out.*d, r.lse.*d, opt);
    if (d == &Both::gpu) {
      EXPECT_EQ(cuda::last_attention_path(), expect_path) << "forward";
    }
    attention_backward(r.qkv.*d, r.out.*d, r.lse.*d, r.dout.*d, r.dqkv.*d, opt);
    if (d == &Both::gpu) {
      EXPECT_EQ(cuda::last_attention_path(), expect_path) << "backward";
    }
  }
  // The counters the log and metrics.jsonl report: two CPU calls, and two on the path the GPU took.
  const AttentionCalls after = attention_calls();
  const bool fused = expect_path == cuda::AttentionPath::cudnn;
  EXPECT_EQ(after.cpu - before.cpu, 2);
  EXPECT_EQ(after.cudnn - before.cudnn, fused ? 2 : 0);
  EXPECT_EQ(after.kernel - before.kernel, fused ? 0 : 2);
  return r;
}

class CudnnAttentionShapes : public CudnnAttention, public ::testing::WithParamInterface<CudnnCase> {};

TEST_P(CudnnAttentionShapes, ForwardAndBackwardMatchCpu) {
  AttentionModeScope mode("cudnn");
  for (DType dt : {DType::bf16, DType::f16}) {
    const AttnRun r = run_attention(GetParam(), dt, 700, cuda::AttentionPath::cudnn);
    const std::string what = str(" ", dtype_name(dt));
    expect_match(r.out, tol_for(dt), "cudnn attention out" + what);
    expect_match(r.lse, tol_for(dt), "cudnn attention lse" + what);
    expect_match(r.dqkv, tol_for(dt), "cudnn attention dqkv" + what);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttentionShapes,
                         ::testing::Values(CudnnCase{2, 37, 3, 64, true}, CudnnCase{1, 130, 2, 128, true},
                                           CudnnCase{2, 128, 4, 64, true}, CudnnCase{1, 77, 2, 128, true},
                                           CudnnCase{2, 100, 2, 64, false}),
                         [](const auto& info) {
                           const CudnnCase& c = info.param;
                           return str(c.causal ? "Causal" : "Full", "_B", c.B, "_T", c.T, "_H", c.H, "_D", c.D);
                         });

// The same inputs give the same gradient bits (cuDNN's deterministic SDPA backward).
TEST_F(CudnnAttention, BackwardIsDeterministic) {
  AttentionModeScope mode("cudnn");
  const int64_t B = 2, T = 193, H = 4, D = 64;
  const AttentionOptions opt{.causal = true};
  for (DType dt : {DType::bf16, DType::f16}) {
    const Tensor qkv = make(rand_vec(B * T * H * 3 * D, 710, -2, 2), {B, T, H, 3, D}, dt).to(Device::cuda);
    const Tensor dout = make(rand_vec(B * T * H * D, 711), {B, T, H, D}, dt).to(Device::cuda);
    Tensor out = Tensor::empty({B, T, H, D}, dt, Device::cuda);
    Tensor lse = Tensor::empty({B, H, T}, DType::f32, Device::cuda);
    attention_forward(qkv, out, lse, opt);
    Tensor first = Tensor::empty({B, T, H, 3, D}, dt, Device::cuda);
    Tensor second = Tensor::empty({B, T, H, 3, D}, dt, Device::cuda);
    attention_backward(qkv, out, lse, dout, first, opt);
    attention_backward(qkv, out, lse, dout, second, opt);
    EXPECT_EQ(cuda::last_attention_path(), cuda::AttentionPath::cudnn);
    EXPECT_EQ(bytes_of(first), bytes_of(second)) << dtype_name(dt);
  }
}

// Forcing either path: both match the CPU, so they match each other within the dtype's tolerance.
TEST_F(CudnnAttention, ForcedKernelAndForcedCudnnBothMatchCpu) {
  const CudnnCase c{2, 65, 2, 64, true};
  for (DType dt : {DType::bf16, DType::f16}) {
    for (const auto& [mode_name, path] :
         {std::pair{"kernel", cuda::AttentionPath::kernel}, std::pair{"cudnn", cuda::AttentionPath::cudnn}}) {
      AttentionModeScope mode(mode_name);
      const AttnRun r = run_attention(c, dt, 720, path);
      const std::string what = str(" ", dtype_name(dt), " MEGATRAIN_ATTENTION=", mode_name);
      expect_match(r.out, tol_for(dt), "attention out" + what);
      expect_match(r.lse, tol_for(dt), "attention lse" + what);
      expect_match(r.dqkv, tol_for(dt), "attention dqkv" + what);
    }
  }
}

// auto takes cuDNN for bf16 without dropout, the kernel for fp32, dropout, or a head dimension cuDNN cannot
// load (D = 20, not a multiple of 8); forcing cuDNN on that shape fails loudly.
TEST_F(CudnnAttention, AutoFallsBackToTheKernelWhereCudnnCannotRun) {
  {
    AttentionModeScope mode("auto");
    run_attention({1, 50, 2, 64, true}, DType::bf16, 730, cuda::AttentionPath::cudnn);
    run_attention({1, 50, 2, 64, true}, DType::f32, 731, cuda::AttentionPath::kernel);
    const AttnRun r = run_attention({1, 50, 2, 20, true}, DType::bf16, 732, cuda::AttentionPath::kernel);
    expect_match(r.out, tol_for(DType::bf16), "attention out D=20 on the kernel");
    expect_match(r.dqkv, tol_for(DType::bf16), "attention dqkv D=20 on the kernel");
    const int64_t B = 1, T = 50, H = 2, D = 64;
    const Tensor qkv = make(rand_vec(B * T * H * 3 * D, 733), {B, T, H, 3, D}, DType::bf16).to(Device::cuda);
    Tensor out = Tensor::empty({B, T, H, D}, DType::bf16, Device::cuda);
    Tensor lse = Tensor::empty({B, H, T}, DType::f32, Device::cuda);
    attention_forward(qkv, out, lse, {.causal = true, .dropout_p = 0.1f, .seed = 3});
    EXPECT_EQ(cuda::last_attention_path(), cuda::AttentionPath::kernel) << "dropout runs on the kernel";
  }
  {
    AttentionModeScope mode("cudnn");
    const int64_t B = 1, T = 50, H = 2, D = 20;
    const Tensor qkv = make(rand_vec(B * T * H * 3 * D, 734), {B, T, H, 3, D}, DType::bf16).to(Device::cuda);
    Tensor out = Tensor::empty({B, T, H, D}, DType::bf16, Device::cuda);
    Tensor lse = Tensor::empty({B, H, T}, DType::f32, Device::cuda);
    EXPECT_THROW(attention_forward(qkv, out, lse, {.causal = true}), std::runtime_error);
  }
}
// ---- grouped-query attention ----
// qkv (B, T, G, R + 2, D): R query heads per key/value group (G = 1: multi-query). Each GPU path is forced with
// MEGATRAIN_ATTENTION and checked against the CPU, whose grouped-query attention test_ops.cpp checks against
// the expanded reference.

struct GqaCase {
  int64_t B, T, G, R, D;
  bool causal;
  float dropout_p;
};

void PrintTo(const GqaCase& c, std::ostream* os) {
  *os << (c.causal ? "causal" : "full") << " p=" << c.dropout_p << " B=" << c.B << " T=" << c.T << " G=" << c.G
      << " R=" << c.R << " D=" << c.D;
}

std::string gqa_name(const GqaCase& c) {
  return str(c.causal ? "Causal" : "Full", c.dropout_p > 0 ? "Dropout" : "NoDropout", "_B", c.B, "_T", c.T, "_G", c.G,
             "_R", c.R, "_D", c.D);
}

// The forward and backward of one grouped case on both devices, the GPU under the current MEGATRAIN_ATTENTION,
// which must take `expect_path`.
AttnRun run_gqa(const GqaCase& c, DType dt, uint32_t seed, cuda::AttentionPath expect_path) {
  const int64_t B = c.B, T = c.T, G = c.G, R = c.R, D = c.D, H = G * R;
  const AttentionOptions opt{
      .causal = c.causal, .dropout_p = c.dropout_p, .seed = 23, .site = 9, .sample_offset = 1, .head_offset = 4};
  AttnRun r{both(rand_vec(B * T * G * (R + 2) * D, seed, -2, 2), {B, T, G, R + 2, D}, dt),
            both(rand_vec(B * T * H * D, seed + 1), {B, T, H, D}, dt), poisoned({B, T, H, D}, dt),
            poisoned({B, H, T}, DType::f32), poisoned({B, T, G, R + 2, D}, dt)};
  for (auto d : kDevices) {
    attention_forward(r.qkv.*d, r.out.*d, r.lse.*d, opt);
    if (d == &Both::gpu) {
      EXPECT_EQ(cuda::last_attention_path(), expect_path) << "forward";
    }
    attention_backward(r.qkv.*d, r.out.*d, r.lse.*d, r.dout.*d, r.dqkv.*d, opt);
    if (d == &Both::gpu) {
      EXPECT_EQ(cuda::last_attention_path(), expect_path) << "backward";
    }
  }
  return r;
}

void expect_gqa_match(const AttnRun& r, DType dt, const std::string& what) {
  expect_match(r.out, tol_for(dt), "attention out" + what);
  expect_match(r.lse, tol_for(dt), "attention lse" + what);
  expect_match(r.dqkv, tol_for(dt), "attention dqkv" + what);
}

class CudaGqaKernel : public CudaOps, public ::testing::WithParamInterface<GqaCase> {};

// The kernel (every dtype, dropout with the CPU's masks): dk, dv summed over each group's heads in the block.
TEST_P(CudaGqaKernel, ForwardAndBackwardMatchCpu) {
  AttentionModeScope mode("kernel");
  for (DType dt : kFloatTypes)
    expect_gqa_match(run_gqa(GetParam(), dt, 800, cuda::AttentionPath::kernel), dt, str(" ", dtype_name(dt)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGqaKernel,
                         ::testing::Values(GqaCase{2, 37, 2, 2, 16, true, 0.f}, GqaCase{2, 37, 2, 4, 16, true, 0.1f},
                                           GqaCase{2, 37, 1, 4, 16, false, 0.1f}, GqaCase{1, 130, 1, 2, 64, true, 0.f},
                                           GqaCase{1, 70, 3, 2, 128, true, 0.1f},
                                           GqaCase{1, 40, 2, 3, 256, false, 0.f}),
                         [](const auto& info) { return gqa_name(info.param); });

// The same inputs give the same gradient bits on the kernel (dk, dv: a fixed order over the group's heads).
TEST_F(CudaOps, GqaKernelBackwardIsDeterministic) {
  AttentionModeScope mode("kernel");
  const int64_t B = 2, T = 97, G = 2, R = 4, D = 64, H = G * R;
  const AttentionOptions opt{.causal = true, .dropout_p = 0.1f, .seed = 4, .site = 5};
  const Tensor qkv = make(rand_vec(B * T * G * (R + 2) * D, 810, -2, 2), {B, T, G, R + 2, D}).to(Device::cuda);
  const Tensor dout = make(rand_vec(B * T * H * D, 811), {B, T, H, D}).to(Device::cuda);
  Tensor out = Tensor::empty({B, T, H, D}, DType::f32, Device::cuda);
  Tensor lse = Tensor::empty({B, H, T}, DType::f32, Device::cuda);
  attention_forward(qkv, out, lse, opt);
  Tensor first = Tensor::empty(qkv.shape(), DType::f32, Device::cuda);
  Tensor second = Tensor::empty(qkv.shape(), DType::f32, Device::cuda);
  attention_backward(qkv, out, lse, dout, first, opt);
  attention_backward(qkv, out, lse, dout, second, opt);
  EXPECT_EQ(cuda::last_attention_path(), cuda::AttentionPath::kernel);
  EXPECT_EQ(bytes_of(first), bytes_of(second));
}

class CudnnGqa : public CudnnAttention, public ::testing::WithParamInterface<GqaCase> {};

// cuDNN's native grouped-query SDPA: K, V (B, G, T, D) read in place, the queries gathered for R > 1, dq
// scattered back, dk and dv summed over the group by cuDNN.
TEST_P(CudnnGqa, ForwardAndBackwardMatchCpu) {
  AttentionModeScope mode("cudnn");
  for (DType dt : {DType::bf16, DType::f16})
    expect_gqa_match(run_gqa(GetParam(), dt, 820, cuda::AttentionPath::cudnn), dt,
                     str(" ", dtype_name(dt), " on cuDNN"));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnGqa,
                         ::testing::Values(GqaCase{2, 37, 2, 2, 64, true, 0.f}, GqaCase{1, 130, 1, 4, 128, true, 0.f},
                                           GqaCase{2, 100, 2, 3, 64, false, 0.f}, GqaCase{2, 65, 4, 1, 64, true, 0.f}),
                         [](const auto& info) { return gqa_name(info.param); });

// Forcing either path on one grouped case: both match the CPU.
TEST_F(CudnnAttention, GqaForcedKernelAndForcedCudnnBothMatchCpu) {
  const GqaCase c{2, 65, 2, 4, 64, true, 0.f};
  for (DType dt : {DType::bf16, DType::f16})
    for (const auto& [mode_name, path] :
         {std::pair{"kernel", cuda::AttentionPath::kernel}, std::pair{"cudnn", cuda::AttentionPath::cudnn}}) {
      AttentionModeScope mode(mode_name);
      expect_gqa_match(run_gqa(c, dt, 830, path), dt, str(" ", dtype_name(dt), " MEGATRAIN_ATTENTION=", mode_name));
    }
}

// The same inputs give the same gradient bits on cuDNN with R > 1 (its deterministic backward, then the scatter).
TEST_F(CudnnAttention, GqaBackwardIsDeterministic) {
  AttentionModeScope mode("cudnn");
  const int64_t B = 2, T = 193, G = 2, R = 4, D = 64, H = G * R;
  const AttentionOptions opt{.causal = true};
  for (DType dt : {DType::bf16, DType::f16}) {
    const Tensor qkv = make(rand_vec(B * T * G * (R + 2) * D, 840, -2, 2), {B, T, G, R + 2, D}, dt).to(Device::cuda);
    const Tensor dout = make(rand_vec(B * T * H * D, 841), {B, T, H, D}, dt).to(Device::cuda);
    Tensor out = Tensor::empty({B, T, H, D}, dt, Device::cuda);
    Tensor lse = Tensor::empty({B, H, T}, DType::f32, Device::cuda);
    attention_forward(qkv, out, lse, opt);
    Tensor first = Tensor::empty(qkv.shape(), dt, Device::cuda);
    Tensor second = Tensor::empty(qkv.shape(), dt, Device::cuda);
    attention_backward(qkv, out, lse, dout, first, opt);
    attention_backward(qkv, out, lse, dout, second, opt);
    EXPECT_EQ(cuda::last_attention_path(), cuda::AttentionPath::cudnn);
    EXPECT_EQ(bytes_of(first), bytes_of(second)) << dtype_name(dt);
  }
}
// ---- end grouped-query attention ----
#endif  // MEGATRAIN_WITH_CUDA

}  // namespace
}  // namespace mt
