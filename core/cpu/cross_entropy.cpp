// cross_entropy.cpp: softmax cross-entropy on the CPU, split into per-row pieces (max, partial sums,
// loss, backward) so a vocabulary-parallel caller only exchanges the f32 row statistics between shards.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/float_io.h"
#include "core/cpu/ops_cpu.h"

namespace mt::cpu {

namespace {

// Column of target id in a shard holding [vocab_start, vocab_start + V), or -1 when it lies outside.
int64_t target_column(int32_t target, int64_t vocab_start, int64_t V) {
  const int64_t c = static_cast<int64_t>(target) - vocab_start;
  return c >= 0 && c < V ? c : -1;
}

// Number of leading columns of a shard that are real tokens, not vocabulary padding.
int64_t real_columns(const CrossEntropyOptions& opt, int64_t V) {
  if (opt.vocab_size < 0) return V;
  return std::clamp<int64_t>(opt.vocab_size - opt.vocab_start, 0, V);
}

}  // namespace

void cross_entropy_rowmax(const Tensor& logits, Tensor& rowmax, const CrossEntropyOptions& opt) {
  const int64_t N = logits.dim(0), V = real_columns(opt, logits.dim(1)), stride = logits.dim(1);
  std::vector<float> row(V);         // (V)
  float* mx = rowmax.data<float>();  // (N)
  for (int64_t n = 0; n < N; ++n) {
    load_f32(logits, n * stride, V, row.data());
    float m = -INFINITY;
    for (int64_t v = 0; v < V; ++v) m = std::fmax(m, row[v]);
    mx[n] = m;
  }
}

void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& rowmax, Tensor& sumexp,
                            Tensor& target_logit, const CrossEntropyOptions& opt) {
  const int64_t N = logits.dim(0), V = real_columns(opt, logits.dim(1)), stride = logits.dim(1);
  std::vector<float> row(V);                     // (V)
  const int32_t* tgt = targets.data<int32_t>();  // (N)
  const float* mx = rowmax.data<float>();        // (N)
  float* se = sumexp.data<float>();              // (N)
  float* tl = target_logit.data<float>();        // (N)
  for (int64_t n = 0; n < N; ++n) {
    load_f32(logits, n * stride, V, row.data());
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx[n]);
    se[n] = static_cast<float>(sum);
    const int64_t c = target_column(tgt[n], opt.vocab_start, V);
    tl[n] = c >= 0 ? row[c] : 0.f;
  }
}

void cross_entropy_loss(const Tensor& rowmax, const Tensor& sumexp, const Tensor& target_logit, Tensor& losses) {
  const int64_t N = losses.numel();
  const float* mx = rowmax.data<float>();        // (N)
  const float* se = sumexp.data<float>();        // (N)
  const float* tl = target_logit.data<float>();  // (N)
  float* loss = losses.data<float>();            // (N)
  for (int64_t n = 0; n < N; ++n)
    loss[n] = static_cast<float>(std::log(static_cast<double>(se[n])) + static_cast<double>(mx[n]) - tl[n]);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& rowmax, const Tensor& sumexp,
                            const Tensor& dloss, Tensor& dlogits, const CrossEntropyOptions& opt) {
  const int64_t N = logits.dim(0), V = logits.dim(1), real = real_columns(opt, V);
  std::vector<float> row(V, 0.f);                // (V); padding columns stay 0
  const int32_t* tgt = targets.data<int32_t>();  // (N)
  const float* mx = rowmax.data<float>();        // (N)
  const float* se = sumexp.data<float>();        // (N)
  const float* dl = dloss.data<float>();         // (N)
  for (int64_t n = 0; n < N; ++n) {
    load_f32(logits, n * V, real, row.data());
    const float inv_sum = 1.f / se[n];
    for (int64_t v = 0; v < real; ++v) row[v] = std::exp(row[v] - mx[n]) * inv_sum * dl[n];
    const int64_t c = target_column(tgt[n], opt.vocab_start, real);
    if (c >= 0) row[c] -= dl[n];
    store_f32(row.data(), V, dlogits, n * V);
  }
}

}  // namespace mt::cpu
