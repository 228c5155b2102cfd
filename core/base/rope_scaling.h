// rope_scaling.h: the rotary embeddings' frequencies, plain or scaled for a longer context (Hugging Face's rope_type
// linear, llama3 and yarn, as transformers' rope_init_fn computes them): the one computation the attention part and
// every backend's rope_ share, so a scaled model rotates alike on the CPU, the GPU and in generation.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "core/base/enum_names.h"

namespace mt {

enum class RopeScalingType { none, linear, llama3, yarn };
template <>
struct EnumNames<RopeScalingType> {
  static constexpr std::array names{"none", "linear", "llama3", "yarn"};
  static constexpr std::array planned{"dynamic", "longrope"};  // transformers' others, not modelled yet
};

// model.rope_scaling. Which keys a type reads: linear: factor; llama3: factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings; yarn: factor, original_max_position_embeddings, attention_factor (or mscale and
// mscale_all_dim), beta_fast, beta_slow, truncate.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  double factor = 1;  // the context's stretch: positions are interpolated by this much
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_position_embeddings = 0;  // the pre-training context (required by llama3 and yarn)
  double attention_factor = 0;                   // yarn: cos and sin scaled by it; 0: from factor (and mscale)
  double beta_fast = 32;
  double beta_slow = 1;
  double mscale = 0;          // yarn (DeepSeek): attention_factor = mscale(factor, mscale) / mscale(factor, all_dim)
  double mscale_all_dim = 0;  // when both are non-zero
  bool truncate = true;       // yarn: the correction range rounded outwards to whole dimensions

  bool enabled() const { return type != RopeScalingType::none; }
  bool operator==(const RopeScaling&) const = default;
};

// What rope_ rotates by: inv_freq (D/2) and the factor its cos and sin are multiplied by.
struct RopeFrequencies {
  std::vector<float> inv_freq;
  float attention_factor = 1.f;
};

// The frequencies of head dimension `dim` (even) for rope_theta `theta`. Unscaled: inv_freq_i = float(1 /
// theta^(2i/dim)) taken in double. Scaled: from 1 / float(theta^(2i/dim)) as torch rounds it, in fp32 arithmetic in
// the order transformers writes it, its double constants rounded to fp32 where torch rounds them. Throws
// std::invalid_argument naming a parameter the type needs that is out of range.
RopeFrequencies rope_frequencies(double theta, int64_t dim, const RopeScaling& scaling = {});

}  // namespace mt
