// test_rope_scaling.cpp: the rotary frequencies of core/base/rope_scaling against transformers' (LlamaRotaryEmbedding's
// inv_freq and attention_scaling, tests/data/rope/frequencies.txt from tests/interop/make_rope_golden.py), for plain,
// linear, llama3 and yarn rotary embeddings; the errors a type's parameters get.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/base/rope_scaling.h"
#include "tests/unit/expect_contains.h"
#include "tests/unit/source_root.h"

namespace mt {
namespace {

struct Golden {
  std::string name;
  int64_t dim = 0;
  double theta = 0;
  RopeScaling scaling;
  float attention_factor = 0;
  std::vector<float> inv_freq;
};

float from_bits(const std::string& hex) {
  return std::bit_cast<float>(static_cast<uint32_t>(std::stoul(hex, nullptr, 16)));
}

RopeScaling parse_parameters(const std::string& text) {
  RopeScaling s;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "type") {
      s.type = *parse_choice<RopeScalingType>(value);
    } else if (key == "factor") {
      s.factor = std::stod(value);
    } else if (key == "low_freq_factor") {
      s.low_freq_factor = std::stod(value);
    } else if (key == "high_freq_factor") {
      s.high_freq_factor = std::stod(value);
    } else if (key == "original_max_position_embeddings") {
      s.original_max_position_embeddings = std::stoll(value);
    } else if (key == "attention_factor") {
      s.attention_factor = std::stod(value);
    } else if (key == "beta_fast") {
      s.beta_fast = std::stod(value);
    } else if (key == "beta_slow") {
      s.beta_slow = std::stod(value);
    } else if (key == "mscale") {
      s.mscale = std::stod(value);
    } else if (key == "mscale_all_dim") {
      s.mscale_all_dim = std::stod(value);
    } else if (key == "truncate") {
      s.truncate = value == "true";
    } else {
      ADD_FAILURE() << "unknown key " << key;
    }
  }
  return s;
}

std::vector<Golden> goldens() {
  std::ifstream f(testing_util::source_path("tests/data/rope/frequencies.txt"));
  std::vector<Golden> out;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::stringstream in(line);
    Golden g;
    std::string params, factor;
    in >> g.name >> g.dim >> g.theta >> params >> factor;
    g.scaling = parse_parameters(params);
    g.attention_factor = from_bits(factor);
    for (std::string hex; in >> hex;) g.inv_freq.push_back(from_bits(hex));
    out.push_back(std::move(g));
  }
  return out;
}

// Units in the last place between two positive floats.
int64_t ulps(float a, float b) {
  return std::abs(static_cast<int64_t>(std::bit_cast<int32_t>(a)) - static_cast<int64_t>(std::bit_cast<int32_t>(b)));
}

// Plain frequencies: torch rounds theta^(2i/dim) to fp32 before its fp32 reciprocal, megatrain's plain ones round
// 1 / theta^(2i/dim) once (as it always has), so some differ by an ulp. The scaled ones take torch's roundings, and
// every scaling step after them is the same fp32 operation on both sides.
TEST(RopeScaling, FrequenciesEqualTransformersWithinAnUlp) {
  const std::vector<Golden> cases = goldens();
  ASSERT_EQ(cases.size(), 9u);
  int64_t exact = 0, total = 0;
  for (const Golden& g : cases) {
    SCOPED_TRACE(g.name);
    const RopeFrequencies f = rope_frequencies(g.theta, g.dim, g.scaling);
    ASSERT_EQ(f.inv_freq.size(), g.inv_freq.size());
    EXPECT_FLOAT_EQ(f.attention_factor, g.attention_factor);
    for (size_t i = 0; i < g.inv_freq.size(); ++i) {
      EXPECT_LE(ulps(f.inv_freq[i], g.inv_freq[i]), 1)
          << "inv_freq[" << i << "] " << f.inv_freq[i] << " vs " << g.inv_freq[i];
      if (g.scaling.enabled()) {
        exact += f.inv_freq[i] == g.inv_freq[i];
        ++total;
      }
    }
  }
  // The scaled ones start from torch's two roundings, so they are bit for bit but where glibc's and torch's powf
  // round a tie apart (one frequency of the 232 here).
  EXPECT_GE(exact, total - 1) << exact << " of " << total << " bit for bit";
}

TEST(RopeScaling, Llama3LeavesShortWavelengthsAndDividesLongOnes) {
  const RopeScaling s{.type = RopeScalingType::llama3,
                      .factor = 8,
                      .low_freq_factor = 1,
                      .high_freq_factor = 4,
                      .original_max_position_embeddings = 8192};
  const RopeFrequencies plain = rope_frequencies(500000, 128);
  const RopeFrequencies scaled = rope_frequencies(500000, 128, s);
  EXPECT_EQ(scaled.inv_freq.front(), plain.inv_freq.front());      // wavelength 2 pi: below 8192 / 4
  EXPECT_EQ(scaled.inv_freq.back(), plain.inv_freq.back() / 8.f);  // wavelength far above 8192
  EXPECT_EQ(scaled.attention_factor, 1.f);
}

TEST(RopeScaling, BadParametersAreNamed) {
  auto error = [](const RopeScaling& s, int64_t dim = 8) -> std::string {
    try {
      rope_frequencies(10000, dim, s);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_CONTAINS(error({.type = RopeScalingType::linear, .factor = 0}),
                  "rope scaling linear: factor 0 must be positive");
  EXPECT_CONTAINS(error({.type = RopeScalingType::llama3,
                         .factor = 8,
                         .low_freq_factor = 4,
                         .high_freq_factor = 1,
                         .original_max_position_embeddings = 8192}),
                  "low_freq_factor 4 must be positive and below high_freq_factor 1");
  EXPECT_CONTAINS(error({.type = RopeScalingType::llama3, .factor = 8}),
                  "rope scaling llama3: original_max_position_embeddings must be positive");
  EXPECT_CONTAINS(error({.type = RopeScalingType::yarn, .factor = 4}),
                  "rope scaling yarn: original_max_position_embeddings must be positive");
  EXPECT_CONTAINS(error({}, 7), "head dimension 7 must be even");
}

}  // namespace
}  // namespace mt
