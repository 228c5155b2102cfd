// blend.h: Megatron's weighted dataset blends: which dataset (and which of its samples) global sample g reads.
//
// The rule is megatron-core's (0.16.1): megatron/core/datasets/utils.py normalize, blended_megatron_dataset_builder.py
// _get_size_per_split_per_dataset and helpers.cpp build_blending_indices. The choice for sample g depends only
// on the weights and g, never on the parallel layout, so every rank computes the same order.
#pragma once
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace mt {

// numpy's w / numpy.sum(w) in float64 (numpy's pairwise summation, so the last bit matches megatron-core's).
// Throws std::invalid_argument for an empty list, a weight that is not finite and > 0.
std::vector<double> normalize_blend_weights(const std::vector<double>& weights);

// Samples megatron-core asks of each dataset for a blend of `target` samples: ceil(ceil(target * w_i) * (1 +
// surplus)), w normalized. surplus 0 gives the samples it plans to use (their sum is the blend's size);
// megatron-core builds each dataset with its mid_level_dataset_surplus 0.005 on top.
std::vector<int64_t> blend_sizes(const std::vector<double>& normalized_weights, int64_t target, double surplus = 0.0);

// build_blending_indices, evaluated lazily: sample g comes from the dataset d with the largest error
// w_d * max(g, 1) - taken_d (taken_d: samples of d before g), ties to the lowest d, and is sample taken_d of it.
// Counts are checkpointed every kBlock samples and one block is decoded at a time, so memory stays small for
// any number of samples. at() locks, so one index may be shared by several threads.
class BlendIndex {
 public:
  // `weights` are used as given (normalize them first, twice as megatron-core does: see blended_dataset.py).
  explicit BlendIndex(std::vector<double> weights);
  int num_datasets() const { return static_cast<int>(weights_.size()); }
  // (dataset, sample of that dataset) that global sample g reads.
  std::pair<int, int64_t> at(int64_t g) const;
  // Samples each dataset gives among global samples [0, n).
  std::vector<int64_t> counts(int64_t n) const;

  static constexpr int64_t kBlock = 4096;

 private:
  void extend_checkpoints(int64_t block) const;  // needs mutex_
  void decode_block(int64_t block) const;        // needs mutex_

  std::vector<double> weights_;
  mutable std::mutex mutex_;
  mutable std::vector<std::vector<int64_t>> checkpoints_;  // [b][d]: samples of d taken before sample b*kBlock
  mutable int64_t cached_block_ = -1;
  mutable std::vector<std::pair<int, int64_t>> cache_;  // (kBlock) the decoded block
};

}  // namespace mt
