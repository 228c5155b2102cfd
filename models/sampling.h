// sampling.h: choosing the next token from a model's logits: greedy (argmax), or a draw after temperature,
// top-k and top-p (nucleus) filtering, in the order of Hugging Face's generate (temperature, then top-k, then
// top-p). Draws come from the counter-based RNG (core/base/rng.h) keyed by (seed, step), so the same seed and
// prompt give the same text on every machine and device.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace mt {

struct SamplingOptions {
  bool greedy = false;      // argmax (the lowest id among equal maxima); the options below are then unused
  float temperature = 1.f;  // > 0: logits are divided by it
  int64_t top_k = 0;        // > 0: keep the k highest logits (and any equal to the k-th); 0: off
  float top_p = 1.f;        // (0, 1]: keep the fewest highest-probability ids whose mass reaches top_p; 1: off
  uint64_t seed = 0;
};

// Throws std::invalid_argument naming the option when a value is out of range.
void check_sampling_options(const SamplingOptions& opt);

// The argmax of logits (lowest id on ties).
int32_t argmax(std::span<const float> logits);

// The distribution a draw uses: softmax(logits / temperature) with ids outside top-k and top-p set to 0 and
// the rest renormalised to sum 1 (double).
std::vector<double> sampling_probabilities(std::span<const float> logits, const SamplingOptions& opt);

// The token for generation step `step` (0 for the first new token): the argmax when greedy, else a draw from
// sampling_probabilities with the uniform number `step` of the seed's "generate.sample" stream.
int32_t sample_token(std::span<const float> logits, const SamplingOptions& opt, uint64_t step);

}  // namespace mt
