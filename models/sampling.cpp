#include "models/sampling.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#include "core/base/rng.h"

namespace mt {

void check_sampling_options(const SamplingOptions& opt) {
  if (opt.greedy) return;
  if (!(opt.temperature > 0.f) || !std::isfinite(opt.temperature))
    throw std::invalid_argument(
        fmt::format("--temperature {}: must be > 0 (use --greedy for argmax decoding)", opt.temperature));
  if (opt.top_k < 0) throw std::invalid_argument(fmt::format("--top-k {}: must be >= 0 (0: off)", opt.top_k));
  if (!(opt.top_p > 0.f && opt.top_p <= 1.f))
    throw std::invalid_argument(fmt::format("--top-p {}: must lie in (0, 1] (1: off)", opt.top_p));
}

int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) throw std::invalid_argument("argmax of no logits");
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::vector<double> sampling_probabilities(std::span<const float> logits, const SamplingOptions& opt) {
  check_sampling_options(opt);
  const size_t V = logits.size();
  if (V == 0) throw std::invalid_argument("sampling from no logits");
  std::vector<double> z(V);  // (V) logits / temperature
  for (size_t i = 0; i < V; ++i) z[i] = static_cast<double>(logits[i]) / opt.temperature;
  std::vector<bool> keep(V, true);

  // Top-k: everything below the k-th highest value goes (ties with it stay, as in Hugging Face's filter).
  if (opt.top_k > 0 && static_cast<size_t>(opt.top_k) < V) {
    std::vector<double> sorted(z);
    std::nth_element(sorted.begin(), sorted.begin() + (opt.top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[opt.top_k - 1];
    for (size_t i = 0; i < V; ++i) keep[i] = z[i] >= kth;
  }
  auto softmax = [&] {
    double m = -INFINITY;
    for (size_t i = 0; i < V; ++i)
      if (keep[i]) m = std::max(m, z[i]);
    std::vector<double> p(V, 0.0);
    double sum = 0;
    for (size_t i = 0; i < V; ++i)
      if (keep[i]) sum += p[i] = std::exp(z[i] - m);
    for (double& x : p) x /= sum;
    return p;
  };
  std::vector<double> p = softmax();

  // Top-p: the highest-probability ids in order until their mass reaches top_p (at least one id).
  if (opt.top_p < 1.f) {
    std::vector<size_t> order(V);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    std::vector<bool> nucleus(V, false);
    double mass = 0;
    for (size_t i : order) {
      if (!keep[i]) break;
      nucleus[i] = true;
      mass += p[i];
      if (mass >= opt.top_p) break;
    }
    keep = nucleus;
    p = softmax();
  }
  return p;
}

int32_t sample_token(std::span<const float> logits, const SamplingOptions& opt, uint64_t step) {
  if (opt.greedy) return argmax(logits);
  const std::vector<double> p = sampling_probabilities(logits, opt);
  // 53 random bits: a uniform in [0, 1), walked through the cumulative distribution in id order.
  const double u = static_cast<double>(random_u64_at(opt.seed, stream_id("generate.sample"), step) >> 11) *
                   (1.0 / 9007199254740992.0);
  double cum = 0;
  int32_t last = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    last = static_cast<int32_t>(i);
    cum += p[i];
    if (u < cum) return last;
  }
  return last;  // u beyond the rounded total: the last id with mass
}

}  // namespace mt
