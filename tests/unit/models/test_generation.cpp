// Tests of inference, for GPT and Llama (grouped-query and multi-query attention): the KV-cached decoder
// against the training forward (the same model, the same logits at every position), token-by-token decoding
// against one prefill, and sampling (greedy, top-k / top-p masks, seeded reproducibility, option checks).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "models/generate.h"
#include "models/gpt.h"
#include "models/kv_cache_decoder.h"
#include "models/sampling.h"
#include "tests/unit/tiny_models.h"

namespace mt {
namespace {

// The tiny models with a 12-token context and a larger init (0.2, not GPT's 0.02) so the logits differ visibly
// between tokens.
ModelConfig generation_context(ModelConfig m) {
  m.seq_length = 12;
  m.max_position_embeddings = 12;
  m.init_std = 0.2f;
  return m;
}
ModelConfig tiny_model(bool tie) { return generation_context(testing_util::tiny_gpt(tie)); }
// A Llama with `groups` key/value heads for 4 query heads (2: grouped-query, 1: multi-query).
ModelConfig tiny_llama(int64_t groups, bool tie) {
  return generation_context(testing_util::tiny_llama(groups, tie, 500));
}

struct ModelCase {
  const char* name;
  ModelConfig cfg;
};
void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name; }
std::string case_name(const ::testing::TestParamInfo<ModelCase>& info) { return info.param.name; }
// Mixture-of-experts variants: a Mixtral-like Llama (every layer 4 experts, top-2) and a GPT whose every other
// layer is MoE with a shared expert and a sigmoid router.
ModelConfig with_moe(ModelConfig m, int64_t layer_freq, int64_t shared, MoeScore score) {
  m.moe.num_experts = 4;
  m.moe.top_k = 2;
  m.moe.ffn_hidden_size = 8;
  m.moe.layer_freq = layer_freq;
  m.moe.shared_expert_ffn_hidden_size = shared;
  m.moe.score_function = score;
  return m;
}
// A Mistral-like Llama: a sliding window of `window` tokens past the first `full` layers (Qwen2's max_window_layers).
ModelConfig with_window(ModelConfig m, int64_t window, int64_t full) {
  m.sliding_window = window;
  m.full_attention_layers = full;
  return m;
}
const ModelCase kModels[] = {{"GptTied", tiny_model(true)},
                             {"GptUntied", tiny_model(false)},
                             {"LlamaGqaUntied", tiny_llama(2, false)},
                             {"LlamaMqaTied", tiny_llama(1, true)},
                             {"MixtralLike", with_moe(tiny_llama(2, false), 1, 0, MoeScore::softmax)},
                             {"GptMoeSharedSigmoid", with_moe(tiny_model(true), 2, 8, MoeScore::sigmoid)},
                             {"LlamaSlidingWindow", with_window(tiny_llama(2, false), 3, 0)},
                             {"LlamaWindowPastTheFirstLayer", with_window(tiny_llama(2, false), 4, 1)}};

std::vector<int32_t> some_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7 + 3) % vocab);
  return t;
}

// The mean cross-entropy of (T, V) logits against targets, in double.
double mean_cross_entropy(const std::vector<float>& logits, const std::vector<int32_t>& targets, int64_t V) {
  double sum = 0;
  for (size_t t = 0; t < targets.size(); ++t) {
    const float* row = logits.data() + t * V;
    const double m = *std::max_element(row, row + V);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - m);
    sum += std::log(z) + m - row[targets[t]];
  }
  return sum / static_cast<double>(targets.size());
}

class DecoderVsForward : public ::testing::TestWithParam<ModelCase> {};

// A prefill from position 0 runs the training forward's ops: its logits give the forward's loss.
TEST_P(DecoderVsForward, PrefillLogitsGiveTheTrainingForwardLoss) {
  const ModelConfig& cfg = GetParam().cfg;
  GptModel model(cfg, GptOptions{.seed = 7});
  const int64_t T = cfg.seq_length, V = cfg.vocab_size;
  const std::vector<int32_t> tokens = some_tokens(T, V);
  std::vector<int32_t> targets(T);
  for (int64_t i = 0; i < T; ++i) targets[i] = static_cast<int32_t>((i * 11 + 5) % V);
  const float loss = model.forward(Tensor::from_ints(tokens, {1, T}), Tensor::from_ints(targets, {1, T}), 0,
                                   StepContext{.training = false});

  KvCacheDecoder decoder(model, {.all_positions = true});
  const std::vector<float> logits = decoder.feed(tokens);  // (T, V)
  ASSERT_EQ(static_cast<int64_t>(logits.size()), T * V);
  EXPECT_NEAR(mean_cross_entropy(logits, targets, V), loss, 1e-5 * std::abs(loss));
}

// Decoding one token at a time over the cache gives the logits of one forward over the whole sequence.
TEST_P(DecoderVsForward, TokenByTokenDecodingEqualsOnePrefill) {
  const ModelConfig& cfg = GetParam().cfg;
  GptModel model(cfg, GptOptions{.seed = 11});
  const int64_t T = cfg.max_position_embeddings, V = cfg.vocab_size, prompt = 3;
  const std::vector<int32_t> tokens = some_tokens(T, V);
  KvCacheDecoder whole(model, {.all_positions = true});
  const std::vector<float> expected = whole.feed(tokens);  // (T, V)

  KvCacheDecoder step(model);
  std::vector<float> got = step.feed(std::span(tokens).first(prompt));  // the prompt's last position
  for (int64_t t = prompt - 1; t < T; ++t) {
    for (int64_t v = 0; v < V; ++v)
      ASSERT_NEAR(got[v], expected[t * V + v], 1e-5f * (1.f + std::abs(expected[t * V + v])))
          << "position " << t << " id " << v;
    if (t + 1 < T) got = step.feed(std::span(tokens).subspan(t + 1, 1));
  }
  EXPECT_EQ(step.length(), T);
  const int32_t more[1] = {1};
  EXPECT_THROW(step.feed(more), std::invalid_argument);  // the cache is full
  step.reset();
  KvCacheDecoder again(model);
  EXPECT_EQ(step.feed(std::span(tokens).first(prompt)), again.feed(std::span(tokens).first(prompt)))
      << "a reset cache starts over";
}

// A chunk of several tokens after cached ones (each attending to the cache and to the chunk causally).
TEST_P(DecoderVsForward, ChunkAfterCachedTokensEqualsOnePrefill) {
  const ModelConfig& cfg = GetParam().cfg;
  GptModel model(cfg, GptOptions{.seed = 13});
  const int64_t T = 9, V = cfg.vocab_size;
  const std::vector<int32_t> tokens = some_tokens(T, V);
  KvCacheDecoder whole(model, {.all_positions = true});
  const std::vector<float> expected = whole.feed(tokens);  // (T, V)
  KvCacheDecoder chunks(model, {.all_positions = true});
  chunks.feed(std::span(tokens).first(4));
  const std::vector<float> got = chunks.feed(std::span(tokens).subspan(4));  // (T - 4, V)
  ASSERT_EQ(static_cast<int64_t>(got.size()), (T - 4) * V);
  for (int64_t i = 0; i < (T - 4) * V; ++i)
    ASSERT_NEAR(got[i], expected[4 * V + i], 1e-5f * (1.f + std::abs(expected[4 * V + i]))) << "element " << i;
}

// The training forward's log-softmax (T, V) of every position of `seq`, read from its mean losses alone: with
// every target v, the forward over the prefix [0, t] has mean loss L_t(v), and position t's cross-entropy
// -log softmax_t(v) is (t + 1) L_t(v) - t L_{t-1}(v) (causal: later tokens do not change earlier positions).
std::vector<double> forward_log_softmax(GptModel& model, const std::vector<int32_t>& seq, int64_t V) {
  const int64_t T = static_cast<int64_t>(seq.size());
  std::vector<double> out(static_cast<size_t>(T * V));
  for (int64_t v = 0; v < V; ++v) {
    double prev = 0;  // t * L_{t-1}(v)
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<int32_t> targets(static_cast<size_t>(t + 1), static_cast<int32_t>(v));
      const double sum = static_cast<double>(t + 1) *
                         model.forward(Tensor::from_ints(std::span(seq).first(t + 1), {1, t + 1}),
                                       Tensor::from_ints(targets, {1, t + 1}), 0, StepContext{.training = false});
      out[t * V + v] = -(sum - prev);
      prev = sum;
    }
  }
  return out;
}

// The decoder's logits at every position of a prompt and its greedy continuation (prefill, then one token at
// a time over the cache) are the training forward's over the whole sequence (as log-softmax: the loss fixes
// the logits up to each row's shift), and each greedy token is the argmax of the forward's logits.
TEST_P(DecoderVsForward, GreedyDecodingMatchesFullForwardsAtEveryPosition) {
  const ModelConfig& cfg = GetParam().cfg;
  GptModel model(cfg, GptOptions{.seed = 17});
  const int64_t T = cfg.max_position_embeddings, V = cfg.vocab_size, prompt = 4;
  std::vector<int32_t> seq = some_tokens(prompt, V);
  KvCacheDecoder decoder(model, {.all_positions = true});
  std::vector<float> logits = decoder.feed(seq);  // (prompt, V), then (1, V) per new token
  while (static_cast<int64_t>(seq.size()) < T) {
    const int32_t one[1] = {argmax(std::span<const float>(logits).last(V))};
    const std::vector<float> more = decoder.feed(one);
    logits.insert(logits.end(), more.begin(), more.end());
    seq.push_back(one[0]);
  }
  ASSERT_EQ(static_cast<int64_t>(logits.size()), T * V);

  const std::vector<double> expected = forward_log_softmax(model, seq, V);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits.data() + t * V;
    const double m = *std::max_element(row, row + V);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - m);
    const double lse = std::log(z) + m;
    for (int64_t v = 0; v < V; ++v)
      ASSERT_NEAR(row[v] - lse, expected[t * V + v], 1e-4) << "position " << t << " id " << v;
    if (t + 1 >= prompt && t + 1 < T) {  // the token generated after position t
      const auto best = std::max_element(expected.begin() + t * V, expected.begin() + (t + 1) * V);
      EXPECT_EQ(seq[t + 1], best - (expected.begin() + t * V)) << "greedy token after position " << t;
    }
  }
}

TEST_P(DecoderVsForward, Bf16DecodingStaysCloseToThePrefill) {
  const ModelConfig& cfg = GetParam().cfg;
  GptModel model(cfg, GptOptions{.dtype = DType::bf16, .seed = 3});
  const int64_t T = 8, V = cfg.vocab_size;
  const std::vector<int32_t> tokens = some_tokens(T, V);
  KvCacheDecoder whole(model, {.all_positions = true});
  const std::vector<float> expected = whole.feed(tokens);
  KvCacheDecoder step(model);
  std::vector<float> got = step.feed(std::span(tokens).first(T - 1));
  got = step.feed(std::span(tokens).subspan(T - 1, 1));
  for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(got[v], expected[(T - 1) * V + v], 0.05f) << "id " << v;
}

INSTANTIATE_TEST_SUITE_P(GptAndLlama, DecoderVsForward, ::testing::ValuesIn(kModels), case_name);

TEST(KvCacheDecoder, RejectsOutOfRangeIdsAndSlicedModels) {
  for (const ModelConfig& cfg : {tiny_model(true), tiny_llama(2, false)}) {
    GptModel model(cfg, GptOptions{});
    KvCacheDecoder decoder(model);
    const int32_t bad[1] = {static_cast<int32_t>(cfg.vocab_size)};
    EXPECT_THROW(decoder.feed(bad), std::invalid_argument);
    EXPECT_THROW(KvCacheDecoder(model, {.capacity = cfg.max_position_embeddings + 1}), std::invalid_argument);
    GptModel stage(cfg, GptOptions{.stage = {.has_embedding = true, .has_head = false, .layer_end = 1}});
    EXPECT_THROW(KvCacheDecoder{stage}, std::invalid_argument);
  }
}

// ---- sampling ----

TEST(Sampling, GreedyTakesTheFirstMaximum) {
  const std::vector<float> logits{0.f, 3.f, -1.f, 3.f};
  EXPECT_EQ(sample_token(logits, {.greedy = true}, 0), 1);
}

TEST(Sampling, TopKKeepsTheKHighestAndTies) {
  const std::vector<float> logits{1.f, 4.f, 2.f, 3.f, 2.f};
  std::vector<double> p = sampling_probabilities(logits, {.top_k = 2});
  EXPECT_EQ(p[0], 0.0);
  EXPECT_EQ(p[2], 0.0);
  EXPECT_EQ(p[4], 0.0);
  EXPECT_NEAR(p[1], 1.0 / (1.0 + std::exp(-1.0)), 1e-12);
  EXPECT_NEAR(p[1] + p[3], 1.0, 1e-12);
  p = sampling_probabilities(logits, {.top_k = 3});  // the third-highest value, 2, is held by two ids
  EXPECT_GT(p[2], 0.0);
  EXPECT_GT(p[4], 0.0);
  EXPECT_EQ(p[0], 0.0);
}

TEST(Sampling, TopPKeepsTheSmallestSetReachingTheMass) {
  // Probabilities 0.5, 0.25, 0.125, 0.125 (logits are their logs).
  const std::vector<float> logits{std::log(0.125f), std::log(0.5f), std::log(0.25f), std::log(0.125f)};
  std::vector<double> p = sampling_probabilities(logits, {.top_p = 0.7f});  // 0.5 + 0.25 >= 0.7
  EXPECT_NEAR(p[1], 2.0 / 3.0, 1e-6);
  EXPECT_NEAR(p[2], 1.0 / 3.0, 1e-6);
  EXPECT_EQ(p[0], 0.0);
  EXPECT_EQ(p[3], 0.0);
  p = sampling_probabilities(logits, {.top_p = 0.1f});  // the most likely id alone
  EXPECT_EQ(p[1], 1.0);
  p = sampling_probabilities(logits, {.top_p = 1.f});
  EXPECT_NEAR(p[0], 0.125, 1e-6);
}

TEST(Sampling, TemperatureSharpensAndFlattens) {
  const std::vector<float> logits{0.f, 1.f};
  const double cold = sampling_probabilities(logits, {.temperature = 0.5f})[1];
  const double warm = sampling_probabilities(logits, {.temperature = 2.f})[1];
  EXPECT_NEAR(cold, 1.0 / (1.0 + std::exp(-2.0)), 1e-12);
  EXPECT_NEAR(warm, 1.0 / (1.0 + std::exp(-0.5)), 1e-12);
}

TEST(Sampling, SameSeedSameDrawsOtherSeedOtherDraws) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::sin(i * 1.7));
  auto draws = [&](uint64_t seed) {
    std::vector<int32_t> ids;
    for (uint64_t step = 0; step < 64; ++step) ids.push_back(sample_token(logits, {.seed = seed}, step));
    return ids;
  };
  EXPECT_EQ(draws(5), draws(5));
  EXPECT_NE(draws(5), draws(6));
  // The draws follow the distribution: over many steps every id with mass appears, none without.
  std::vector<int> seen(logits.size(), 0);
  for (uint64_t step = 0; step < 4000; ++step) ++seen[sample_token(logits, {.top_k = 5, .seed = 1}, step)];
  EXPECT_EQ(std::count_if(seen.begin(), seen.end(), [](int c) { return c > 0; }), 5);
}

TEST(Sampling, BadOptionsAreNamed) {
  const std::vector<float> logits{0.f, 1.f};
  EXPECT_THROW(sampling_probabilities(logits, {.temperature = 0.f}), std::invalid_argument);
  EXPECT_THROW(sampling_probabilities(logits, {.temperature = -1.f}), std::invalid_argument);
  EXPECT_THROW(sampling_probabilities(logits, {.top_k = -1}), std::invalid_argument);
  EXPECT_THROW(sampling_probabilities(logits, {.top_p = 0.f}), std::invalid_argument);
  EXPECT_THROW(sampling_probabilities(logits, {.top_p = 1.5f}), std::invalid_argument);
  try {
    check_sampling_options({.top_p = 2.f});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--top-p"), std::string::npos) << e.what();
  }
}

// ---- the generation loop ----

class Generate : public ::testing::TestWithParam<ModelCase> {};

TEST_P(Generate, GreedyIsTheArgmaxOfFreshPrefillsAndStopsAtTheBudgetOrStopId) {
  const ModelConfig& cfg = GetParam().cfg;
  GptModel model(cfg, GptOptions{.seed = 5});
  KvCacheDecoder decoder(model);
  const std::vector<int32_t> prompt = some_tokens(3, cfg.vocab_size);
  const GenerateResult r = generate(decoder, prompt, {.max_new_tokens = 5, .sampling = {.greedy = true}});
  ASSERT_EQ(r.tokens.size(), 5u);
  EXPECT_EQ(r.stop, StopReason::max_new_tokens);
  // Each token is the argmax of a fresh prefill over everything before it (no cache reuse).
  std::vector<int32_t> seq = prompt;
  KvCacheDecoder fresh(model);
  for (int32_t id : r.tokens) {
    fresh.reset();
    EXPECT_EQ(argmax(fresh.feed(seq)), id);
    seq.push_back(id);
  }
  // Stopping at the end-of-document id, which is kept as the last token.
  const GenerateResult s =
      generate(decoder, prompt, {.max_new_tokens = 5, .sampling = {.greedy = true}, .stop_id = r.tokens[1]});
  EXPECT_EQ(s.stop, StopReason::end_of_document);
  EXPECT_EQ(s.tokens.back(), r.tokens[1]);
  EXPECT_LE(s.tokens.size(), 2u);
  // The context fills up before the budget runs out.
  const GenerateResult f = generate(decoder, some_tokens(10, cfg.vocab_size), {.max_new_tokens = 100});
  EXPECT_EQ(f.stop, StopReason::context_full);
  EXPECT_EQ(f.tokens.size(), 3u);  // positions 10 and 11 are fed, the third token needs none
  EXPECT_THROW(generate(decoder, std::vector<int32_t>{}, {}), std::invalid_argument);
  EXPECT_THROW(generate(decoder, some_tokens(13, cfg.vocab_size), {}), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(GptAndLlama, Generate, ::testing::ValuesIn(kModels), case_name);

}  // namespace
}  // namespace mt
