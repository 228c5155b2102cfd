// Tests of the training pieces above the ops: loss scaler, LR schedule, model wiring (whole-model
// gradients against finite differences) and the optimizer's skip/clip behaviour; recomputation in
// test_training.recompute.cpp.
#include <algorithm>
#include <cmath>
#include <map>

#include <gtest/gtest.h>

#include "core/optim/loss_scaler.h"
#include "core/optim/lr_schedule.h"
#include "core/optim/optimizer.h"
#include "core/base/rng.h"
#include "models/gpt.h"
#include "tests/unit/tiny_models.h"

namespace mt {
namespace {

ModelConfig tiny_model(bool tie = true) { return testing_util::tiny_gpt(tie); }

// A tiny Llama: 4 query heads of 4 sharing 2 key/value heads; a small rotary base (100) turns every pair
// noticeably over the short sequences.
ModelConfig tiny_llama(bool tie = false) { return testing_util::tiny_llama(2, tie, 100); }

using testing_util::fill_batch;

TEST(LossScaler, BacksOffAfterHysteresisThenGrowsAfterWindow) {
  LossScaler s(true, {.initial = 1024, .min = 1, .window = 3, .hysteresis = 2});
  s.update(true);  // first overflow is absorbed by hysteresis
  EXPECT_EQ(s.scale(), 1024);
  s.update(true);
  EXPECT_EQ(s.scale(), 512);
  s.update(true);  // hysteresis stays spent until the scale grows again
  EXPECT_EQ(s.scale(), 256);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 256);
  s.update(false);
  EXPECT_EQ(s.scale(), 512);
  s.update(true);  // hysteresis restored by the growth
  EXPECT_EQ(s.scale(), 512);
}

TEST(LossScaler, NeverBelowMinAndStaticScaleIsOne) {
  LossScaler s(true, {.initial = 4, .min = 2, .window = 10, .hysteresis = 1});
  for (int i = 0; i < 5; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 2);
  LossScaler off(false, {});
  off.update(true);
  EXPECT_EQ(off.scale(), 1);
}

TEST(LrSchedule, WarmupThenCosineToMin) {
  LrSchedule s{.lr = 1.0, .min_lr = 0.1, .warmup_iters = 10, .decay_iters = 110, .decay = LrDecay::cosine};
  EXPECT_DOUBLE_EQ(s.at(1), 0.1);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // halfway through the decay
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);
  LrSchedule lin{.lr = 1.0, .min_lr = 0.0, .warmup_iters = 0, .decay_iters = 100, .decay = LrDecay::linear};
  EXPECT_NEAR(lin.at(25), 0.75, 1e-12);
  LrSchedule c{.lr = 0.5, .min_lr = 0.0, .warmup_iters = 0, .decay_iters = 100, .decay = LrDecay::constant};
  EXPECT_DOUBLE_EQ(c.at(99), 0.5);
}

TEST(LrSchedule, WarmupStableDecayHoldsThePeakThenAnnealsInItsShape) {
  // Warmup 10, then the peak until the anneal of 0.2 * 110 = 22 steps starts at step 88.
  LrSchedule s{.lr = 1.0, .min_lr = 0.1, .warmup_iters = 10, .decay_iters = 110, .decay = LrDecay::wsd};
  for (WsdShape shape : {WsdShape::linear, WsdShape::cosine, WsdShape::exponential, WsdShape::one_minus_sqrt}) {
    s.wsd_decay_style = shape;
    SCOPED_TRACE(std::string(name_of(shape)));
    EXPECT_DOUBLE_EQ(s.at(5), 0.5);  // warmup
    EXPECT_DOUBLE_EQ(s.at(10), 1.0);
    EXPECT_DOUBLE_EQ(s.at(50), 1.0);  // stable
    EXPECT_DOUBLE_EQ(s.at(88), 1.0);
    EXPECT_LT(s.at(89), 1.0);
    EXPECT_GT(s.at(109), 0.1);
    EXPECT_DOUBLE_EQ(s.at(110), 0.1);
    EXPECT_DOUBLE_EQ(s.at(1000), 0.1);
  }
  // Halfway through the anneal (step 99): the gap's share left is 1 - r, (cos(pi r) + 1) / 2, 2 * 0.5^r - 1
  // or 1 - sqrt(r) at r = 0.5.
  auto at99 = [&](WsdShape shape) {
    s.wsd_decay_style = shape;
    return s.at(99);
  };
  EXPECT_NEAR(at99(WsdShape::linear), 0.55, 1e-12);
  EXPECT_NEAR(at99(WsdShape::cosine), 0.55, 1e-12);
  EXPECT_NEAR(at99(WsdShape::exponential), 0.1 + 0.9 * (std::sqrt(2.0) - 1.0), 1e-12);     // 0.4728
  EXPECT_NEAR(at99(WsdShape::one_minus_sqrt), 0.1 + 0.9 * (1.0 - std::sqrt(0.5)), 1e-12);  // 0.3636
  // A quarter of 100 steps anneals linearly from step 75.
  LrSchedule q{.lr = 1.0,
               .min_lr = 0.0,
               .warmup_iters = 0,
               .decay_iters = 100,
               .decay = LrDecay::wsd,
               .wsd_decay_fraction = 0.25,
               .wsd_decay_style = WsdShape::linear};
  EXPECT_DOUBLE_EQ(q.at(75), 1.0);
  EXPECT_NEAR(q.at(80), 0.8, 1e-12);
  EXPECT_NEAR(q.at(95), 0.2, 1e-12);
}

TEST(LrSchedule, InverseSquareRootAfterWarmupFlooredAtMinLr) {
  LrSchedule s{.lr = 1.0, .min_lr = 0.1, .warmup_iters = 4, .decay_iters = 1000, .decay = LrDecay::inverse_square_root};
  EXPECT_DOUBLE_EQ(s.at(2), 0.5);   // warmup
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);   // peak: sqrt(4) / sqrt(4)
  EXPECT_DOUBLE_EQ(s.at(16), 0.5);  // sqrt(4) / sqrt(16)
  EXPECT_DOUBLE_EQ(s.at(100), 0.2);
  EXPECT_DOUBLE_EQ(s.at(400), 0.1);
  EXPECT_DOUBLE_EQ(s.at(900), 0.1);   // 2/30 floored at min_lr
  EXPECT_DOUBLE_EQ(s.at(1001), 0.1);  // past decay_iters, as Megatron
  // No warmup: Megatron takes max(warmup, 1), so step 1 is the peak.
  LrSchedule n{.lr = 1.0, .min_lr = 0.0, .warmup_iters = 0, .decay_iters = 1000, .decay = LrDecay::inverse_square_root};
  EXPECT_DOUBLE_EQ(n.at(1), 1.0);
  EXPECT_DOUBLE_EQ(n.at(4), 0.5);
  EXPECT_DOUBLE_EQ(n.at(1000), 1.0 / std::sqrt(1000.0));
}

TEST(ModelFlops, MatchesMegatronFormula) {
  ModelConfig m = tiny_model();
  m.num_layers = 24, m.hidden_size = 2048, m.ffn_hidden_size = 8192, m.seq_length = 2048;
  m.padded_vocab_size = 50304, m.head_dim = 2048 / m.num_heads;
  const double B = 1, s = 2048, h = 2048, l = 24, V = 50304;
  // Megatron: 72 B s l h^2 (1 + s/(6h) + V/(12 h l)) with causal attention halved: s/(12h).
  double megatron = 72 * B * s * l * h * h * (1 + s / (12 * h) + V / (12 * h * l));
  EXPECT_NEAR(model_flops_per_iteration(m, 2048) / megatron, 1.0, 1e-12);
}

// Qwen3-0.6B's attention is wider than its hidden size (16 heads of 128 on 1024): Q, K, V and the output projection
// and the attention itself count the heads' width, not the hidden size.
TEST(ModelFlops, QwenCountsTheHeadsWidth) {
  ModelConfig m = tiny_llama();
  m.num_layers = 28, m.hidden_size = 1024, m.num_heads = 16, m.num_query_groups = 8, m.head_dim = 128;
  m.ffn_hidden_size = 3072, m.padded_vocab_size = 151936, m.seq_length = 4096;
  const double linear = 1024.0 * 2048 + 2 * 1024.0 * 1024 + 2048.0 * 1024 + 3 * 1024.0 * 3072;
  const double attention = 2 * (4096.0 / 2) * 2048;
  const double forward_flops = 2 * (28 * (linear + attention) + 1024.0 * 151936);
  EXPECT_NEAR(model_flops_per_iteration(m, 4096) / (3 * forward_flops * 4096), 1.0, 1e-12);
}

// A sliding window W < S: query i sees min(i + 1, W) keys, about W - W^2 / (2S) on average against causal's S / 2;
// the full-attention layers (model.full_attention_layers) keep causal's count.
TEST(ModelFlops, SlidingWindowLayersCountTheirBand) {
  ModelConfig m = tiny_llama();
  m.num_layers = 4, m.hidden_size = 1024, m.num_heads = 8, m.num_query_groups = 8, m.head_dim = 128;
  m.ffn_hidden_size = 2048, m.padded_vocab_size = 1024, m.seq_length = 4096;
  const double base = model_flops_per_iteration(m, 4096);
  m.sliding_window = 1024;
  const double windowed = model_flops_per_iteration(m, 4096);
  m.full_attention_layers = 1;
  const double spared = model_flops_per_iteration(m, 4096);
  // Causal attention per token and layer, forward: 2 S Q; the band's 4 (W - W^2 / (2S)) Q. Three passes.
  const double Q = 1024, causal = 2 * 4096.0 * Q, band = 4 * (1024 - 1024.0 * 1024 / (2 * 4096)) * Q;
  EXPECT_NEAR((base - windowed) / (3 * 4096 * 4 * (causal - band)), 1.0, 1e-12);
  EXPECT_NEAR((spared - windowed) / (3 * 4096 * (causal - band)), 1.0, 1e-12);
  m.sliding_window = 4096;  // a window as long as the sequence is causal attention
  EXPECT_EQ(model_flops_per_iteration(m, 4096), base);
}

TEST(ModelFlops, LlamaCountsSwiGluAndGroupedQueryAttention) {
  ModelConfig m = tiny_llama();
  // Llama 3 8B: 32 layers, hidden 4096, 32 heads of 128 in 8 key/value groups, SwiGLU 14336, vocabulary
  // 128256, sequence 8192.
  m.num_layers = 32, m.hidden_size = 4096, m.num_heads = 32, m.num_query_groups = 8, m.head_dim = 128;
  m.ffn_hidden_size = 14336, m.padded_vocab_size = 128256, m.seq_length = 8192;
  // Multiply-adds per token, by hand: q 4096x4096, k and v 4096x1024 each, o 4096x4096, gate and up
  // 4096x14336 each, down 14336x4096; causal attention: scores and weighted values over on average half of
  // the 8192 keys, 32 heads x 128 = 4096 wide each; the logits 4096x128256.
  const double linear = 4096.0 * 4096 + 2 * 4096.0 * 1024 + 4096.0 * 4096 + 3 * 4096.0 * 14336;
  const double attention = 2 * (8192.0 / 2) * 4096;
  const double logits = 4096.0 * 128256;
  const double forward_flops = 2 * (32 * (linear + attention) + logits);  // 2 flops per multiply-add
  const double tokens = 512.0 * 8192;
  EXPECT_NEAR(model_flops_per_iteration(m, 512 * 8192) / (3 * forward_flops * tokens), 1.0, 1e-12);
  // 51.47 GFLOP per token: 6.8% above 6N for its N = 8.03B parameters (attention adds, the embedding
  // lookup costs nothing).
  EXPECT_NEAR(model_flops_per_iteration(m, 1) / 1e9, 51.4704, 1e-4);
  EXPECT_NEAR(model_flops_per_iteration(m, 1) / (6 * 8030261248.0), 1.0683, 1e-4);
}

TEST(ModelFlops, MoeLayersCountTheActiveExpertsSharedExpertAndRouter) {
  ModelConfig m = tiny_llama();
  // Mixtral 8x7B: Llama's shape with 32 layers, hidden 4096, 32 heads in 8 key/value groups, vocabulary 32000,
  // every layer 8 SwiGLU experts of 14336, 2 per token; sequence 4096.
  m.num_layers = 32, m.hidden_size = 4096, m.num_heads = 32, m.num_query_groups = 8, m.head_dim = 128;
  m.ffn_hidden_size = 14336, m.padded_vocab_size = 32000, m.seq_length = 4096;
  m.moe = MoeConfig{.num_experts = 8, .top_k = 2, .ffn_hidden_size = 14336};
  const double attention_linear = 4096.0 * 4096 + 2 * 4096.0 * 1024 + 4096.0 * 4096;
  const double experts = 2 * 3 * 4096.0 * 14336, router = 4096.0 * 8;
  const double forward = 2 * (32 * (attention_linear + experts + router + 2 * (4096.0 / 2) * 4096) + 4096.0 * 32000);
  EXPECT_NEAR(model_flops_per_iteration(m, 1) / (3 * forward), 1.0, 1e-12);
  // 79.7 GFLOP per token: 3.1% above 6N for its N = 12.88B active parameters (of 46.7B; attention over 4096
  // positions adds, the embedding lookup costs nothing).
  EXPECT_NEAR(model_flops_per_iteration(m, 1) / (6 * 12.88e9), 1.0315, 1e-3);

  // Every other layer MoE (layer_freq 2: layers 0, 2, ...), fine-grained experts of 1408, 4 per token and a
  // shared expert of 5632 (Qwen2-MoE's shape of expert); the dense layers keep the model's MLP.
  m.moe = MoeConfig{
      .num_experts = 60, .top_k = 4, .layer_freq = 2, .ffn_hidden_size = 1408, .shared_expert_ffn_hidden_size = 5632};
  const double dense_mlp = 3 * 4096.0 * 14336;
  const double moe_mlp = 4 * 3 * 4096.0 * 1408 + 3 * 4096.0 * 5632 + 4096.0 * 60;
  const double forward2 =
      2 * (32 * (attention_linear + 2 * (4096.0 / 2) * 4096) + 16 * dense_mlp + 16 * moe_mlp + 4096.0 * 32000);
  EXPECT_NEAR(model_flops_per_iteration(m, 7) / (3 * forward2 * 7), 1.0, 1e-12);
  m.moe.layer_pattern.assign(32, 0);
  m.moe.layer_pattern[5] = 1;  // one MoE layer
  const double forward3 =
      2 * (32 * (attention_linear + 2 * (4096.0 / 2) * 4096) + 31 * dense_mlp + moe_mlp + 4096.0 * 32000);
  EXPECT_NEAR(model_flops_per_iteration(m, 1) / (3 * forward3), 1.0, 1e-12);
  EXPECT_TRUE(m.moe.is_moe_layer(5));
  EXPECT_FALSE(m.moe.is_moe_layer(4));
}

// The whole model's gradients (embedding, every layer, final norm, head) against central differences.
void check_model_gradients(ModelConfig cfg) {
  GptModel model(cfg, {.dtype = DType::f32, .seed = 7});
  Tensor tokens = Tensor::empty({2, 8}, DType::i32), targets = Tensor::empty({2, 8}, DType::i32);
  fill_batch(tokens, targets, cfg.vocab_size);
  StepContext ctx{.training = true, .seed = 7};
  model.forward(tokens, targets, 0, ctx);
  model.backward(0, 1.f);
  StepContext eval{.training = false, .seed = 7};
  for (Parameter* p : model.parameters()) {
    double num = 0, den = 0;
    float* v = p->value.data<float>();
    for (int64_t k = 0; k < 6; ++k) {
      int64_t i = (k * 7919 + 13) % p->value.numel();
      if (p->name.find("word_embeddings") != std::string::npos) i = (k % 5) * cfg.hidden_size + k;  // used rows
      const float orig = v[i], eps = 1e-2f;
      v[i] = orig + eps;
      double up = model.forward(tokens, targets, 1, eval);
      v[i] = orig - eps;
      double down = model.forward(tokens, targets, 1, eval);
      v[i] = orig;
      double fd = (up - down) / (2.0 * eps);
      double g = p->grad.data<float>()[i];
      num += (fd - g) * (fd - g);
      den += g * g + 1e-12;
    }
    // fp32 losses differenced at eps 1e-2 carry ~1e-5 absolute noise; gradients here are ~1e-2..1.
    EXPECT_LT(std::sqrt(num), 2e-2 * std::sqrt(den) + 2e-4) << p->name;
  }
}

TEST(GptModel, GradientsMatchFiniteDifferencesTied) { check_model_gradients(tiny_model(true)); }
TEST(GptModel, GradientsMatchFiniteDifferencesUntied) { check_model_gradients(tiny_model(false)); }
TEST(LlamaModel, GradientsMatchFiniteDifferences) { check_model_gradients(tiny_llama()); }
TEST(LlamaModel, GradientsMatchFiniteDifferencesMultiQueryTied) {
  ModelConfig cfg = tiny_llama(true);
  cfg.num_query_groups = 1;
  check_model_gradients(cfg);
}

TEST(LlamaModel, HasNoBiasesNoPositionTableAndGroupedProjections) {
  ModelConfig cfg = tiny_llama();
  GptModel model(cfg, {.dtype = DType::f32, .seed = 7});
  std::map<std::string, Shape> shapes;
  for (const Parameter* p : model.parameters()) shapes[p->name] = p->global_shape;
  for (const auto& [name, shape] : shapes) EXPECT_EQ(name.find("bias"), std::string::npos) << name;
  EXPECT_EQ(shapes.count("embedding.position_embeddings.weight"), 0u);
  EXPECT_EQ(shapes.at("layers.0.attn.qkv.weight"), (Shape{(4 + 2 * 2) * 4, 16}));  // (H + 2G) D x C
  EXPECT_EQ(shapes.at("layers.0.attn.proj.weight"), (Shape{16, 16}));
  EXPECT_EQ(shapes.at("layers.0.mlp.fc1.weight"), (Shape{2 * 24, 16}));  // gate and up
  EXPECT_EQ(shapes.at("layers.0.mlp.fc2.weight"), (Shape{16, 24}));
  EXPECT_EQ(shapes.at("layers.0.ln1.weight"), (Shape{16}));
  EXPECT_EQ(shapes.at("lm_head.weight"), (Shape{128, 16}));
  const int64_t per_layer = 32 * 16 + 16 * 16 + 48 * 16 + 16 * 24 + 2 * 16;
  EXPECT_EQ(model.num_parameters(), 2 * per_layer + 2 * 128 * 16 + 16);
}

TEST(GptModel, InitialWeightsDependOnlyOnSeedAndName) {
  ModelConfig cfg = tiny_model();
  GptModel a(cfg, {.seed = 5}), b(cfg, {.seed = 5}), c(cfg, {.seed = 6});
  EXPECT_EQ(a.parameters()[4]->value.to_floats(), b.parameters()[4]->value.to_floats());
  EXPECT_NE(a.parameters()[4]->value.to_floats(), c.parameters()[4]->value.to_floats());
  // A slice drawn on its own equals the same region of the whole tensor (how TP ranks will init).
  const Parameter& w = *a.parameters()[4];  // layers.0.attn.qkv.weight (48, 16)
  Parameter half = w;
  half.start = {24, 0};
  Tensor region = Tensor::empty({24, 16}, DType::f32);
  initial_values(half, 5, region);
  auto whole = w.value.to_floats();
  auto part = region.to_floats();
  for (size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], whole[24 * 16 + i]);
}

// Tensors of millions of elements are drawn by several threads: the values must not depend on that (a
// column block of a 3M-element tensor, drawn in pieces, equals the same region drawn one element at a time).
TEST(GptModel, LargeTensorsDrawTheSameValuesWhateverTheThreads) {
  Parameter w;
  w.name = "layers.0.mlp.fc1.weight";
  w.init = Init::normal;
  w.init_std = 0.02f;
  w.global_shape = {2048, 1536};
  w.start = {0, 512};
  Tensor block = Tensor::empty({2048, 1024}, DType::f32);  // 2M elements: more than one thread's share
  initial_values(w, 7, block);
  const float* v = block.data<float>();
  for (int64_t i : {int64_t{0}, int64_t{1023}, int64_t{1024}, int64_t{1} << 20, (int64_t{1} << 21) - 1}) {
    const int64_t row = i / 1024, col = 512 + i % 1024;
    const double want = normal_at(7, stream_id(w.name), static_cast<uint64_t>(row * 1536 + col)) * w.init_std;
    ASSERT_EQ(v[i], static_cast<float>(want)) << i;
  }
}

TEST(GptModel, VocabularyPaddingIsNotPartOfTheSoftmax) {
  ModelConfig cfg = tiny_model();
  GptModel model(cfg, {.dtype = DType::f32, .seed = 9});
  Tensor tokens = Tensor::empty({2, 8}, DType::i32), targets = Tensor::empty({2, 8}, DType::i32);
  fill_batch(tokens, targets, cfg.vocab_size);
  StepContext eval{.training = false};
  const float before = model.forward(tokens, targets, 0, eval);
  Parameter& wte = *model.parameters()[0];
  float* w = wte.value.data<float>();
  for (int64_t i = cfg.vocab_size * cfg.hidden_size; i < wte.value.numel(); ++i) w[i] = 100.f;  // padding rows
  EXPECT_EQ(model.forward(tokens, targets, 0, eval), before);
  model.forward(tokens, targets, 1, StepContext{.training = true});
  model.backward(1, 1.f);
  auto g = wte.grad.to_floats();
  for (size_t i = cfg.vocab_size * cfg.hidden_size; i < g.size(); ++i) ASSERT_EQ(g[i], 0.f) << i;
}

TEST(GptModel, ScaledInitForOutputProjections) {
  ModelConfig cfg = tiny_model();
  cfg.hidden_size = 64, cfg.ffn_hidden_size = 256, cfg.head_dim = 32, cfg.num_layers = 8;
  GptModel m(cfg, {.seed = 1});
  auto stddev = [](const Parameter& p) {
    double s = 0;
    for (float v : p.value.to_floats()) s += double(v) * v;
    return std::sqrt(s / p.value.numel());
  };
  for (Parameter* p : m.parameters()) {
    if (p->name == "layers.0.attn.qkv.weight") {
      EXPECT_NEAR(stddev(*p), 0.02, 0.002);
    }
    if (p->name == "layers.0.mlp.fc2.weight") {
      EXPECT_NEAR(stddev(*p), 0.02 / std::sqrt(16.0), 0.0005);
    }
  }
}

TEST(AdamW, SkipsOnInfAndClipsToGlobalNorm) {
  Parameter p = make_parameter("w", {4, 4}, DType::f32, Init::normal, 1.f, 1);
  AdamW opt({&p}, {.weight_decay = 0.0, .grad_clip = 1.0});
  auto before = p.value.to_floats();
  p.grad.data<float>()[3] = INFINITY;
  StepResult r = opt.step(0.1, 1.0);
  EXPECT_TRUE(r.found_inf);
  EXPECT_EQ(p.value.to_floats(), before);
  EXPECT_EQ(opt.steps(), 0);
  opt.zero_grads();
  for (int i = 0; i < 16; ++i) p.grad.data<float>()[i] = 3.f * 1024.f;  // norm 12 at loss scale 1024
  r = opt.step(0.1, 1024.0);
  EXPECT_FALSE(r.found_inf);
  EXPECT_NEAR(r.grad_norm, 12.0, 1e-9);
  EXPECT_EQ(opt.steps(), 1);
  // First Adam step moves every weight by ~lr whatever the gradient's size.
  auto after = p.value.to_floats();
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(before[i] - after[i], 0.1, 1e-5);
}

TEST(AdamW, Bf16ValuesAreCastFromFp32Master) {
  Parameter p = make_parameter("w", {8}, DType::bf16, Init::normal, 1.f, 2);
  AdamW opt({&p}, {.weight_decay = 0.0, .grad_clip = 0.0});
  for (int i = 0; i < 8; ++i) p.grad.data<float>()[i] = 1.f;
  opt.step(1e-3, 1.0);
  auto master = opt.slots()[0].master.to_floats();
  auto value = p.value.to_floats();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(value[i], round_to(DType::bf16, master[i]));
}

// AdamW::step (one grad_stats pass, one multi-tensor update) equals the per-parameter reference bit for bit:
// sum_squares, the verdict, then adamw_step and a cast per parameter, over several clipped steps, with and
// without weight decay and with replicas left out of the norm.
TEST(AdamW, FusedStepEqualsPerParameterReference) {
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<Parameter> ps, ref;
    for (int k = 0; k < 5; ++k) {
      Parameter p = make_parameter("w" + std::to_string(k), {3 + k, 5}, dt, Init::normal, 1.f, 10 + k);
      p.weight_decay = k != 2;
      p.tensor_parallel = k == 4;
      ps.push_back(p);
      Parameter q = make_parameter("w" + std::to_string(k), {3 + k, 5}, dt, Init::normal, 1.f, 10 + k);
      q.weight_decay = p.weight_decay;
      q.tensor_parallel = p.tensor_parallel;
      ref.push_back(q);
    }
    std::vector<Parameter*> ptrs;
    for (Parameter& p : ps) ptrs.push_back(&p);
    const AdamWConfig cfg{.beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1, .grad_clip = 0.5, .count_replicas = false};
    AdamW opt(ptrs, cfg);
    std::vector<Tensor> master, m, v;
    for (Parameter& q : ref) {
      master.push_back(Tensor::empty(q.value.shape(), DType::f32));
      master.back().copy_from(q.value);
      m.push_back(Tensor::zeros(q.value.shape(), DType::f32));
      v.push_back(Tensor::zeros(q.value.shape(), DType::f32));
    }
    for (int step = 1; step <= 4; ++step) {
      const double scale = 8.0;
      for (size_t k = 0; k < ps.size(); ++k)
        for (int64_t i = 0; i < ps[k].grad.numel(); ++i)
          ps[k].grad.data<float>()[i] = ref[k].grad.data<float>()[i] =
              static_cast<float>(scale * std::sin(0.37 * static_cast<double>(i + 13 * k + 101 * step)));
      const StepResult r = opt.step(1e-2, scale);
      // The reference: norm over the counted gradients, then one update per parameter.
      std::vector<Tensor> counted;
      for (Parameter& q : ref)
        if (q.tensor_parallel) counted.push_back(q.grad);
      const double norm = std::sqrt(sum_squares(counted)) / scale;
      EXPECT_EQ(r.grad_norm, norm);
      EXPECT_FALSE(r.found_inf);
      const double grad_scale = clip_coefficient(norm, cfg.grad_clip) / scale;
      for (size_t k = 0; k < ref.size(); ++k) {
        AdamWOptions o = adamw_options(cfg, 1e-2, step, grad_scale);
        if (!ref[k].weight_decay) o.weight_decay = 0.f;
        adamw_step(master[k], ref[k].grad, m[k], v[k], o);
        ref[k].value.copy_from(master[k]);
        const std::string what = std::string(dtype_name(dt)) + " " + ref[k].name + " step " + std::to_string(step);
        EXPECT_EQ(ps[k].value.to_floats(), ref[k].value.to_floats()) << what;
        EXPECT_EQ(opt.slots()[k].master.to_floats(), master[k].to_floats()) << what;
        EXPECT_EQ(opt.slots()[k].exp_avg_sq.to_floats(), v[k].to_floats()) << what;
      }
    }
  }
}

// The loss kept on the device (a training step's form) is the value of the host reading, microbatch by
// microbatch.
TEST(GptModel, AccumulatedLossEqualsTheHostReading) {
  ModelConfig cfg = tiny_model();
  cfg.dropout = 0.1f;
  GptModel model(cfg, {.dtype = DType::f32, .seed = 5});
  Tensor tokens = Tensor::empty({2, 8}, DType::i32), targets = Tensor::empty({2, 8}, DType::i32);
  fill_batch(tokens, targets, cfg.vocab_size);
  Tensor sum = f64_zeros(1, Device::cpu);
  double want = 0;
  for (int mb = 0; mb < 3; ++mb) {
    const StepContext ctx{.sample_offset = 2 * mb, .training = true, .seed = 7};
    float loss = 0;
    model.forward_stage(Tensor(), tokens, targets, 10 + mb, ctx, &loss);
    want += loss;
    model.forward_stage(Tensor(), tokens, targets, mb, ctx, sum);
    model.backward(mb, 1.f);
    model.backward(10 + mb, 1.f);
  }
  EXPECT_EQ(read_f64(sum)[0], want);
}

// Loss masks (supervised fine-tuning): StepContext::loss_weights give each target its weight in the mean. Weights
// 1/T on sample 0 and 0 on sample 1 of a (2, T) batch are the mean loss of sample 0 alone, with its gradients (a
// masked sample adds nothing); weights 1/(B*T) everywhere are the plain mean.
TEST(GptModel, MaskedLossIsTheMeanOverTheCountedTargets) {
  for (const ModelConfig& cfg : {tiny_model(), tiny_llama()}) {
    const int64_t T = 8;
    Tensor tokens = Tensor::empty({2, T}, DType::i32), targets = Tensor::empty({2, T}, DType::i32);
    fill_batch(tokens, targets, cfg.vocab_size);
    Tensor tokens0 = Tensor::empty({1, T}, DType::i32), targets0 = Tensor::empty({1, T}, DType::i32);
    tokens0.copy_from(tokens.slice(0, 1));
    targets0.copy_from(targets.slice(0, 1));

    GptModel masked(cfg, {.dtype = DType::f32, .seed = 3}), alone(cfg, {.dtype = DType::f32, .seed = 3}),
        ones(cfg, {.dtype = DType::f32, .seed = 3}), plain(cfg, {.dtype = DType::f32, .seed = 3});
    StepContext ctx{.training = true, .seed = 7};
    ctx.loss_weights = Tensor::zeros({2 * T}, DType::f32);
    for (int64_t i = 0; i < T; ++i) ctx.loss_weights.data<float>()[i] = 1.f / T;
    const float lm = masked.forward(tokens, targets, 0, ctx);
    const float la = alone.forward(tokens0, targets0, 0, {.training = true, .seed = 7});
    EXPECT_NEAR(lm, la, 1e-6 * std::abs(la));
    masked.backward(0, 1.f);
    alone.backward(0, 1.f);

    StepContext all{.training = true, .seed = 7};
    all.loss_weights = Tensor::empty({2 * T}, DType::f32);
    for (int64_t i = 0; i < 2 * T; ++i) all.loss_weights.data<float>()[i] = 1.f / (2 * T);
    const float lo = ones.forward(tokens, targets, 0, all);
    const float lp = plain.forward(tokens, targets, 0, {.training = true, .seed = 7});
    EXPECT_NEAR(lo, lp, 1e-6 * std::abs(lp));
    EXPECT_GT(std::abs(lp - la), 1e-4);  // the two cases differ: the weights choose what counts
    ones.backward(0, 1.f);
    plain.backward(0, 1.f);

    const auto pm = masked.parameters(), pa = alone.parameters(), po = ones.parameters(), pp = plain.parameters();
    for (size_t k = 0; k < pm.size(); ++k) {
      const std::vector<float> gm = pm[k]->grad.to_floats(), ga = pa[k]->grad.to_floats(), go = po[k]->grad.to_floats(),
                               gp = pp[k]->grad.to_floats();
      for (size_t i = 0; i < gm.size(); ++i) {
        EXPECT_NEAR(gm[i], ga[i], 1e-6f + 1e-5f * std::abs(ga[i])) << pm[k]->name << "[" << i << "]";
        EXPECT_NEAR(go[i], gp[i], 1e-6f + 1e-5f * std::abs(gp[i])) << po[k]->name << "[" << i << "]";
      }
    }
  }
}

// The device-side sum of a masked batch's losses: every product in f32, summed in double.
TEST(GptModel, WeightedLossSumAddsTheWeightedLosses) {
  Tensor x = Tensor::empty({4}, DType::f32), w = Tensor::empty({4}, DType::f32);
  const float xs[] = {1.5f, 2.f, -3.f, 0.25f}, ws[] = {0.5f, 0.f, 0.25f, 4.f};
  std::copy(xs, xs + 4, x.data<float>());
  std::copy(ws, ws + 4, w.data<float>());
  Tensor sum = f64_zeros(1, Device::cpu);
  accumulate_weighted_sum(x, w, sum);
  accumulate_weighted_sum(x, w, sum);
  EXPECT_EQ(read_f64(sum)[0], 2 * (0.75 + 0 - 0.75 + 1.0));
  Tensor short_w = Tensor::empty({3}, DType::f32);
  EXPECT_THROW(accumulate_weighted_sum(x, short_w, sum), std::exception);
}

}  // namespace
}  // namespace mt
