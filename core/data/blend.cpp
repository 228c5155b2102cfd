// blend.cpp: weight normalization, per-dataset sample requests and the lazily decoded blending index.
#include "core/data/blend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace mt {

namespace {

// numpy's pairwise summation of float64 (numpy/_core/src/umath/loops_utils.h.src, pairwise_sum): plain
// left-to-right below 8 elements, 8 running sums up to 128, halves (cut at a multiple of 8) above.
double numpy_pairwise_sum(const double* a, int64_t n) {
  if (n < 8) {
    double res = -0.0;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return numpy_pairwise_sum(a, n2) + numpy_pairwise_sum(a + n2, n - n2);
}

}  // namespace

std::vector<double> normalize_blend_weights(const std::vector<double>& weights) {
  if (weights.empty()) throw std::invalid_argument("blend: no weights");
  for (double w : weights)
    if (!std::isfinite(w) || !(w > 0))
      throw std::invalid_argument(fmt::format("blend: weight {} is not a finite number > 0", w));
  // numpy.add.reduce starts from its identity 0 and adds the pairwise sum of all elements.
  const double sum = 0.0 + numpy_pairwise_sum(weights.data(), static_cast<int64_t>(weights.size()));
  if (!std::isfinite(sum))
    throw std::invalid_argument(
        fmt::format("blend: the weights sum to {}, beyond the largest double; scale them down", sum));
  std::vector<double> out;
  out.reserve(weights.size());
  for (double w : weights) out.push_back(w / sum);
  return out;
}

std::vector<int64_t> blend_sizes(const std::vector<double>& normalized_weights, int64_t target, double surplus) {
  std::vector<int64_t> out;
  out.reserve(normalized_weights.size());
  for (double w : normalized_weights)
    out.push_back(static_cast<int64_t>(std::ceil(std::ceil(static_cast<double>(target) * w) * (1.0 + surplus))));
  return out;
}

BlendIndex::BlendIndex(std::vector<double> weights) : weights_(std::move(weights)) {
  if (weights_.empty()) throw std::invalid_argument("BlendIndex: no datasets");
  if (weights_.size() >= 32767)
    throw std::invalid_argument("BlendIndex: megatron-core blends fewer than 32767 datasets");
  checkpoints_.push_back(std::vector<int64_t>(weights_.size(), 0));
}

// Runs the greedy rule from sample `from` with `taken` counts for `count` samples; `visit(g, d, k)` sees each.
template <typename Visit>
static void run_blend(const std::vector<double>& w, int64_t from, int64_t count, std::vector<int64_t>& taken,
                      Visit&& visit) {
  const size_t n = w.size();
  for (int64_t g = from; g < from + count; ++g) {
    // As helpers.cpp: the error is w * max(g, 1) - taken; a strict > keeps ties on the lowest index.
    const double x = std::max(static_cast<double>(g), 1.0);
    size_t best = 0;
    double best_error = w[0] * x - static_cast<double>(taken[0]);
    for (size_t d = 1; d < n; ++d) {
      const double error = w[d] * x - static_cast<double>(taken[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    visit(g, static_cast<int>(best), taken[best]);
    ++taken[best];
  }
}

void BlendIndex::extend_checkpoints(int64_t block) const {
  while (static_cast<int64_t>(checkpoints_.size()) <= block) {
    const int64_t b = static_cast<int64_t>(checkpoints_.size()) - 1;
    std::vector<int64_t> taken = checkpoints_.back();
    run_blend(weights_, b * kBlock, kBlock, taken, [](int64_t, int, int64_t) {});
    checkpoints_.push_back(std::move(taken));
  }
}

void BlendIndex::decode_block(int64_t block) const {
  extend_checkpoints(block);
  std::vector<int64_t> taken = checkpoints_[static_cast<size_t>(block)];
  cache_.resize(static_cast<size_t>(kBlock));
  const int64_t first = block * kBlock;
  run_blend(weights_, first, kBlock, taken, [&](int64_t g, int d, int64_t k) {
    cache_[static_cast<size_t>(g - first)] = {d, k};
  });
  cached_block_ = block;
}

std::pair<int, int64_t> BlendIndex::at(int64_t g) const {
  if (g < 0) throw std::out_of_range(fmt::format("BlendIndex: sample {} < 0", g));
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t block = g / kBlock;
  if (block != cached_block_) decode_block(block);
  return cache_[static_cast<size_t>(g % kBlock)];
}

std::vector<int64_t> BlendIndex::counts(int64_t n) const {
  if (n < 0) throw std::out_of_range(fmt::format("BlendIndex: {} samples < 0", n));
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t block = n / kBlock;
  extend_checkpoints(block);
  std::vector<int64_t> taken = checkpoints_[static_cast<size_t>(block)];
  run_blend(weights_, block * kBlock, n - block * kBlock, taken, [](int64_t, int, int64_t) {});
  return taken;
}

}  // namespace mt
