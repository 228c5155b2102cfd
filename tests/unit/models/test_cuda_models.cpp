// test_cuda_models.cpp: a training step on the GPU moves no more between host and device than it must: an
// optimizer step (core/optim) reads the device once, and a microbatch of the GPT model (models/) leaves its loss on
// the device. Each test skips where no GPU can run it; the ops themselves are checked by test_cuda_ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "core/optim/optimizer.h"
#include "core/tensor/ops.h"
#include "core/tensor/tensor.h"
#include "models/gpt.h"
#include "models/moe_mlp.h"
#include "tests/unit/gpu_test.h"
#include "tests/unit/op_test_util.h"
#include "tests/unit/tiny_models.h"
#if defined(MEGATRAIN_WITH_CUDA)
#include "core/cuda/runtime.h"
#endif

namespace mt {
namespace {

using namespace mt::test;  // Vec, rand_vec, make, values, CudaOps, str, rand_ids

// An optimizer step reads the device once (the grad norm and inf/NaN verdict together) and copies nothing
// from the host; a skipped step the same.
TEST_F(CudaOps, OptimizerStepReadsTheDeviceOnce) {
#if defined(MEGATRAIN_WITH_CUDA)
  std::vector<Parameter> params;
  for (int k = 0; k < 40; ++k) {
    Parameter p = make_parameter(str("w", k), {33, 17}, DType::bf16, Init::normal, 1.f, 3);
    p.value = p.value.to(Device::cuda);
    p.grad = make(rand_vec(33 * 17, 1200 + static_cast<uint32_t>(k)), {33, 17}).to(Device::cuda);
    p.weight_decay = k % 2 == 0;
    params.push_back(std::move(p));
  }
  std::vector<Parameter*> ptrs;
  for (Parameter& p : params) ptrs.push_back(&p);
  AdamW opt(ptrs, {.weight_decay = 0.1, .grad_clip = 1.0});
  cuda::synchronize();
  for (int step = 0; step < 2; ++step) {
    const cuda::HostCopyCounts before = cuda::host_copy_counts();
    const StepResult r = opt.step(1e-3, 1.0);
    const cuda::HostCopyCounts after = cuda::host_copy_counts();
    EXPECT_FALSE(r.found_inf);
    EXPECT_EQ(after.to_host - before.to_host, 1) << "step " << step;
    EXPECT_EQ(after.from_host - before.from_host, 0) << "step " << step;
  }
  params[7].grad.view({33 * 17}).slice(5, 6).copy_from(make({std::numeric_limits<double>::infinity()}, {1}));
  const cuda::HostCopyCounts before = cuda::host_copy_counts();
  EXPECT_TRUE(opt.step(1e-3, 1.0).found_inf);
  EXPECT_EQ(cuda::host_copy_counts().to_host - before.to_host, 1);
#endif
}

// A training microbatch (forward with the loss kept on the device, backward with the seed filled there)
// copies nothing between host and device once its tokens are there.
TEST_F(CudaOps, MicrobatchLeavesTheLossOnTheDevice) {
#if defined(MEGATRAIN_WITH_CUDA)
  ModelConfig cfg;
  cfg.num_layers = 2;
  cfg.hidden_size = 32;
  cfg.num_heads = 2;
  cfg.ffn_hidden_size = 64;
  cfg.seq_length = 16;
  cfg.max_position_embeddings = 16;
  cfg.vocab_size = 100;
  cfg.padded_vocab_size = 128;
  cfg.head_dim = 16;
  cfg.dropout = cfg.attention_dropout = 0.f;  // the training and the evaluation forward agree
  GptModel model(cfg, {.dtype = DType::bf16, .device = Device::cuda});
  std::vector<int32_t> ids = rand_ids(2 * 16, 1300, 0, 100), next = rand_ids(2 * 16, 1301, 0, 100);
  const Tensor tokens = Tensor::from_ints(ids, {2, 16}).to(Device::cuda);
  const Tensor targets = Tensor::from_ints(next, {2, 16}).to(Device::cuda);
  Tensor loss_sum = f64_zeros(1, Device::cuda);
  cuda::synchronize();
  const cuda::HostCopyCounts before = cuda::host_copy_counts();
  for (int mb = 0; mb < 2; ++mb) {
    model.forward_stage(Tensor(), tokens, targets, mb, {.sample_offset = 0, .training = true}, loss_sum);
    model.backward(mb, 0.5f);
  }
  const cuda::HostCopyCounts after = cuda::host_copy_counts();
  EXPECT_EQ(after.to_host - before.to_host, 0);
  EXPECT_EQ(after.from_host - before.from_host, 0);
  // The same value as the host reading of each microbatch's loss.
  float loss = 0;
  model.forward_stage(Tensor(), tokens, targets, 9, {.sample_offset = 0, .training = false}, &loss);
  EXPECT_NEAR(read_f64(loss_sum)[0], 2.0 * loss, 1e-5);
#endif
}

// max_i |got_i - want_i| / max_i |want_i|; infinite when the sizes differ or a value is not finite.
double rel_err(const Vec& got, const Vec& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

// The MoE MLP (models/moe_mlp.h) on the GPU follows the CPU: output, input gradient and every parameter's
// gradient, with GELU experts under a sigmoid router with an expert bias, and SwiGLU experts beside a shared expert
// with the auxiliary and z losses (all on the device).
TEST_F(CudaOps, MoeMlpMatchesTheCpu) {
  for (Arch arch : {Arch::gpt, Arch::llama}) {
    ModelConfig m = arch == Arch::llama ? testing_util::tiny_llama(2, false, 10000) : testing_util::tiny_gpt(true);
    m.moe.num_experts = 8;
    m.moe.top_k = 2;
    m.moe.ffn_hidden_size = 24;
    if (arch == Arch::llama) {  // a shared expert, the auxiliary and z losses
      m.moe.shared_expert_ffn_hidden_size = 16;
      m.moe.aux_loss_coeff = 0.1;
      m.moe.z_loss_coeff = 0.01;
    } else {  // a sigmoid router with DeepSeek-V3's expert bias
      m.moe.score_function = MoeScore::sigmoid;
      m.moe.bias_update_rate = 0.01;
    }
    MoeMlp cpu(m, "mlp", DType::f32, 0.1f, 5), gpu(m, "mlp", DType::f32, 0.1f, 5, Device::cuda);
    if (cpu.has_expert_bias()) {
      const std::vector<float> bias = {0.3f, 0, 0, -0.2f, 0, 0.1f, 0, 0};
      cpu.set_expert_bias(bias);
      gpu.set_expert_bias(bias);
    }
    const int64_t N = 37, C = m.hidden_size;
    const Tensor x = make(rand_vec(N * C, 1), {N, C}), dout = make(rand_vec(N * C, 2), {N, C});
    MoeMlp::Saved sc, sg;
    const Tensor oc = cpu.forward(x, sc, {.record = true}), og = gpu.forward(x.to(Device::cuda), sg, {.record = true});
    EXPECT_EQ(sg.counts, sc.counts) << "the same routing";
    const MoeLoad lc = cpu.take_load(), lg = gpu.take_load();
    EXPECT_EQ(lg.tokens, lc.tokens);
    EXPECT_NEAR(lg.aux, lc.aux, 1e-6 * std::max(1.0, std::abs(lc.aux)));
    EXPECT_NEAR(lg.z, lc.z, 1e-6 * std::max(1.0, std::abs(lc.z)));
    const Tensor dc = cpu.backward(dout, sc, {.dloss = 0.5f}),
                 dg = gpu.backward(dout.to(Device::cuda), sg, {.dloss = 0.5f});
    EXPECT_LE(rel_err(values(og), values(oc)), 1e-5) << "out, " << (arch == Arch::llama ? "llama" : "gpt");
    EXPECT_LE(rel_err(values(dg), values(dc)), 1e-5) << "dx";
    const auto pc = cpu.parameters(), pg = gpu.parameters();
    for (size_t i = 0; i < pc.size(); ++i)
      EXPECT_LE(rel_err(values(pg[i]->grad), values(pc[i]->grad)), 1e-5) << pc[i]->name;
  }
}

// Today's Hub attention on the GPU follows the CPU through a whole model: QK-norm (Qwen3's), a head width of its own
// (6 on a hidden size of 16 with 4 heads), llama3 and yarn rotary scaling: the loss and every parameter's gradient
// (the q and k norms' included).
TEST_F(CudaOps, QwenAttentionWithScaledRotaryMatchesTheCpu) {
#if defined(MEGATRAIN_WITH_CUDA)
  for (RopeScalingType type : {RopeScalingType::llama3, RopeScalingType::yarn}) {
    ModelConfig cfg = testing_util::tiny_llama(2, false, 5000);
    cfg.qk_norm = true;
    cfg.head_dim = 6;
    cfg.dropout = cfg.attention_dropout = 0.f;
    cfg.rope_scaling = {.type = type, .factor = 4, .original_max_position_embeddings = 4};
    GptModel cpu(cfg, {.dtype = DType::f32, .device = Device::cpu, .seed = 7}),
        gpu(cfg, {.dtype = DType::f32, .device = Device::cuda, .seed = 7});
    const int64_t B = 2, T = cfg.seq_length;
    const std::vector<int32_t> ids = rand_ids(B * T, 1400, 0, 40), next = rand_ids(B * T, 1401, 0, 40);
    const Tensor tokens = Tensor::from_ints(ids, {B, T}), targets = Tensor::from_ints(next, {B, T});
    float lc = 0, lg = 0;
    cpu.forward_stage(Tensor(), tokens, targets, 0, {.sample_offset = 0, .training = true}, &lc);
    gpu.forward_stage(Tensor(), tokens.to(Device::cuda), targets.to(Device::cuda), 0,
                      {.sample_offset = 0, .training = true}, &lg);
    EXPECT_NEAR(lg, lc, 1e-5 * std::abs(lc)) << name_of(type);
    cpu.backward(0, 1.f);
    gpu.backward(0, 1.f);
    const auto pc = cpu.parameters(), pg = gpu.parameters();
    ASSERT_EQ(pc.size(), pg.size());
    bool saw_qk_norm = false;
    for (size_t i = 0; i < pc.size(); ++i) {
      saw_qk_norm |= pc[i]->name.find("q_norm") != std::string::npos;
      EXPECT_LE(rel_err(values(pg[i]->grad), values(pc[i]->grad)), 1e-4) << pc[i]->name << ", " << name_of(type);
    }
    EXPECT_TRUE(saw_qk_norm);
  }
#endif
}

}  // namespace
}  // namespace mt
