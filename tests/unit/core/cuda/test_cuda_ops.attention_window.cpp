// test_cuda_ops.attention_window.cpp: sliding-window attention (AttentionOptions::window: query i sees keys
// [i - window + 1, i]) on the GPU against the CPU reference: the kernel in every dtype, with dropout, packed documents
// and grouped-query attention, across its row and key tiles; cuDNN's fused attention with its diagonal band (bf16 /
// fp16), which path runs and how often it is counted, and where auto falls back to the kernel. Without a GPU: the
// windowed cuDNN graphs pass the frontend's validate() for Hopper. The context-parallel blocks with a window are in
// test_cuda_ops.attention_window_context.cpp.
// One of the sources of test_cuda_ops (tests/CMakeLists.txt); the GPU tests skip where no GPU can run them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/base/rng.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "tests/unit/core/cuda/cuda_op_checks.h"
#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/attention_backend.h"
#include "core/cuda/attention_cudnn.h"
#endif

namespace mt {
namespace {

using namespace mt::test;  // NOLINT(google-build-using-namespace): Vec, rand_vec, Both, CudaOps, the checks

#if defined(MEGATRAIN_WITH_CUDA)

struct WindowCase {
  int64_t B, T, G, R, D;
  int64_t window;
  float dropout_p;
  bool packed;  // packed documents' positions as well: a row's keys are its window within its document
};

void PrintTo(const WindowCase& c, std::ostream* os) {
  *os << "window=" << c.window << " p=" << c.dropout_p << (c.packed ? " packed" : "") << " B=" << c.B << " T=" << c.T
      << " G=" << c.G << " R=" << c.R << " D=" << c.D;
}

std::string window_name(const WindowCase& c) {
  return str("Window", c.window, c.dropout_p > 0 ? "_Dropout" : "", c.packed ? "_Packed" : "", "_T", c.T, "_G", c.G,
             "_R", c.R, "_D", c.D);
}

struct WindowRun {
  Both qkv, dout, out, lse, dqkv;
};

// The windowed forward and backward of one case on both devices, the GPU under the current MEGATRAIN_ATTENTION,
// which must take `path` for both calls and count them there.
WindowRun run_window(const WindowCase& c, DType dt, uint32_t seed, cuda::AttentionPath path) {
  const int64_t B = c.B, T = c.T, G = c.G, R = c.R, D = c.D, H = G * R;
  // Documents shorter and longer than the windows, some of one token; B = 2 samples.
  const Both pos = c.packed ? document_positions({{3, 20, 1}, {9, 9}}, T) : Both{};
  WindowRun r{both(rand_vec(B * T * G * (R + 2) * D, seed, -2, 2), {B, T, G, R + 2, D}, dt),
              both(rand_vec(B * T * H * D, seed + 1), {B, T, H, D}, dt), poisoned({B, T, H, D}, dt),
              poisoned({B, H, T}, DType::f32), poisoned({B, T, G, R + 2, D}, dt)};
  const AttentionCalls before = attention_calls();
  for (auto d : kDevices) {
    const AttentionOptions opt{.causal = true,
                               .dropout_p = c.dropout_p,
                               .seed = 31,
                               .site = stream_id("layers.1.attn.probs"),
                               .sample_offset = 3,
                               .head_offset = 2,
                               .positions = c.packed ? pos.*d : Tensor{},
                               .window = c.window};
    attention_forward(r.qkv.*d, r.out.*d, r.lse.*d, opt);
    if (d == &Both::gpu) {
      EXPECT_EQ(cuda::last_attention_path(), path) << "forward";
    }
    attention_backward(r.qkv.*d, r.out.*d, r.lse.*d, r.dout.*d, r.dqkv.*d, opt);
    if (d == &Both::gpu) {
      EXPECT_EQ(cuda::last_attention_path(), path) << "backward";
    }
  }
  const AttentionCalls after = attention_calls();
  const bool fused = path == cuda::AttentionPath::cudnn;
  EXPECT_EQ(after.cpu - before.cpu, 2);
  EXPECT_EQ(after.cudnn - before.cudnn, fused ? 2 : 0);
  EXPECT_EQ(after.kernel - before.kernel, fused ? 0 : 2);
  return r;
}

void expect_window_match(const WindowRun& r, DType dt, const std::string& what) {
  expect_match(r.out, tol_for(dt), "windowed attention out" + what);
  expect_match(r.lse, tol_for(dt), "windowed attention lse" + what);
  expect_match(r.dqkv, tol_for(dt), "windowed attention dqkv" + what);
}

// ---- the kernel ----

class CudaWindowKernel : public CudaOps, public ::testing::WithParamInterface<WindowCase> {};

// Every dtype; dropout keyed as without a window (the CPU's masks); key tiles before a block's first key skipped in
// the forward and dq kernels, query tiles past the window skipped in the dk/dv kernel.
TEST_P(CudaWindowKernel, ForwardAndBackwardMatchCpu) {
  const AttentionModeScope mode("kernel");
  for (DType dt : kFloatTypes)
    expect_window_match(run_window(GetParam(), dt, 900, cuda::AttentionPath::kernel), dt, str(" ", dtype_name(dt)));
}

std::vector<WindowCase> kernel_cases() {
  std::vector<WindowCase> cases;
  for (int64_t w : {1, 5, 17})
    for (float p : {0.f, 0.1f})
      for (bool packed : {false, true}) cases.push_back({2, 40, 2, 2, 16, w, p, packed});
  // Several row tiles (16 rows at D <= 128, 8 at D = 256) and key tiles (32, 16) before the window.
  cases.push_back({2, 130, 1, 2, 64, 17, 0.f, false});
  cases.push_back({2, 130, 1, 2, 64, 5, 0.1f, true});
  cases.push_back({1, 70, 2, 1, 256, 5, 0.f, false});
  cases.push_back({1, 70, 2, 3, 128, 33, 0.1f, false});
  cases.push_back({2, 40, 2, 2, 16, 40, 0.f, false});  // a window of every key: the windowless attention
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaWindowKernel, ::testing::ValuesIn(kernel_cases()),
                         [](const auto& info) { return window_name(info.param); });

// The same inputs give the same gradient bits with a window too.
TEST_F(CudaOps, WindowKernelBackwardIsDeterministic) {
  const AttentionModeScope mode("kernel");
  const int64_t B = 2, T = 97, G = 2, R = 2, D = 64, H = G * R;
  const AttentionOptions opt{.causal = true, .dropout_p = 0.1f, .seed = 4, .site = 5, .window = 9};
  const Tensor qkv = make(rand_vec(B * T * G * (R + 2) * D, 910, -2, 2), {B, T, G, R + 2, D}).to(Device::cuda);
  const Tensor dout = make(rand_vec(B * T * H * D, 911), {B, T, H, D}).to(Device::cuda);
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

// ---- cuDNN's diagonal band ----

class CudnnWindow : public CudaOps, public ::testing::WithParamInterface<WindowCase> {
 protected:
  void SetUp() override {
    CudaOps::SetUp();
    if (IsSkipped()) return;
    if (!cuda::cudnn_built()) GTEST_SKIP() << "built without cuDNN: " << cuda::cudnn_version();
  }
};

// Forced onto cuDNN (a refusal would throw, not fall back): the band's left bound keeps keys j > i - window.
TEST_P(CudnnWindow, ForwardAndBackwardMatchCpu) {
  const AttentionModeScope mode("cudnn");
  for (DType dt : {DType::bf16, DType::f16})
    expect_window_match(run_window(GetParam(), dt, 920, cuda::AttentionPath::cudnn), dt,
                        str(" ", dtype_name(dt), " on cuDNN"));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnWindow,
                         ::testing::Values(WindowCase{2, 40, 2, 2, 64, 1, 0.f, false},
                                           WindowCase{2, 40, 2, 2, 64, 5, 0.f, false},
                                           WindowCase{2, 40, 2, 2, 64, 17, 0.f, false},
                                           WindowCase{1, 130, 2, 1, 128, 17, 0.f, false},
                                           WindowCase{2, 40, 2, 2, 64, 64, 0.f, false}),  // binds nothing
                         [](const auto& info) { return window_name(info.param); });

// Forcing either path on one windowed case: both match the CPU.
TEST_P(CudnnWindow, ForcedKernelAndForcedCudnnBothMatchCpu) {
  for (const auto& [mode_name, path] :
       {std::pair{"kernel", cuda::AttentionPath::kernel}, std::pair{"cudnn", cuda::AttentionPath::cudnn}}) {
    const AttentionModeScope mode(mode_name);
    expect_window_match(run_window(GetParam(), DType::bf16, 930, path), DType::bf16,
                        str(" bf16 MEGATRAIN_ATTENTION=", mode_name));
  }
}

// auto takes cuDNN for a windowed bf16 call, and the kernel where a window comes with what cuDNN's graphs lack
// (packed documents' positions, dropout); forcing cuDNN there fails loudly.
TEST_F(CudaOps, WindowAutoFallsBackToTheKernelWhereCudnnCannotRun) {
  if (!cuda::cudnn_built()) GTEST_SKIP() << "built without cuDNN: " << cuda::cudnn_version();
  {
    const AttentionModeScope mode("auto");
    run_window({2, 40, 2, 2, 64, 5, 0.f, false}, DType::bf16, 940, cuda::AttentionPath::cudnn);
    expect_window_match(run_window({2, 40, 2, 2, 64, 5, 0.f, true}, DType::bf16, 941, cuda::AttentionPath::kernel),
                        DType::bf16, " packed, auto");
    expect_window_match(run_window({2, 40, 2, 2, 64, 5, 0.1f, false}, DType::bf16, 942, cuda::AttentionPath::kernel),
                        DType::bf16, " dropout, auto");
  }
  {
    const AttentionModeScope mode("cudnn");
    const int64_t B = 2, T = 40, G = 2, R = 2, D = 64, H = G * R;
    const Both pos = document_positions({{3, 20}, {9}}, T);
    const Tensor qkv = make(rand_vec(B * T * G * (R + 2) * D, 943), {B, T, G, R + 2, D}, DType::bf16).to(Device::cuda);
    Tensor out = Tensor::empty({B, T, H, D}, DType::bf16, Device::cuda);
    Tensor lse = Tensor::empty({B, H, T}, DType::f32, Device::cuda);
    EXPECT_THROW(attention_forward(qkv, out, lse, {.causal = true, .positions = pos.gpu, .window = 5}),
                 std::runtime_error);
  }
}

// ---- the windowed graphs, without a GPU ----

// Every windowed graph the calls build passes the frontend's validate() for Hopper (sm_90): the whole sequence's
// forward and backward (grouped-query and GPT's layout) and a ring's own block with a band.
TEST(CudnnWindowGraphs, ValidateForHopper) {
  if (!cuda::cudnn_built()) GTEST_SKIP() << "built without cuDNN: " << cuda::cudnn_version();
  for (bool backward : {false, true})
    for (DType dtype : {DType::bf16, DType::f16})
      for (int64_t window : {1, 5, 17, 4095})
        for (auto [G, R, D] : {std::tuple<int64_t, int64_t, int64_t>{2, 2, 64}, {4, 1, 128}}) {
          const cuda::CudnnSdpaGraph g{
              .backward = backward, .dtype = dtype, .B = 2, .T = 4096, .G = G, .R = R, .D = D, .window = window};
          EXPECT_EQ(cuda::cudnn_attention_validate(g, 90), "") << window;
          cuda::CudnnSdpaGraph block = g;
          block.T = block.q_rows = block.Tk = block.k_rows = 64;
          block.window = std::min<int64_t>(window, 63);
          EXPECT_EQ(cuda::cudnn_attention_validate(block, 90), "") << "ring block, window " << block.window;
        }
  // The band reaches validate(): the frontend refuses a sliding window over more query rows than key rows.
  const cuda::CudnnSdpaGraph wide{.dtype = DType::bf16,
                                  .B = 1,
                                  .T = 64,
                                  .G = 2,
                                  .R = 1,
                                  .D = 64,
                                  .q_rows = 64,
                                  .Tk = 64,
                                  .k_rows = 32,
                                  .window = 5};
  const std::string why = cuda::cudnn_attention_validate(wide, 90);
  EXPECT_NE(why.find("window 5"), std::string::npos) << why;
  EXPECT_NE(why.find("validate (sm_90)"), std::string::npos) << why;
}

#endif  // MEGATRAIN_WITH_CUDA

}  // namespace
}  // namespace mt
