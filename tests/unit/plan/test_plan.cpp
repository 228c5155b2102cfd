// test_plan.cpp: the planner against Megatron-LM's published weak-scaling table (Narayanan et al. 2021,
// "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", Table 1: A100 80GB,
// sequence 2048, vocabulary 51,200).
//
// Assumptions, one model for every row (nothing tuned per row): full activation recomputation (the paper's
// runs used it), micro batch size 1, the non-interleaved 1F1B schedule, no distributed optimizer (Megatron of
// 2021 had none), bf16, the built-in a100-80gb table. The paper's TFLOP/s count the recomputed forward (its
// equation 3), so the planner's hardware_tflops_per_gpu (that same formula) is what is compared.
//
// Known deviation: the 1.7B row (TP 1, 32-way data parallelism) is predicted 23% faster than published. The
// planner predicts megatrain, whose attention is fused (cuDNN flash attention), where Megatron-LM of 2021
// materialised the (s x s) scores and ran an unfused softmax: at hidden 2304 that memory-bound work costs about
// as much as the layer's GEMMs, at hidden 25600 / TP 8 a few per cent. That row is held to 25% and the others
// to the 15% target; a model tuned to hit the row would stop predicting megatrain.
//
// Llama (configs/llama3-8b.yaml): parameters per rank against a hand count, and the plan's FLOPs against
// models/gpt.cpp's model_flops_per_iteration (which test_training checks by hand).
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include <fmt/format.h>

#include "core/config/config.h"
#include "models/gpt.h"
#include "plan/model_shapes.h"
#include "plan/planner.h"
#include "tests/unit/source_root.h"

namespace mt::plan {
namespace {

struct Row {
  double billions;
  int64_t heads, hidden, layers, tp, pp, gpus, batch;
  double tflops;  // achieved per GPU, published
};

constexpr Row kRows[] = {
    {1.7, 24, 2304, 24, 1, 1, 32, 512, 137},          {3.6, 32, 3072, 30, 2, 1, 64, 512, 138},
    {7.5, 32, 4096, 36, 4, 1, 128, 512, 142},         {18.4, 48, 6144, 40, 8, 1, 256, 1024, 135},
    {39.1, 64, 8192, 48, 8, 2, 512, 1536, 138},       {76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140},
    {145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148},    {310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155},
    {529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163}, {1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163},
};

Config row_config(const Row& r) {
  const std::string yaml = fmt::format(
      "model: {{num_layers: {}, hidden_size: {}, num_heads: {}, seq_length: 2048, vocab_size: 51200, dropout: 0.0,\n"
      "        attention_dropout: 0.0}}\n"
      "parallel: {{tensor: {}, pipeline: {}}}\n"
      "training: {{micro_batch_size: 1, global_batch_size: {}, train_iters: 1, precision: bf16, recompute: full}}\n"
      "optimizer: {{lr: 1.0e-4}}\n"
      "data: {{synthetic: true}}\n",
      r.layers, r.hidden, r.heads, r.tp, r.pp, r.batch);
  return parse_config(yaml, fmt::format("megatron-{}b", r.billions), {}, r.gpus);
}

TEST(PlanMegatronTable, EveryPublishedLayoutFitsAndItsThroughputIsWithin15Percent) {
  const Hardware a100 = builtin_hardware("a100-80gb");
  for (const Row& r : kRows) {
    const Prediction p = predict(row_config(r), a100);
    const double predicted = p.time.hardware_tflops_per_gpu;
    fmt::print(
        "{:7.1f}B TP {} PP {:2} on {:4} GPUs: peak {:5.1f} GiB, predicted {:5.1f} TFLOP/s/GPU, published {:3.0f} "
        "({:+5.1f}%)\n",
        r.billions, r.tp, r.pp, r.gpus, p.memory.max_total() / 1073741824.0, predicted, r.tflops,
        100 * (predicted / r.tflops - 1));
    EXPECT_TRUE(p.fits) << r.billions << "B: " << p.memory.max_total() / 1e9 << " GB";
    EXPECT_NEAR(predicted / r.tflops, 1.0, r.billions < 2 ? 0.25 : 0.15) << r.billions << "B";
    // The parameter count of the row, as a check that the shape is the paper's.
    EXPECT_NEAR(estimated_parameters(p.config.model) / 1e9 / r.billions, 1.0, 0.05) << r.billions << "B";
  }
}

TEST(PlanMegatronTable, SearchFindsALayoutAtLeastAsFastAsThePublishedOne) {
  const Hardware a100 = builtin_hardware("a100-80gb");
  for (const Row& r : kRows) {
    const Config published = row_config(r);
    const Prediction p = predict(published, a100);
    const std::vector<Prediction> ranked = search(published, r.gpus, a100);
    ASSERT_FALSE(ranked.empty()) << r.billions << "B";
    const Prediction& best = ranked.front();
    fmt::print("{:7.1f}B on {:4} GPUs: fastest {} at {:.1f} s/iter (published layout {:.1f} s)\n", r.billions, r.gpus,
               describe(best.layout), best.time.total, p.time.total);
    EXPECT_TRUE(best.fits);
    EXPECT_LE(best.time.total, p.time.total * (1 + 1e-9)) << r.billions << "B";
  }
}

TEST(PlanLayout, InvalidLayoutsAreRefusedWithTheConfigRulesMessages) {
  const Config base = row_config(kRows[0]);
  Layout l = layout_of(base);
  l.tensor = 5;  // does not divide 24 heads
  l.data = 32 / 5;
  try {
    apply_layout(base, l);
    FAIL() << "TP 5 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tensor: 5 does not divide model.num_heads=24"), std::string::npos)
        << e.what();
  }
  // The schedule's own rule: interleaving needs the microbatches in groups of the stages.
  Layout v = layout_of(base);
  v.pipeline = 4, v.virtual_pipeline = 2, v.data = 8, v.micro_batch_size = 1;
  Config c = apply_layout(base, v);
  c.training.num_microbatches = 6;
  EXPECT_THROW(predict(c, builtin_hardware("a100-80gb")), std::invalid_argument);
}

// A base with uniform recomputation keeps its groups where the layout recomputes fully, and drops them (they would
// be refused) where it does not.
TEST(PlanLayout, RecomputeMethodFollowsTheLayoutsRecomputation) {
  const Config base = load_config(
      testing_util::source_path("configs/llama3-8b.yaml"),
      {"training.recompute=full", "training.recompute_method=uniform", "training.recompute_num_layers=2"}, 8);
  Layout l = layout_of(base);
  const Config full = apply_layout(base, l);
  EXPECT_EQ(full.training.recompute_method, "uniform");
  EXPECT_EQ(full.training.recompute_num_layers, 2);
  for (Recompute rc : {Recompute::none, Recompute::selective}) {
    l.recompute = rc;
    const Config c = apply_layout(base, l);
    EXPECT_EQ(c.training.recompute_method, "block");
    EXPECT_EQ(c.training.recompute_num_layers, 0);
  }
}

// Llama 3 8B by hand: C 4096, 32 query heads and 8 key/value heads of D 128, SwiGLU F 14336, vocabulary 128256
// (already a multiple of 128 * 2), 32 layers, untied. One layer: QKV (32 + 2 * 8) * 128 x 4096 = 25165824,
// proj 4096 x 4096 = 16777216, fc1 (gate and up) 2 * 14336 x 4096 = 117440512, fc2 4096 x 14336 = 58720256,
// two RMSNorm weights 2 * 4096 = 8192, no biases: 218112000. Embedding and head 128256 x 4096 = 525336576
// each, the final norm 4096, no position table: 8030261248 in all.
constexpr double kLlamaLayer = 218112000, kLlamaVocab = 525336576, kLlamaNorm = 4096;

Config llama3_8b(const std::vector<std::string>& sets, int64_t world) {
  return load_config(testing_util::source_path("configs/llama3-8b.yaml"), sets, world);
}

TEST(PlanLlama, ParametersPerRankAreTheHandCount) {
  const Hardware h100 = builtin_hardware("h100-80gb");
  // TP 2 (DP 4): every weight halved (rows of QKV, fc1, embedding and head; columns of proj and fc2), the norms
  // replicated: 32 * (218112000 - 8192) / 2 + 32 * 8192 + 2 * 525336576 / 2 + 4096.
  const Prediction tp2 = predict(llama3_8b({}, 8), h100);
  ASSERT_EQ(tp2.memory.stages.size(), 1u);
  EXPECT_EQ(tp2.memory.stages[0].parameters, 4015263744);
  EXPECT_EQ(tp2.memory.stages[0].parameters,
            static_cast<int64_t>(32 * (kLlamaLayer - 8192) / 2 + 32 * 8192 + kLlamaVocab + kLlamaNorm));
  // PP 2 (TP 1, DP 4): 16 layers each; the first stage the embedding, the last the final norm and the head.
  const Prediction pp2 =
      predict(llama3_8b({"parallel.tensor=1", "parallel.sequence_parallel=false", "parallel.pipeline=2"}, 8), h100);
  ASSERT_EQ(pp2.memory.stages.size(), 2u);
  EXPECT_EQ(pp2.memory.stages[0].parameters, 4015128576);
  EXPECT_EQ(pp2.memory.stages[0].parameters, static_cast<int64_t>(16 * kLlamaLayer + kLlamaVocab));
  EXPECT_EQ(pp2.memory.stages[1].parameters, 4015132672);
  EXPECT_EQ(pp2.memory.stages[1].parameters, static_cast<int64_t>(16 * kLlamaLayer + kLlamaNorm + kLlamaVocab));
  // Together the whole model, as estimated_parameters (core/config) counts it.
  EXPECT_EQ(pp2.memory.stages[0].parameters + pp2.memory.stages[1].parameters, 8030261248);
  EXPECT_EQ(estimated_parameters(pp2.config.model), 8030261248.0);
  // ZeRO's optimizer state (fp32 master and two moments and the bf16 value shard, 14 bytes per element) over
  // DP 4 of the TP 2 rank's parameters (the gradient buffer's bucket padding aside).
  EXPECT_NEAR(tp2.memory.stages[0].bytes[MemKind::optimizer] / (14.0 * 4015263744 / 4), 1.0, 1e-6);
}

TEST(PlanLlama, ModelFlopsAreTheModelsOwn) {
  const Hardware h100 = builtin_hardware("h100-80gb");
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{},
        {"parallel.tensor=1", "parallel.sequence_parallel=false", "parallel.pipeline=2"},
        {"training.recompute=full"},
        {"training.recompute=full", "training.recompute_method=uniform", "training.recompute_num_layers=3"}}) {
    const Config c = llama3_8b(sets, 8);
    const Prediction p = predict(c, h100);
    const double tokens = static_cast<double>(c.training.global_batch_size * c.model.seq_length);
    const double world = static_cast<double>(c.parallel.world_size);
    const double model_flops = model_flops_per_iteration(c.model, c.training.global_batch_size * c.model.seq_length);
    EXPECT_NEAR(p.time.model_tflops_per_gpu * 1e12 * world * p.time.total / model_flops, 1.0, 1e-12);
    EXPECT_NEAR(p.time.tokens_per_s * p.time.total / tokens, 1.0, 1e-12);
    // The hardware count is the same GEMMs (the plan's shape table against gpt.cpp's formula: GQA's narrower
    // K/V, SwiGLU's three matrices) with uncausal attention (4TC per token and layer, not 2TC) and, with
    // recomputation, a fourth pass over the layers.
    const double L = static_cast<double>(c.model.num_layers), T = static_cast<double>(c.model.seq_length),
                 C = static_cast<double>(c.model.hidden_size), V = static_cast<double>(c.model.padded_vocab_size);
    const double layer_passes = c.training.recompute == Recompute::full ? 4 : 3;  // uniform reruns every layer too
    const double layers_flops = (model_flops / tokens - 6 * C * V) / 3 + 2 * L * T * C;  // one pass, uncausal
    const double hw_flops = tokens * (layer_passes * layers_flops + 6 * C * V);
    EXPECT_NEAR(p.time.hardware_tflops_per_gpu * 1e12 * world * p.time.total / hw_flops, 1.0, 1e-12);
  }
}

TEST(PlanLlama, Llama3_8bSearchKeepsTheKeyValueHeadsWhole) {
  const Hardware h100 = builtin_hardware("h100-80gb");
  const Config c = llama3_8b({}, 8);
  const Prediction p = predict(c, h100);
  fmt::print("llama3-8b as configured ({}): peak {:.1f} GiB per GPU, {:.1f} s/iter, MFU {:.1f}% (predicted)\n",
             describe(p.layout), p.memory.max_total() / 1073741824.0, p.time.total, 100 * p.time.mfu);
  const std::vector<Prediction> ranked = search(c, 8, h100);
  ASSERT_FALSE(ranked.empty());
  for (const Prediction& r : ranked) EXPECT_EQ(r.config.model.kv_heads() % r.layout.tensor, 0);
}

}  // namespace
}  // namespace mt::plan

namespace mt::plan {
namespace {

// The rates file keeps what `bench kernels` measured: attention by (T, D, dropout), the per-element costs, the
// cores; and the time model reads them (more per-element cost, slower attention, fewer cores: a slower step).
TEST(PlanRates, MeasuredAttentionElementwiseAndCoresRoundTripAndMoveThePrediction) {
  Hardware cpu = builtin_hardware("cpu");
  cpu.attention_points = {{64, 16, false, 5e9}, {1024, 64, false, 30e9}, {64, 16, true, 4e9}};
  cpu.elementwise_costs.norm_forward = 3e-9;
  cpu.elementwise_costs.cross_entropy_backward = 4e-9;
  cpu.cores = 2;
  const std::string path = ::testing::TempDir() + "/rates.yaml";
  write_rates(path, cpu);
  const Hardware back = read_rates(path, builtin_hardware("h100-80gb"));
  EXPECT_FALSE(back.is_gpu);
  EXPECT_EQ(back.cores, 2);
  ASSERT_EQ(back.attention_points.size(), 3u);
  EXPECT_TRUE(back.attention_points[2].dropout);
  EXPECT_DOUBLE_EQ(back.elementwise_costs.norm_forward, 3e-9);
  EXPECT_DOUBLE_EQ(back.elementwise_costs.cross_entropy_backward, 4e-9);

  // Between points of the same dropout kind, linear in log T and log D; beyond them the end's rate; none of
  // that kind: the efficiency curve.
  EXPECT_DOUBLE_EQ(attention_rate(back, 64, 16, false, true), 5e9);
  EXPECT_DOUBLE_EQ(attention_rate(back, 2048, 128, false, true), 30e9);
  EXPECT_DOUBLE_EQ(attention_rate(back, 2048, 128, true, true), 4e9);
  Hardware grid = back;
  grid.attention_points = {
      {256, 64, false, 20e9}, {1024, 64, false, 30e9}, {256, 16, false, 10e9}, {1024, 16, false, 14e9}};
  EXPECT_NEAR(attention_rate(grid, 512, 64, false, true), 25e9, 1e-3);    // halfway in log T
  EXPECT_NEAR(attention_rate(grid, 512, 32, false, true), 18.5e9, 1e-3);  // (12 + 25) / 2
  Hardware no_points = back;
  no_points.attention_points.clear();
  EXPECT_DOUBLE_EQ(attention_rate(no_points, 64, 16, false, true), back.peak_flops_fp32 * back.attention_efficiency);

  const Config c = parse_config(
      "model: {num_layers: 2, hidden_size: 64, num_heads: 4, seq_length: 64, vocab_size: 257}\n"
      "training: {micro_batch_size: 2, global_batch_size: 8, train_iters: 1, precision: fp32, device: cpu}\n"
      "optimizer: {lr: 1.0e-3}\ndata: {synthetic: true}\n",
      "tiny", {}, 4);
  const double base = predict(c, back).time.total;
  Hardware slow_norms = back;
  slow_norms.elementwise_costs.norm_forward = 1e-6;  // far above the bytes' cost
  EXPECT_GT(predict(c, slow_norms).time.elementwise, predict(c, back).time.elementwise);
  Hardware one_core = back;
  one_core.cores = 1;  // four ranks on one core: each computes four times slower than alone
  const Prediction shared = predict(c, one_core), own = predict(c, back);
  EXPECT_NEAR(shared.time.compute / own.time.compute, 2.0, 1e-9);  // 4 ranks on 1 core vs on 2 cores
  EXPECT_GT(shared.time.total, base);
}

TEST(PlanRates, BadAttentionPointsAreRefusedNamingTheEntry) {
  const std::string path = ::testing::TempDir() + "/bad-rates.yaml";
  std::ofstream(path) << "peak_flops: 1e9\nhbm_bytes_per_s: 1e9\nattention_points: [[64, 16, 0]]\n";
  try {
    read_rates(path, builtin_hardware("cpu"));
    FAIL() << "a three-number attention point was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("attention_points[0]: expected [T, D, dropout, flops_per_s]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mt::plan

namespace mt::plan {
namespace {

// Mixtral 8x7B (configs/mixtral-8x7b.yaml's shape and layout: TP 8 with SP, PP 4, DP 4, ZeRO, bf16) by hand:
// llama 3 8B's attention at vocabulary 32000 (already a multiple of 128; 32768 at TP 8) with every MLP a mixture
// of 8 SwiGLU experts of width 14336, top 2. One layer: QKV (32 + 2 * 8) * 128 x 4096 = 25165824, proj 16777216,
// two RMSNorms 8192, the router 8 x 4096 = 32768, each expert's fc1 2 * 14336 x 4096 and fc2 4096 x 14336 =
// 176160768: 1451270144; 32 of them, the embedding and the head 32000 x 4096 each, the final norm: 46702792704.
// A token passes 2 of the 8 experts: 6 x 176160768 fewer per layer, 12879925248 active. (At TP 8 the padded
// vocabulary 32768 adds 2 x 768 x 4096 to both.)
constexpr double kMixtralExpert = 176160768, kMixtralAttention = 25165824 + 16777216, kMixtralRouter = 32768;

// Built as the dense model with model.moe set after the rules (configs/mixtral-8x7b.yaml is the same model).
Config mixtral_8x7b(int64_t top_k = 2, int64_t tp = 8) {
  Config c = parse_config(
      "model: {arch: llama, num_layers: 32, hidden_size: 4096, num_heads: 32, num_query_groups: 8,\n"
      "        ffn_hidden_size: 14336, seq_length: 4096, vocab_size: 32000, tie_embeddings: false, dropout: 0.0,\n"
      "        attention_dropout: 0.0}\n"
      "parallel: {tensor: " +
          std::to_string(tp) + ", pipeline: 4, sequence_parallel: " + (tp > 1 ? "true" : "false") +
          ", distributed_optimizer: true}\n"
          "training: {micro_batch_size: 1, global_batch_size: 1024, train_iters: 1, precision: bf16}\n"
          "optimizer: {lr: 3.0e-4}\n"
          "data: {synthetic: true}\n",
      "mixtral-8x7b", {}, 128);
  c.model.moe = MoeConfig{.num_experts = 8, .top_k = top_k, .ffn_hidden_size = 14336, .aux_loss_coeff = 0.02};
  c.parallel.expert_tensor = c.parallel.tensor;
  return c;
}

TEST(PlanMoe, Mixtral8x7bHas46_7BParametersOf12_9BActive) {
  const Config c = mixtral_8x7b(2, 1);
  EXPECT_EQ(c.model.padded_vocab_size, 32000);
  EXPECT_EQ(model_parameters(c.model, false), 46702792704.0);
  EXPECT_EQ(model_parameters(c.model, false),
            32 * (kMixtralAttention + 8192 + kMixtralRouter + 8 * kMixtralExpert) + 2 * 32000.0 * 4096 + 4096);
  EXPECT_EQ(model_parameters(c.model, true), 12879925248.0);
  EXPECT_EQ(model_parameters(c.model, true), model_parameters(c.model, false) - 32 * 6 * kMixtralExpert);
  // A dense model's count is core/config's estimate.
  Config dense = c;
  dense.model.moe = {};
  EXPECT_EQ(model_parameters(dense.model, false), estimated_parameters(dense.model));
  EXPECT_EQ(model_parameters(dense.model, true), estimated_parameters(dense.model));
}

// configs/mixtral-8x7b.yaml is that model (at its TP 1 the vocabulary needs no padding), laid out with expert
// parallelism 8 over 128 GPUs, and it fits.
TEST(PlanMoe, TheMixtralConfigIsTheHandCountedModel) {
  const Config c = load_config(testing_util::source_path("configs/mixtral-8x7b.yaml"), {}, 128);
  const Config hand = mixtral_8x7b();
  EXPECT_EQ(c.model.moe.num_experts, hand.model.moe.num_experts);
  EXPECT_EQ(c.model.moe.top_k, hand.model.moe.top_k);
  EXPECT_EQ(c.parallel.expert, 8);
  EXPECT_EQ(model_parameters(c.model, false), 46702792704.0);
  EXPECT_EQ(model_parameters(c.model, true), 12879925248.0);
  const Prediction p = predict(c, builtin_hardware("h100-80gb"));
  EXPECT_TRUE(p.fits);
}

TEST(PlanMoe, Mixtral8x7bParametersPerRankSplitEveryExpertOverTensorParallelism) {
  const Prediction p = predict(mixtral_8x7b(), builtin_hardware("h100-80gb"));
  ASSERT_EQ(p.memory.stages.size(), 3u);  // first, middle, last
  // 8 layers a stage: the attention and the experts an eighth each, the norms and the router whole; the
  // embedding (first) and the head (last) 32768 / 8 rows; the final norm (last).
  const double layer = (kMixtralAttention + 8 * kMixtralExpert) / 8 + 8192 + kMixtralRouter;
  EXPECT_EQ(p.memory.stages[0].parameters, static_cast<int64_t>(8 * layer + 4096.0 * 4096));
  EXPECT_EQ(p.memory.stages[0].parameters, 1468334080);
  EXPECT_EQ(p.memory.stages[1].parameters, static_cast<int64_t>(8 * layer));
  EXPECT_EQ(p.memory.stages[2].parameters, static_cast<int64_t>(8 * layer + 4096.0 * 4096 + 4096));
  EXPECT_TRUE(p.fits) << p.memory.max_total() / 1073741824.0 << " GiB";
  // No expert parallelism yet: no all-to-all.
  EXPECT_EQ(p.time.all_to_all_bytes_per_token, 0);
  EXPECT_EQ(p.time.ep_comm, 0);
}

TEST(PlanMoe, FlopsCountTheActiveExpertsNotAll) {
  const Config c = mixtral_8x7b();
  const Prediction p = predict(c, builtin_hardware("h100-80gb"));
  const double tokens = static_cast<double>(c.training.global_batch_size * c.model.seq_length);
  const double world = static_cast<double>(c.parallel.world_size);
  // Model FLOPs are models/gpt.cpp's (the trainer's MFU), which count a token's top_k experts and the router.
  const double model_flops = model_flops_per_iteration(c.model, c.training.global_batch_size * c.model.seq_length);
  EXPECT_NEAR(p.time.model_tflops_per_gpu * 1e12 * world * p.time.total / model_flops, 1.0, 1e-12);
  // By hand from the active parameters: 6 FLOPs per active GEMM weight and token (the embedding lookup and the
  // norms are no GEMMs; the head is one), causal attention 3 x 2TC per layer.
  const double T = 4096, C = 4096, V = 32768;  // the vocabulary padded at TP 8
  const double active_gemm = model_parameters(c.model, true) - 2 * V * C - (2 * 32 + 1) * C;  // the layers'
  const double by_hand = tokens * (6 * active_gemm + 3 * 32 * 2 * T * C + 6 * C * V);
  EXPECT_NEAR(model_flops / by_hand, 1.0, 1e-12);
  // And the hardware count (uncausal attention, the same GEMMs) and the GEMM time follow top_k, not all 8: with
  // top_k 4 the experts' GEMM work doubles.
  const Prediction k4 = predict(mixtral_8x7b(4), builtin_hardware("h100-80gb"));
  const double expert_flops = 6 * 32 * 2 * kMixtralExpert;  // per token: 2 more experts in 32 layers
  const double k4_model_flops = model_flops_per_iteration(k4.config.model, c.training.global_batch_size * 4096);
  EXPECT_NEAR((k4_model_flops - model_flops) / tokens / expert_flops, 1.0, 1e-12);
  const double hw2 = p.time.hardware_tflops_per_gpu * p.time.total,
               hw4 = k4.time.hardware_tflops_per_gpu * k4.time.total;
  EXPECT_NEAR((hw4 - hw2) * 1e12 * world / tokens / expert_flops, 1.0, 1e-9);
  EXPECT_GT(k4.time.gemm, p.time.gemm * 1.3);
}

}  // namespace
}  // namespace mt::plan

namespace mt::plan {
namespace {

// The expert-parallel routing plan assumes (MoeShapes::imbalance): none without EP; balanced for dropless routing,
// saying it is not a bound and naming the worst case, EP x min(top_k, E / EP) / top_k; the capacity factor; a
// measured factor (plan --moe-imbalance) below it; never above the worst case.
TEST(PlanMoe, TheRoutingIsAMeasuredFactorTheCapacityOrBalancedSayingSo) {
  MoeConfig moe{.num_experts = 8, .top_k = 2};
  EXPECT_EQ(moe_imbalance(moe, 1).factor, 1.0);
  EXPECT_EQ(moe_imbalance(moe, 2).factor, 1.0);
  EXPECT_NE(moe_imbalance(moe, 2).source.find("not a bound: dropless routing can reach 2.00x"), std::string::npos);
  EXPECT_NE(moe_imbalance(moe, 8).source.find("can reach 4.00x"), std::string::npos);  // one expert per rank
  moe.capacity_factor = 1.25;
  EXPECT_EQ(moe_imbalance(moe, 2).factor, 1.25);
  EXPECT_NE(moe_imbalance(moe, 2).source.find("capacity_factor 1.25"), std::string::npos);
  // The capacity holds per microbatch: EP 2 inside CP 4 may get all of a microbatch's kept rows (twice its share);
  // EP 4 over CP 2 (whole microbatches) keeps the factor; folding (TP 2 over ETP 1) halves the data ranks of EP 4.
  EXPECT_EQ(moe_imbalance(moe, 2, 4).factor, 2.0);  // 1.25 x 4 / 2 = 2.5, above the worst 2
  EXPECT_NE(moe_imbalance(moe, 2, 4).source.find("over 4 context ranks, 2 of them"), std::string::npos);
  EXPECT_EQ(moe_imbalance(moe, 4, 2).factor, 1.25);
  EXPECT_EQ(moe_imbalance(moe, 4, 4, 2).factor, 2.5);
  moe.plan_imbalance = 1.1;
  EXPECT_EQ(moe_imbalance(moe, 2).factor, 1.1);
  EXPECT_NE(moe_imbalance(moe, 2).source.find("--moe-imbalance 1.1"), std::string::npos);
  moe.capacity_factor = 0;
  moe.plan_imbalance = 7;  // above the worst case: the worst case
  EXPECT_EQ(moe_imbalance(moe, 2).factor, 2.0);
}

// What a layer holds depends on its index: with layer_pattern [1, 1, 0, 0] over two stages the first holds both
// MoE layers, the last both dense ones. By hand (llama, C 64, 8 heads, no GQA, vocabulary 257 padded to 384,
// untied): a dense layer QKV 192 x 64, proj 64 x 64, two RMSNorms, fc1 2 * 176 x 64, fc2 64 x 176 = 50304; a MoE
// layer the same attention, the router 4 x 64 and 4 experts of fc1 2 * 64 x 64 and fc2 64 x 64 = 65920.
TEST(PlanMoe, StagesHoldTheirOwnLayersMoeOrDense) {
  const std::string yaml =
      "model: {arch: llama, num_layers: 4, hidden_size: 64, num_heads: 8, ffn_hidden_size: 176, seq_length: 64,\n"
      "        vocab_size: 257, moe: {num_experts: 4, top_k: 2, ffn_hidden_size: 64, layer_pattern: [1, 1, 0, 0]}}\n"
      "parallel: {pipeline: 2}\n"
      "training: {micro_batch_size: 2, global_batch_size: 8, train_iters: 1, precision: fp32, device: cpu}\n"
      "optimizer: {lr: 1.0e-3}\ndata: {synthetic: true}\n";
  const Prediction p = predict(parse_config(yaml, "tiny-moe", {}, 2), builtin_hardware("cpu"));
  ASSERT_EQ(p.memory.stages.size(), 2u);
  EXPECT_EQ(p.memory.stages[0].parameters, 2 * 65920 + 384 * 64);       // two MoE layers, the embedding
  EXPECT_EQ(p.memory.stages[1].parameters, 2 * 50304 + 64 + 384 * 64);  // two dense layers, the norm, the head
  // The MoE stage keeps more for backward (N k permuted rows per layer) than the dense one.
  EXPECT_GT(p.memory.stages[0].bytes[MemKind::activation], p.memory.stages[1].bytes[MemKind::activation]);
}

// The search splits every expert over the tensor-parallel ranks like the dense MLP: a TP degree that does not divide
// the experts' width (36: TP 8 would not) is skipped, and the expert layers' TP follows the layout's.
TEST(PlanMoe, SearchKeepsTheExpertsWidthDivisibleByTensorParallelism) {
  const Config c = parse_config(
      "model: {arch: llama, num_layers: 4, hidden_size: 64, num_heads: 8, ffn_hidden_size: 176, seq_length: 64,\n"
      "        vocab_size: 257, moe: {num_experts: 4, top_k: 2, ffn_hidden_size: 36, shared_expert_ffn_hidden_size: "
      "8}}\n"
      "training: {micro_batch_size: 2, global_batch_size: 16, train_iters: 1, precision: bf16}\n"
      "optimizer: {lr: 1.0e-3}\ndata: {synthetic: true}\n",
      "tiny-moe", {}, 8);
  const std::vector<Prediction> ranked = search(c, 8, builtin_hardware("h100-80gb"));
  ASSERT_FALSE(ranked.empty());
  bool tp4 = false;
  for (const Prediction& r : ranked) {
    // The experts split over their own TP degree (the layout's, or a divisor of it with parallel folding), the
    // shared expert over the layout's.
    EXPECT_EQ(36 % r.config.parallel.expert_tensor, 0) << describe(r.layout);
    EXPECT_EQ(8 % r.layout.tensor, 0) << describe(r.layout);
    EXPECT_EQ(r.config.parallel.expert_tensor, r.layout.expert_tensor > 0 ? r.layout.expert_tensor : r.layout.tensor)
        << describe(r.layout);
    EXPECT_EQ(r.config.parallel.expert, r.layout.expert);  // EP is searched (PlanExpertParallel below)
    tp4 = tp4 || r.layout.tensor == 4;
  }
  EXPECT_TRUE(tp4);
}

}  // namespace
}  // namespace mt::plan

namespace mt::plan {
namespace {

// Expert parallelism (parallel.expert = EP): each of EP consecutive data-parallel ranks holds E / EP experts, their
// gradients in a buffer of their own reduced over the dp / EP expert-data-parallel ranks, their ZeRO state sharded
// over those. Mixtral 8x7B at TP 8 PP 4 DP 4: a stage's 8 layers hold 8 experts of kMixtralExpert / 8 each.
Config mixtral_ep(int64_t ep, bool zero = true) {
  Config c = mixtral_8x7b();
  c.parallel.expert = ep;
  c.parallel.distributed_optimizer = false;  // the config file sets the alias: parallel.shard says
  c.parallel.shard = zero ? ShardStage::optimizer : ShardStage::none;
  return c;
}

TEST(PlanExpertParallel, EachRankHoldsItsShareOfTheExpertsAndTheirState) {
  const Hardware h100 = builtin_hardware("h100-80gb");
  const Prediction p1 = predict(mixtral_ep(1), h100), p2 = predict(mixtral_ep(2), h100),
                   p4 = predict(mixtral_ep(4), h100);
  const double experts = 8 * 8 * kMixtralExpert / 8;  // a stage's experts on one TP rank
  for (size_t s = 0; s < p1.memory.stages.size(); ++s) {
    EXPECT_EQ(p1.memory.stages[s].parameters - p2.memory.stages[s].parameters, static_cast<int64_t>(experts / 2));
    EXPECT_EQ(p1.memory.stages[s].parameters - p4.memory.stages[s].parameters, static_cast<int64_t>(experts * 3 / 4));
    // bf16 values, fp32 gradients: the experts' share shrinks with EP.
    const KindBytes &b1 = p1.memory.stages[s].bytes, &b4 = p4.memory.stages[s].bytes;
    EXPECT_EQ(b1[MemKind::parameter] - b4[MemKind::parameter], 2 * experts * 3 / 4);
    EXPECT_NEAR(b1[MemKind::gradient] - b4[MemKind::gradient], 4 * experts * 3 / 4, 1e4);  // bucket padding
    // ZeRO: the dense parameters' state over 4 ranks, the experts' over dp / EP: at EP 4 every rank keeps its 2
    // experts' whole state (14 bytes each: fp32 master and moments, the bf16 value shard), at EP 1 a quarter of
    // all 8: the same bytes.
    EXPECT_NEAR(b4[MemKind::optimizer], b1[MemKind::optimizer], 1e4);
  }
  // Without ZeRO the experts' fp32 master and moments (12 bytes each) go with the experts.
  const Prediction a1 = predict(mixtral_ep(1, false), h100), a4 = predict(mixtral_ep(4, false), h100);
  EXPECT_EQ(a1.memory.stages[0].bytes[MemKind::optimizer] - a4.memory.stages[0].bytes[MemKind::optimizer],
            12 * experts * 3 / 4);
  // At EP 2 under ZeRO the experts' state is sharded over 2 ranks, not 4.
  const double dense = static_cast<double>(p2.memory.stages[1].parameters) - experts / 2;  // a middle stage
  EXPECT_NEAR(p2.memory.stages[1].bytes[MemKind::optimizer], 14 * (dense / 4 + experts / 2 / 2), 1e4);
  // Each MoE layer keeps the order of its received rows and, in flight, the received copies: a little more
  // activation memory (balanced routing: the same N k rows per rank as without EP).
  EXPECT_GT(p2.memory.stages[0].bytes[MemKind::activation], p1.memory.stages[0].bytes[MemKind::activation]);
  EXPECT_LT(p2.memory.stages[0].bytes[MemKind::activation], 1.2 * p1.memory.stages[0].bytes[MemKind::activation]);
}

// The all-to-all: 2 (dispatch, combine) x 2 (forward, backward) x top_k x C x 2 bytes x (EP - 1) / EP per token and
// layer. At TP 8 an EP group of 2 spans 16 GPUs, two nodes of 8: the inter-node link; at TP 1 inside a node.
TEST(PlanExpertParallel, AllToAllBytesAndLinkFollowWhereTheGroupLies) {
  const Hardware h100 = builtin_hardware("h100-80gb");
  const Prediction p2 = predict(mixtral_ep(2), h100), p4 = predict(mixtral_ep(4), h100);
  EXPECT_EQ(p2.time.all_to_all_bytes_per_token, 2 * 2 * 2 * 4096 * 2 * 0.5);
  EXPECT_EQ(p4.time.all_to_all_bytes_per_token, 2 * 2 * 2 * 4096 * 2 * 0.75);
  EXPECT_GT(p2.time.ep_comm, 0);
  // Within a node the same bytes cost far less. TP 1 PP 4 DP 32: an EP 2 group is 2 neighbouring GPUs; TP 8 PP 4
  // DP 4: 8 GPUs apart, in two nodes. The microbatch's rows are the same at both (each TP rank routes all N
  // tokens), the microbatches per rank 8 times as many at DP 4.
  const Config base = mixtral_8x7b();
  Layout l = layout_of(base);
  l.expert = 2;
  const Prediction across = predict(apply_layout(base, l), h100);
  l.tensor = 1, l.data = 32, l.sequence_parallel = false;
  const Prediction intra = predict(apply_layout(base, l), h100);
  ASSERT_EQ(intra.config.training.num_microbatches * 8, across.config.training.num_microbatches);
  EXPECT_GT(across.time.ep_comm / 8, 3 * intra.time.ep_comm);
}

// Parallel folding: Mixtral 8x7B at TP 8 PP 4 DP 4 with whole experts (ETP 1) over EP 8 drawn from each node's
// tensor ranks holds the same bytes of experts as TP 8 without EP (one whole expert instead of 8 eighths), their
// state sharded over TP x DP / EP = 4 ranks as the dense ones are; each rank sends an eighth of its TP group's
// choices, inside the node.
TEST(PlanExpertParallel, ParallelFoldingHoldsWholeExpertsAndSendsAShareInsideTheNode) {
  const Hardware h100 = builtin_hardware("h100-80gb");
  Config folded = mixtral_ep(8);
  folded.parallel.expert_tensor = 1;
  const Prediction f = predict(folded, h100), one = predict(mixtral_ep(1), h100);
  EXPECT_NE(f.config.parallel.expert_tensor, f.config.parallel.tensor);
  for (size_t s = 0; s < f.memory.stages.size(); ++s) {
    EXPECT_EQ(f.memory.stages[s].parameters, one.memory.stages[s].parameters);
    EXPECT_NEAR(f.memory.stages[s].bytes[MemKind::optimizer], one.memory.stages[s].bytes[MemKind::optimizer], 1e5);
  }
  EXPECT_EQ(f.time.all_to_all_bytes_per_token, 2 * 2 * 2 * 4096 * 2 * 0.875);
  EXPECT_GT(f.time.ep_comm, 0);
  // TP 8 with EP 2 from the data-parallel ranks spans two nodes and sends all its choices: far slower.
  EXPECT_GT(predict(mixtral_ep(2), h100).time.ep_comm, 4 * f.time.ep_comm);
  EXPECT_NE(describe(layout_of(f.config)).find(" EP 8 ETP 1"), std::string::npos) << describe(layout_of(f.config));
}

TEST(PlanExpertParallel, SearchTriesExpertParallelismFromTheDataAndFoldedTensorRanks) {
  const Config c = parse_config(
      "model: {arch: llama, num_layers: 4, hidden_size: 64, num_heads: 8, ffn_hidden_size: 176, seq_length: 64,\n"
      "        vocab_size: 257, moe: {num_experts: 4, top_k: 2, ffn_hidden_size: 64}}\n"
      "training: {micro_batch_size: 2, global_batch_size: 16, train_iters: 1, precision: bf16}\n"
      "optimizer: {lr: 1.0e-3}\ndata: {synthetic: true}\n",
      "tiny-moe", {}, 8);
  const std::vector<Prediction> ranked = search(c, 8, builtin_hardware("h100-80gb"));
  std::set<int64_t> eps;
  bool folded = false;
  for (const Prediction& r : ranked) {
    const int64_t etp = r.config.parallel.expert_tensor, tp = r.layout.tensor;
    EXPECT_EQ(tp % etp, 0) << describe(r.layout);
    // Without folding the EP ranks come from the data-parallel ones; with it, from the tensor x data ranks.
    EXPECT_EQ((etp == tp ? r.layout.data : tp * r.layout.data / etp) % r.layout.expert, 0) << describe(r.layout);
    EXPECT_EQ(4 % r.layout.expert, 0) << describe(r.layout);
    EXPECT_EQ(r.config.parallel.expert, r.layout.expert);
    eps.insert(r.layout.expert);
    if (etp < tp) {
      folded = true;
      EXPECT_NE(describe(r.layout).find(fmt::format(" ETP {}", etp)), std::string::npos) << describe(r.layout);
    }
  }
  EXPECT_EQ(eps, (std::set<int64_t>{1, 2, 4}));
  EXPECT_TRUE(folded);  // parallel folding is searched too
  // A dense model is never given expert parallelism.
  Config dense = c;
  dense.model.moe = {};
  for (const Prediction& r : search(dense, 8, builtin_hardware("h100-80gb"))) EXPECT_EQ(r.layout.expert, 1);
}

}  // namespace
}  // namespace mt::plan

namespace mt::plan {
namespace {

// A GPT-1.3B shape on TP 2 x PP 4, 64 microbatches a step.
const std::string kPipelinedGpt =
    "model: {num_layers: 24, hidden_size: 2048, num_heads: 16, ffn_hidden_size: 8192, seq_length: 2048,\n"
    "        vocab_size: 50257}\n"
    "parallel: {tensor: 2, pipeline: 4}\n"
    "training: {micro_batch_size: 1, global_batch_size: 64, train_iters: 1, precision: bf16}\n"
    "optimizer: {lr: 1.0e-4}\ndata: {synthetic: true}\n";

// The pipeline term comes from the schedule simulator: ZB-H1 predicts a smaller bubble than 1F1B (what its
// deferred weight gradients fill) and no other change to the step's work; 1F1B's stays (p - 1) stage-microbatches.
TEST(PlanPipeline, ZeroBubbleSchedulePredictsASmallerBubbleThan1F1B) {
  const std::string yaml = kPipelinedGpt;
  const Config one = parse_config(yaml, "gpt", {}, 8);
  const Config zb = parse_config(yaml, "gpt", {"parallel.pipeline_schedule=zb-h1"}, 8);
  const Hardware h100 = builtin_hardware("h100-80gb");
  const Prediction a = predict(one, h100), b = predict(zb, h100);
  EXPECT_GT(a.time.bubble, 0);
  EXPECT_LT(b.time.bubble, 0.75 * a.time.bubble);  // W is a third of the GEMMs, less than a third of the work
  EXPECT_GT(b.time.bubble, 0);
  EXPECT_DOUBLE_EQ(b.time.compute, a.time.compute);
  EXPECT_LT(b.time.total, a.time.total);
  // 1F1B: (p - 1) stage-microbatches of the 64 / (1 x 1) = 64 per step, with the rest of the step's pipeline work.
  const double per_mb = (a.time.compute + a.time.tp_comm + a.time.pp_comm) / 64;
  EXPECT_NEAR(a.time.bubble, 3 * per_mb, 1e-6 * a.time.bubble);
}

// ZB-V's V puts both ends of the model on the first stage: it holds the embedding and the head (the tied copy and
// the final norm), the last stage only layers, as 1F1B's middle stages, so the first stage's work is the slowest.
// The simulator prices its bubble (here above 1F1B's: the list is timed with layer_costs' GEMM-and-attention
// estimate, and runs with the planner's costs, whose B is heavier).
TEST(PlanPipeline, ZbVPutsBothEndsOfTheModelOnTheFirstStage) {
  const std::string yaml = kPipelinedGpt;
  const Config one = parse_config(yaml, "gpt", {}, 8);
  const Config v = parse_config(yaml, "gpt", {"parallel.pipeline_schedule=zb-v", "parallel.virtual_pipeline=2"}, 8);
  const Hardware h100 = builtin_hardware("h100-80gb");
  const Prediction a = predict(one, h100), b = predict(v, h100);
  ASSERT_EQ(a.memory.stages.size(), 3u);
  ASSERT_EQ(b.memory.stages.size(), 3u);
  const int64_t layers_only = a.memory.stages[1].parameters;  // a middle stage of 1F1B: 6 layers
  EXPECT_EQ(b.memory.stages.back().parameters, layers_only);
  EXPECT_EQ(b.memory.stages.front().parameters,
            a.memory.stages.front().parameters + a.memory.stages.back().parameters - layers_only);
  EXPECT_GT(b.time.bubble, 0);
  EXPECT_GT(b.time.compute, a.time.compute);  // the first stage computes both ends
}

// training.fp8: on Hopper the layers' linear GEMMs take half the time (the rest, attention and the LM head, stays);
// the amax and cast passes add elementwise time; an A100 (no fp8) and the CPU (emulation) gain nothing. Memory adds
// the fp8 state (the delayed recipe's histories) and the copies around a GEMM.
TEST(PlanFp8, HopperRunsTheLinearGemmsAtTwiceTheRateAndTheStateCostsMemory) {
  const std::string yaml =
      "model: {num_layers: 8, hidden_size: 2048, num_heads: 16, ffn_hidden_size: 8192, seq_length: 2048,\n"
      "        vocab_size: 50257}\n"
      "parallel: {tensor: 2}\n"
      "training: {micro_batch_size: 1, global_batch_size: 8, train_iters: 1, precision: bf16}\n"
      "optimizer: {lr: 1.0e-4}\ndata: {synthetic: true}\n";
  const Config bf16 = parse_config(yaml, "gpt", {}, 2);
  const Config fp8 = parse_config(yaml, "gpt", {"training.fp8.format=hybrid"}, 2);
  const Config delayed = parse_config(yaml, "gpt", {"training.fp8.format=hybrid", "training.fp8.recipe=delayed"}, 2);
  const Hardware h100 = builtin_hardware("h100-80gb");
  const Prediction a = predict(bf16, h100), b = predict(fp8, h100);
  // The LM head's GEMMs stay bf16 (about a fifth of the GEMM work here): between half and two thirds.
  EXPECT_LT(b.time.gemm, 0.65 * a.time.gemm);
  EXPECT_GT(b.time.gemm, 0.5 * a.time.gemm);
  EXPECT_GT(b.time.elementwise, a.time.elementwise);
  EXPECT_LT(b.time.total, a.time.total);
  EXPECT_DOUBLE_EQ(b.time.attention, a.time.attention);
  for (const char* other : {"a100-80gb", "cpu"}) {
    const Hardware hw = builtin_hardware(other);
    EXPECT_DOUBLE_EQ(predict(fp8, hw).time.gemm, predict(bf16, hw).time.gemm) << other;
  }
  // Memory: the current recipe's state and copies, the delayed one's 1024-entry histories on top
  // (3 operands x 4 linears x 8 layers x 1023 more floats).
  const double m_bf16 = a.memory.max_total(), m_fp8 = b.memory.max_total();
  const double m_delayed = predict(delayed, h100).memory.max_total();
  EXPECT_GT(m_fp8, m_bf16);
  EXPECT_DOUBLE_EQ(m_delayed - m_fp8, 3.0 * 4 * 8 * 1023 * 4);
}

}  // namespace
}  // namespace mt::plan
