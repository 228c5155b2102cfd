// test_moe_mlp.cpp: the mixture-of-experts MLP on one rank (models/moe_mlp.h): one expert chosen by every token
// is the dense MLP exactly; every gradient (input, router, each expert's fc1 and fc2, the shared expert's)
// against central differences, GELU and SwiGLU experts, softmax and sigmoid routers; a shared expert adds its dense
// MLP; parameters named by global expert index; the auxiliary and z losses (values and gradients), the recorded
// load, the expert bias; what it does not do yet is refused.
#include <cmath>
#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor/ops.h"
#include "models/moe_mlp.h"
#include "tests/unit/tiny_models.h"

namespace mt {
namespace {

ModelConfig moe_model(Arch arch, int64_t E, int64_t k) {
  ModelConfig m = arch == Arch::llama ? testing_util::tiny_llama(2, false, 10000) : testing_util::tiny_gpt(true);
  m.moe.num_experts = E;
  m.moe.top_k = k;
  m.moe.ffn_hidden_size = 8;
  m.init_std = 0.3f;  // larger than a model's, so the router's choices and the experts' outputs are not all alike
  return m;
}

Tensor random(Shape shape, uint32_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 8) / static_cast<float>(1u << 24) * 2.f - 1.f;
  }
  return Tensor::from_floats(v, std::move(shape));
}

double dot(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_floats(), y = b.to_floats();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += static_cast<double>(x[i]) * y[i];
  return s;
}

TEST(MoeMlp, OneExpertForEveryTokenIsTheDenseMlp) {
  const ModelConfig m = moe_model(Arch::gpt, 1, 1);
  MoeMlp moe(m, "layers.0.mlp", DType::f32, 0.1f, 7);
  const Tensor x = random({6, 16}, 1);
  MoeMlp::Saved s;
  const Tensor out = moe.forward(x, s);
  Tensor h = Tensor::empty({6, 8}, DType::f32), act = Tensor::empty({6, 8}, DType::f32),
         dense = Tensor::empty({6, 16}, DType::f32);
  gemm(x, moe.fc1(0).value, h, GemmOptions{.trans_b = true});
  gelu_forward(h, act);
  gemm(act, moe.fc2(0).value, dense, GemmOptions{.trans_b = true});
  EXPECT_EQ(out.to_floats(), dense.to_floats()) << "softmax over one expert weighs it 1";
  std::vector<std::string> names;
  for (Parameter* p : moe.parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"layers.0.mlp.router.weight", "layers.0.mlp.experts.0.fc1.weight",
                                             "layers.0.mlp.experts.0.fc2.weight"}));
}

// Every gradient against central differences of L = <forward(x), w> + aux_loss_coeff * aux + z_loss_coeff * z (the
// load-balancing losses as the forward recorded them). Every expert chosen by every token (top_k = num_experts)
// keeps the choice fixed under small steps; a case with top_k < num_experts uses a step far below the gaps between
// the router's scores.
void check_gradients(const ModelConfig& m, double step, double tol) {
  MoeMlp moe(m, "mlp", DType::f32, 0.2f, 3);
  const int64_t N = 5, C = m.hidden_size;
  Tensor x = random({N, C}, 11);
  const Tensor w = random({N, C}, 12);
  MoeMlp::Saved s;
  moe.forward(x, s, {.record = true});
  moe.take_load();
  const Tensor dx = moe.backward(w, s);
  auto loss = [&]() {
    MoeMlp::Saved t;
    const double out = dot(moe.forward(x, t, {.record = true}), w);
    const MoeLoad l = moe.take_load();
    return out + m.moe.aux_loss_coeff * l.aux + m.moe.z_loss_coeff * l.z;
  };
  // d L / d t for each element of t (t's values are edited in place and restored).
  auto check = [&](Tensor& t, const Tensor& analytic, const std::string& what) {
    float* v = t.data<float>();
    const std::vector<float> g = analytic.to_floats();
    double err = 0, scale = 1e-6;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float keep = v[i];
      v[i] = keep + static_cast<float>(step);
      const double up = loss();
      v[i] = keep - static_cast<float>(step);
      const double down = loss();
      v[i] = keep;
      const double fd = (up - down) / (2 * step);
      err = std::max(err, std::abs(fd - g[static_cast<size_t>(i)]));
      scale = std::max(scale, std::abs(fd));
    }
    EXPECT_LT(err / scale, tol) << what;
  };
  check(x, dx, "dx");
  check(moe.router().value, moe.router().grad, "router");
  for (int64_t e = 0; e < m.moe.num_experts; ++e) {
    check(moe.fc1(e).value, moe.fc1(e).grad, "expert " + std::to_string(e) + " fc1");
    check(moe.fc2(e).value, moe.fc2(e).grad, "expert " + std::to_string(e) + " fc2");
  }
  ASSERT_EQ(moe.has_shared_expert(), m.moe.shared_expert_ffn_hidden_size > 0);
  if (moe.has_shared_expert()) {
    check(moe.shared_fc1().value, moe.shared_fc1().grad, "shared expert fc1");
    check(moe.shared_fc2().value, moe.shared_fc2().grad, "shared expert fc2");
  }
}

TEST(MoeMlp, GradientsOfGeluExpertsWithASoftmaxRouter) {
  ModelConfig m = moe_model(Arch::gpt, 3, 3);
  check_gradients(m, 1e-2, 2e-3);
  m.moe.top_k = 2;
  check_gradients(m, 1e-3, 2e-2);
}

TEST(MoeMlp, GradientsOfSwigluExpertsWithASigmoidRouter) {
  ModelConfig m = moe_model(Arch::llama, 4, 4);
  m.moe.score_function = MoeScore::sigmoid;
  check_gradients(m, 1e-2, 2e-3);
  m.moe.norm_topk_prob = false;
  check_gradients(m, 1e-2, 2e-3);
}

TEST(MoeMlp, GradientsWithASharedExpert) {
  ModelConfig m = moe_model(Arch::gpt, 3, 3);
  m.moe.shared_expert_ffn_hidden_size = 12;
  check_gradients(m, 1e-2, 2e-3);
  m = moe_model(Arch::llama, 4, 4);
  m.moe.shared_expert_ffn_hidden_size = 8;
  check_gradients(m, 1e-2, 2e-3);
}

TEST(MoeMlp, ASharedExpertAddsItsDenseMlp) {
  ModelConfig m = moe_model(Arch::gpt, 2, 1);
  m.moe.shared_expert_ffn_hidden_size = 12;
  MoeMlp with(m, "layers.1.mlp", DType::f32, 0.1f, 9);
  m.moe.shared_expert_ffn_hidden_size = 0;
  MoeMlp without(m, "layers.1.mlp", DType::f32, 0.1f, 9);  // the same routed experts (same names, same seed)
  const Tensor x = random({5, 16}, 4);
  MoeMlp::Saved a, b;
  const std::vector<float> both = with.forward(x, a).to_floats(), routed = without.forward(x, b).to_floats();
  Tensor h = Tensor::empty({5, 12}, DType::f32), act = Tensor::empty({5, 12}, DType::f32),
         shared = Tensor::empty({5, 16}, DType::f32);
  gemm(x, with.shared_fc1().value, h, GemmOptions{.trans_b = true});
  gelu_forward(h, act);
  gemm(act, with.shared_fc2().value, shared, GemmOptions{.trans_b = true});
  const std::vector<float> s = shared.to_floats();
  for (size_t i = 0; i < both.size(); ++i) EXPECT_EQ(both[i], routed[i] + s[i]) << i;
  EXPECT_EQ(with.parameters().back()->name, "layers.1.mlp.shared_expert.fc2.weight");
}

TEST(MoeMlp, GradientsOfTheAuxiliaryAndZLosses) {
  for (MoeScore score : {MoeScore::softmax, MoeScore::sigmoid}) {
    ModelConfig m = moe_model(Arch::gpt, 4, 2);
    m.moe.score_function = score;
    m.moe.aux_loss_coeff = 0.5;  // large, so the losses' share of each gradient is far above the tolerance
    m.moe.z_loss_coeff = 0.05;
    check_gradients(m, 1e-3, 2e-2);
    m.moe.top_k = 4;
    check_gradients(m, 1e-2, 2e-3);
  }
}

// A router that scores every expert alike: the auxiliary loss is 1 (its value at an even load, whatever the
// choice) and the z-loss log(E)^2; the load counts each token once per chosen expert.
TEST(MoeMlp, LossesAndLoadOfAnEvenRouter) {
  ModelConfig m = moe_model(Arch::gpt, 4, 2);
  m.moe.aux_loss_coeff = 0.01;
  m.moe.z_loss_coeff = 0.001;
  MoeMlp moe(m, "mlp", DType::f32, 0.1f, 1);
  fill_(moe.router().value, 0.f);
  MoeMlp::Saved s;
  moe.forward(random({6, 16}, 2), s, {.record = true});
  moe.forward(random({6, 16}, 3), s);  // not recorded (a recomputation)
  const MoeLoad l = moe.take_load();
  EXPECT_EQ(l.microbatches, 1);
  EXPECT_NEAR(l.aux, 1.0, 1e-6);
  EXPECT_NEAR(l.z, std::log(4.0) * std::log(4.0), 1e-5);
  EXPECT_EQ(l.tokens, (std::vector<int64_t>{6, 6, 0, 0})) << "equal scores: the lower expert index wins";
  EXPECT_EQ(moe.take_load().microbatches, 0) << "taken: cleared";
}

// DeepSeek-V3's expert bias moves the choice, not the weights, and each update moves every bias by the rate
// toward an even load.
TEST(MoeMlp, TheExpertBiasSteersTheChoiceOnly) {
  ModelConfig m = moe_model(Arch::gpt, 4, 1);
  m.moe.bias_update_rate = 0.25;
  m.moe.norm_topk_prob = false;
  MoeMlp moe(m, "mlp", DType::f32, 0.1f, 1);
  ASSERT_TRUE(moe.has_expert_bias());
  EXPECT_EQ(moe.expert_bias(), (std::vector<float>{0, 0, 0, 0}));
  moe.update_expert_bias({10, 0, 5, 5});  // mean 5
  EXPECT_EQ(moe.expert_bias(), (std::vector<float>{-0.25f, 0.25f, 0, 0}));
  moe.set_expert_bias({0, 0, 0, 10});
  MoeMlp::Saved s;
  moe.forward(random({5, 16}, 4), s, {.record = true});
  EXPECT_EQ(moe.take_load().tokens, (std::vector<int64_t>{0, 0, 0, 5}));
  const std::vector<float> scores = s.scores.to_floats(), probs = s.probs.to_floats();
  for (int64_t n = 0; n < 5; ++n) EXPECT_EQ(probs[static_cast<size_t>(n)], scores[static_cast<size_t>(n * 4 + 3)]);
  EXPECT_THROW(moe.update_expert_bias({1, 2}), std::invalid_argument);
  m.moe.bias_update_rate = 0;
  EXPECT_FALSE(MoeMlp(m, "mlp", DType::f32, 0.1f, 1).has_expert_bias());
}

// A capacity factor: each expert keeps its ceil(factor * N * k / E) heaviest choices; a dropped choice adds nothing
// (the output is the kept choices' weighted sum), the load and the aux loss count every choice, and the gradients
// (dropping is fixed under small steps) are those of that function.
TEST(MoeMlp, ACapacityDropsTheLightestChoicesOfAnOverloadedExpert) {
  ModelConfig m = moe_model(Arch::gpt, 4, 1);
  m.moe.capacity_factor = 1.0;  // 8 tokens, top-1 of 4 experts: 2 choices per expert at most
  m.moe.norm_topk_prob = false;
  MoeMlp moe(m, "mlp", DType::f32, 0.1f, 1);
  fill_(moe.router().value, 0.f);
  // Every token scores expert 3 highest: the router's row 3 is a multiple of x's first direction.
  std::vector<float> w(4 * 16, 0.f);
  w[3 * 16] = 1.f;
  moe.router().value.copy_from(Tensor::from_floats(w, {4, 16}));
  std::vector<float> xs(8 * 16, 0.f);
  for (int n = 0; n < 8; ++n) xs[static_cast<size_t>(n * 16)] = 0.5f + 0.1f * static_cast<float>(n);  // rising weight
  const Tensor x = Tensor::from_floats(xs, {8, 16});
  MoeMlp::Saved s;
  const std::vector<float> out = moe.forward(x, s, {.record = true}).to_floats();
  EXPECT_EQ(s.routed, (std::vector<int64_t>{0, 0, 0, 8}));
  EXPECT_EQ(s.counts, (std::vector<int64_t>{0, 0, 0, 2}));
  const MoeLoad l = moe.take_load();
  EXPECT_EQ(l.tokens, (std::vector<int64_t>{0, 0, 0, 8}));
  EXPECT_EQ(l.dropped, 6);
  // Tokens 6 and 7 (the heaviest) keep their expert; the others' outputs are zero.
  for (int n = 0; n < 8; ++n) {
    double norm = 0;
    for (int c = 0; c < 16; ++c) norm += std::abs(out[static_cast<size_t>(n * 16 + c)]);
    if (n < 6)
      EXPECT_EQ(norm, 0.0) << "token " << n << " was dropped";
    else
      EXPECT_GT(norm, 0.0) << "token " << n << " was kept";
  }
  ModelConfig g = moe_model(Arch::llama, 4, 2);
  g.moe.capacity_factor = 0.75;
  g.moe.aux_loss_coeff = 0.5;
  check_gradients(g, 1e-3, 2e-2);
}

TEST(MoeMlp, ADenseConfigIsRefused) {
  EXPECT_THROW(MoeMlp(testing_util::tiny_gpt(true), "mlp", DType::f32, 0.1f, 1), std::invalid_argument);
}

}  // namespace
}  // namespace mt
