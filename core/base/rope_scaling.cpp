// rope_scaling.cpp: inv_freq for rotary embeddings, plain, linear, llama3 and yarn. The scaled ones follow
// transformers' modeling_rope_utils (_compute_linear_scaling_rope_parameters, _compute_llama3_parameters,
// _compute_yarn_parameters) operation by operation: torch computes them on fp32 tensors, where a Python float meets a
// tensor as an fp32 scalar, so each step here is an fp32 operation on fp32-rounded constants.
#include "core/base/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace mt {
namespace {

std::string number(double x) {
  std::string s = std::to_string(x);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

void require(bool ok, const std::string& type, const std::string& what) {
  if (!ok) throw std::invalid_argument("rope scaling " + type + ": " + what);
}

// theta^(2i/dim) in double: the plain frequencies' powers.
double power(double theta, int64_t i, int64_t dim) {
  return std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(dim));
}

// torch's: theta ** (float(2i) / dim) on fp32 tensors, the power rounded to fp32 (torch's powf is correctly rounded
// but for rare ties), which the scaled types divide again in fp32.
float torch_power(double theta, int64_t i, int64_t dim) {
  const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
  return static_cast<float>(std::pow(static_cast<double>(static_cast<float>(theta)), static_cast<double>(e)));
}

// YaRN's attention scale for a stretch `scale`: 0.1 m ln(scale) + 1 above 1.
double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

// The dimension whose wavelength turns `rotations` times over the original context.
double correction_dim(double rotations, int64_t dim, double theta, double context) {
  return static_cast<double>(dim) * std::log(context / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
}

void llama3(std::vector<float>& inv_freq, const RopeScaling& s) {
  const std::string t = "llama3";
  require(s.factor > 0, t, "factor " + number(s.factor) + " must be positive");
  require(s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor, t,
          "low_freq_factor " + number(s.low_freq_factor) + " must be positive and below high_freq_factor " +
              number(s.high_freq_factor));
  require(s.original_max_position_embeddings > 0, t, "original_max_position_embeddings must be positive");
  const auto context = static_cast<double>(s.original_max_position_embeddings);
  const auto factor = static_cast<float>(s.factor), low = static_cast<float>(s.low_freq_factor);
  const auto low_freq_wavelen = static_cast<float>(context / s.low_freq_factor);
  const auto high_freq_wavelen = static_cast<float>(context / s.high_freq_factor);
  const auto two_pi = static_cast<float>(2 * std::numbers::pi);
  const auto span = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
  for (float& f : inv_freq) {
    const float wavelen = two_pi / f;
    const float scaled = wavelen > low_freq_wavelen ? f / factor : f;  // long wavelengths: interpolated
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (medium) {
      const float smooth = (static_cast<float>(context) / wavelen - low) / span;
      f = (1.f - smooth) * scaled / factor + smooth * scaled;
    } else {
      f = scaled;
    }
  }
}

float yarn(std::vector<float>& inv_freq, double theta, int64_t dim, const RopeScaling& s) {
  const std::string t = "yarn";
  require(s.factor > 0, t, "factor " + number(s.factor) + " must be positive");
  require(s.original_max_position_embeddings > 0, t, "original_max_position_embeddings must be positive");
  require(s.beta_fast > 0 && s.beta_slow > 0, t,
          "beta_fast " + number(s.beta_fast) + " and beta_slow " + number(s.beta_slow) + " must be positive");
  require(s.attention_factor >= 0, t, "attention_factor " + number(s.attention_factor) + " must not be negative");
  double attention = s.attention_factor;
  if (attention == 0)
    attention = s.mscale != 0 && s.mscale_all_dim != 0
                    ? yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim)
                    : yarn_mscale(s.factor, 1);
  const auto context = static_cast<double>(s.original_max_position_embeddings);
  double low = correction_dim(s.beta_fast, dim, theta, context);
  double high = correction_dim(s.beta_slow, dim, theta, context);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  const auto low_f = static_cast<float>(low), width = static_cast<float>(high - low);
  const auto factor = static_cast<float>(s.factor);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float pos_freq = torch_power(theta, static_cast<int64_t>(i), dim);
    const float extrapolation = 1.f / pos_freq;
    const float interpolation = 1.f / (factor * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / width, 0.f, 1.f);
    const float keep = 1.f - ramp;  // inv_freq_extrapolation_factor: high frequencies keep their own
    inv_freq[i] = interpolation * (1.f - keep) + extrapolation * keep;
  }
  return static_cast<float>(attention);
}

}  // namespace

RopeFrequencies rope_frequencies(double theta, int64_t dim, const RopeScaling& s) {
  if (dim <= 0 || dim % 2 != 0)
    throw std::invalid_argument("rotary embeddings: head dimension " + std::to_string(dim) + " must be even");
  if (!(theta > 0)) throw std::invalid_argument("rotary embeddings: theta " + number(theta) + " must be positive");
  RopeFrequencies out;
  out.inv_freq.resize(static_cast<size_t>(dim / 2));
  // Plain: 1 / theta^(2i/dim) rounded once (what megatrain has always rotated by: within an ulp of torch's). Scaled:
  // torch's two fp32 roundings, 1 / float(theta^(2i/dim)), which the scaling steps then work on.
  for (int64_t i = 0; i < dim / 2; ++i)
    out.inv_freq[static_cast<size_t>(i)] =
        s.enabled() ? 1.f / torch_power(theta, i, dim) : static_cast<float>(1.0 / power(theta, i, dim));
  switch (s.type) {
    case RopeScalingType::none:
      break;
    case RopeScalingType::linear:
      require(s.factor > 0, "linear", "factor " + number(s.factor) + " must be positive");
      for (float& f : out.inv_freq) f /= static_cast<float>(s.factor);
      break;
    case RopeScalingType::llama3:
      llama3(out.inv_freq, s);
      break;
    case RopeScalingType::yarn:
      out.attention_factor = yarn(out.inv_freq, theta, dim, s);
      break;
  }
  return out;
}

}  // namespace mt
